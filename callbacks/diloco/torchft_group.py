"""One replica group of fault-tolerant DiLoCo, on torchft: quorum, averaging, recovery.

With ``technique.diloco.backend=torchft`` every DiLoCo replica group is a job of its own (one
process here), and torchft's lighthouse keeps the membership. At the start of each round
(and when the job starts) the group asks torchft's ``Manager`` for a quorum: the groups
present then form the gloo process group that the round's pseudo-gradients are averaged
over (``Manager.allreduce``, divided by the number of groups present).

- **A group that dies** (kill -9) mid-round makes the others' all-reduce fail; torchft's
  commit vote (``should_commit``) then discards that round everywhere (the weights go back to
  the anchor, no outer step), and the next quorum, formed without it, goes on.
- **A group that starts behind** (restarted, or late) is healed in the quorum it joins: a
  live peer sends its state over torchft's HTTP transport, and ``load_state_dict`` puts it
  in place (``DiLoCo._recover``): the anchors and outer optimizer, the peer's inner weights
  and optimizer state, and its clock, so the group reads on from the peers' data position.
- **Groups of other settings** are caught at the first quorum they share, before a step is
  taken: each averages a fingerprint of the settings that must agree (the resolved run config
  less its per-group keys, and the tokens' fingerprint: ``launch/shared_settings.py``); where
  it differs from the average, the groups exchange the settings themselves and every group
  stops with one line naming the first key that differs and both values.
"""

import hashlib
import json
import logging
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from callbacks.diloco.settings import DiLoCoSettings, TorchftSettings
from common.errors import ConfigError

log = logging.getLogger(__name__)
#: Fingerprint values per group: four 32-bit slices of a SHA-256 digest.
FINGERPRINT_SLOTS = 4
#: Group indices the settings exchange has room for (a length each, summed over the groups).
SETTINGS_SLOTS = 1024


def fingerprint(settings: dict[str, Any]) -> torch.Tensor:
    """Four float64 numbers that differ between any two different settings (by their repr)."""
    digest = hashlib.sha256(repr(sorted(settings.items())).encode()).digest()
    slices = [int.from_bytes(digest[4 * i : 4 * i + 4], "little") for i in range(FINGERPRINT_SLOTS)]
    return torch.tensor(slices, dtype=torch.float64)


class TorchftGroup:
    """This job's replica group in the torchft quorum (one process per group)."""

    def __init__(
        self,
        settings: TorchftSettings,
        state_dict: Callable[[], dict[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
        agreed: dict[str, Any],
    ) -> None:
        from torch.distributed import TCPStore
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        host = settings.host or socket.gethostname()
        timeout = timedelta(seconds=settings.timeout_s)
        self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False)  # this group's own store
        self._load_state_dict = load_state_dict
        self._quorum_timeout_s = settings.quorum_timeout_s
        self.healed_in: float | None = None  # seconds the last quorum took when it healed this group
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=self._recover,
            state_dict=state_dict,
            min_replica_size=1,
            use_async_quorum=False,  # heal before the round's first step, not during it
            timeout=timeout,
            quorum_timeout=timedelta(seconds=settings.quorum_timeout_s),
            connect_timeout=timeout,
            rank=0,
            world_size=1,
            store_addr=host,
            store_port=self._store.port,
            lighthouse_addr=settings.address(),
            replica_id=f"diloco_group{settings.group}",
            hostname=host,
            init_sync=False,  # every group starts from the same seeded weights
        )
        self._agreed, self._group = dict(agreed), settings.group
        self._fingerprint = fingerprint(agreed)
        self._key, self._lighthouse = DiLoCoSettings.key, settings.address()

    def _recover(self, state: dict[str, Any]) -> None:
        self._load_state_dict(state)
        self._recovered = True

    def begin_round(self, groups: int = 1) -> None:
        """Join the next quorum (healing from a live peer if behind), then check that every
        group present runs the same settings. ``groups``: ask again (within the quorum
        timeout) until at least that many are present; a run's very first round waits so for
        all of them, since a group still starting up would otherwise miss it."""
        self._recovered, started = False, time.perf_counter()
        self._start_quorum()
        while self.groups_present < groups and time.perf_counter() - started < self._quorum_timeout_s:
            self._start_quorum()
        self.healed_in = time.perf_counter() - started if self._recovered else None
        mine = self._fingerprint.clone()
        self.manager.allreduce(mine).wait()
        if not self.manager.errored() and not torch.equal(mine, self._fingerprint):
            raise ConfigError(self._difference())

    def _start_quorum(self) -> None:
        """Ask the lighthouse for a quorum; where none forms within the quorum timeout (fewer
        groups are running than the lighthouse's ``--min_replicas``), leave and stop in one line
        rather than train alone."""
        try:
            self.manager.start_quorum()
        except TimeoutError:
            self.shutdown()
            raise ConfigError(
                f"{self._key}.torchft: no quorum formed within quorum_timeout_s={self._quorum_timeout_s:g} s: the"
                f" lighthouse at {self._lighthouse} waits for more replica groups than are running (its --min_replicas)."
                f" Start the other groups ({self._key}.torchft.group=...), or raise {self._key}.torchft.quorum_timeout_s;"
                " a group started after the others finished the token budget has nothing left to train."
            ) from None

    def _difference(self) -> str:
        """Every group's settings gathered (each writes its own slot of a summed tensor, its
        settings as JSON bytes), and the first key in which another group differs from this one."""
        from torch.distributed import ReduceOp

        encoded = json.dumps(self._agreed, sort_keys=True).encode()
        lengths = torch.zeros(max(SETTINGS_SLOTS, self._group + 1), dtype=torch.float64)
        lengths[self._group] = len(encoded)
        self.manager.allreduce(lengths, reduce_op=ReduceOp.SUM).wait()
        slots, width = int(lengths.nonzero().max()) + 1, int(lengths.max())  # the same in every group
        data = torch.zeros(slots, width, dtype=torch.float64)
        data[self._group, : len(encoded)] = torch.tensor(list(encoded), dtype=torch.float64)
        self.manager.allreduce(data, reduce_op=ReduceOp.SUM).wait()
        for other, length in enumerate(lengths[:slots].tolist()):
            if other == self._group or not length:
                continue
            theirs = json.loads(bytes(int(round(b)) for b in data[other, : int(length)].tolist()).decode())
            for key in sorted(set(self._agreed) | set(theirs)):
                if self._agreed.get(key) != theirs.get(key):
                    return (f"the DiLoCo replica groups run with different settings: {key} is {self._agreed.get(key, 'unset')}"
                            f" in group {self._group} and {theirs.get(key, 'unset')} in group {other}; start every group with"
                            " the same overrides but technique.diloco.torchft.group.")  # fmt: skip
        return ("the DiLoCo replica groups run with different settings: start every group with the same overrides"
                " but technique.diloco.torchft.group.")

    def average(self, deltas: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The deltas averaged over the groups present, or None when the round is discarded
        (a group failed during it: torchft's commit vote said no)."""
        flat = torch.cat([delta.reshape(-1).float() for delta in deltas])
        self.manager.allreduce(flat).wait()
        if not self.manager.should_commit():
            return None
        return [part.view_as(delta) for part, delta in zip(flat.split([d.numel() for d in deltas]), deltas)]

    @property
    def groups_present(self) -> int:
        return self.manager.num_participants()

    def state_dict(self) -> dict[str, int]:
        return self.manager.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.manager.load_state_dict(state)

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
        log.info("left the torchft quorum")
