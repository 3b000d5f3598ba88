"""One replica group of fault-tolerant DiLoCo, on torchft: quorum, averaging, recovery.

With ``technique.diloco.backend=torchft`` every DiLoCo replica group is a job of its own (one
process here), and torchft's lighthouse keeps the membership. At every sync (and when the job
starts) the group asks torchft's ``Manager`` for a quorum: the groups present then form the
gloo process group that the round's pseudo-gradients are summed over, with a count of the
groups that contributed one; the average is the sum over that count.

- **Membership is decided at the sync.** The lighthouse forms a quorum when every live group
  has asked, or, past its ``--join_timeout_ms``, with those that have (at least its
  ``--min_replicas``). A group slower than that deadline is left out of the round: the
  others keep their round, and the slow group heals at a later quorum. A round commits only
  with ``min_groups`` groups present (default: a majority of M), so no two disjoint quorums
  ever both commit: groups cannot drift apart at the same step count.
- **A group that dies** (kill -9) stops heartbeating; the next quorums form without it. One
  that dies during a sync's all-reduce makes torchft's commit vote (``should_commit``)
  discard that round for the groups in it (weights back to the anchor, no outer step).
- **A group that is behind** (restarted, late, or left out of earlier rounds) is healed in
  the quorum it joins: a live peer sends its state as it stands at the sync, before the
  round's average, over torchft's HTTP transport, and ``load_state_dict`` puts it in place
  (``DiLoCo._recover``): the anchors and outer optimizer, the peer's inner weights and
  optimizer state, and its clock, so the group reads on from the peers' data position. It
  contributes nothing to that round (its own round was not trained on the peers' anchors)
  and takes the same outer step as the peers.
- **A group joining the run** (the job's start) takes part in the round the others are
  syncing without contributing; in a new run every group joins at once and nothing moves.
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
from torch.distributed import ReduceOp, TCPStore

from callbacks.diloco.exchange import Exchange
from callbacks.diloco.settings import DiLoCoSettings, TorchftSettings
from common.errors import ConfigError

log = logging.getLogger(__name__)
#: Fingerprint values per group: four 32-bit slices of a SHA-256 digest.
FINGERPRINT_SLOTS = 4
#: Group indices the settings exchange has room for (a length each, summed over the groups).
SETTINGS_SLOTS = 1024
#: Seconds between two quorum requests of a new run's first round, waiting for every group.
REASK_S = 0.5


def fingerprint(settings: dict[str, Any]) -> torch.Tensor:
    """Four float64 numbers that differ between any two different settings (by their repr)."""
    digest = hashlib.sha256(repr(sorted(settings.items())).encode()).digest()
    slices = [int.from_bytes(digest[4 * i : 4 * i + 4], "little") for i in range(FINGERPRINT_SLOTS)]
    return torch.tensor(slices, dtype=torch.float64)


def group_store(host: str) -> tuple[socket.socket, TCPStore]:
    """This group's own c10d store (torchft's manager rendezvous), listening only on the
    address the other groups reach it at: c10d binds every interface unless handed a socket
    already bound (the socket is returned to keep it open)."""
    listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    port = listener.getsockname()[1]
    store = TCPStore(host, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno(), use_libuv=True)
    return listener, store


class TorchftGroup:
    """This job's replica group in the torchft quorum (one process per group)."""

    def __init__(
        self,
        settings: TorchftSettings,
        min_groups: int,
        state_dict: Callable[[], dict[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
        agreed: dict[str, Any],
    ) -> None:
        from torchft.manager import Manager
        from torchft.process_group import ProcessGroupGloo

        host = settings.reachable_host()
        timeout = timedelta(seconds=settings.timeout_s)
        self._listener, self._store = group_store(host)
        self._load_state_dict = load_state_dict
        self._quorum_timeout_s = settings.quorum_timeout_s
        self.healed_in: float | None = None  # seconds the last quorum took when it healed this group
        self.contributors = 0  # groups whose round the last sync averaged
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=self._recover,
            state_dict=state_dict,
            min_replica_size=min_groups,
            use_async_quorum=False,  # heal inside the quorum, before the round's all-reduce
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

    def sync(self, deltas: list[torch.Tensor], final: bool, ends: bool) -> Exchange:
        """This group's round, averaged over the groups in the quorum that contributed one
        (not this group if it was just healed: its round was not trained on the peers'
        anchors). ``final``: the run's last, plain average; ``ends``: the run ends after it.
        Holds None where the round was discarded."""
        return self._round(deltas, contribute=True, final=final, ends=ends)

    def join(self, deltas: list[torch.Tensor], groups: int) -> Exchange:
        """Take part, without contributing, in the round the groups present are syncing
        (None where none contributed one). ``groups``: ask again, within the quorum
        timeout, until at least that many are present; a new run waits so for all of them,
        since a group still starting up would otherwise miss the first round."""
        return self._round(deltas, contribute=False, final=False, ends=False, groups=groups)

    def _round(self, deltas: list[torch.Tensor], contribute: bool, final: bool, ends: bool, groups: int = 1) -> Exchange:
        self._quorum(groups)
        contribute = contribute and self.healed_in is None
        flat = torch.cat([delta.reshape(-1).float() for delta in deltas])
        if not contribute:
            flat.zero_()
        tally = torch.tensor([float(contribute), float(contribute and final), float(contribute and ends)])
        summed = torch.cat([flat, tally])
        self.manager.allreduce(summed, reduce_op=ReduceOp.SUM).wait()
        contributors, finals, endings = summed[-3:].tolist()
        self.contributors = round(contributors)
        if not self.manager.should_commit() or not self.contributors:
            return Exchange.done(None)
        averaged = summed[:-3] / self.contributors
        parts = averaged.split([delta.numel() for delta in deltas])
        return Exchange.done([part.view_as(delta) for part, delta in zip(parts, deltas)], final=finals > 0, ends=endings > 0)

    def _quorum(self, groups: int) -> None:
        """Join the next quorum (healing from a live peer if behind), then check that every
        group present runs the same settings."""
        self._recovered, started = False, time.perf_counter()
        self._start_quorum()
        while self.groups_present < groups and time.perf_counter() - started < self._quorum_timeout_s:
            time.sleep(REASK_S)  # the others are still starting up
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

    def take_heal(self) -> float | None:
        """Seconds the last quorum took if it healed this group (once per heal), else None."""
        healed_in, self.healed_in = self.healed_in, None
        return healed_in

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
