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
  taken and before a heal's state is loaded: each shows the others a fingerprint of the
  settings that must agree (the resolved run config less its per-group keys, the `auto`
  settings as this group resolved them, and a digest of the tokens' content:
  ``launch/from_config.py``) and whether it has trained in the run already. A group
  whose fingerprint differs from those of the groups already training (a mistaken restart)
  takes part in the round without contributing, then stops alone with one line naming the
  first key that differs and both values; the others say once that it was refused and go
  on. Where no group has trained yet (a new run, or every group restarted), no group's
  settings can be preferred and every group stops so.
- **A discarded round** names its cause: a group failed during it, or fewer than
  ``min_groups`` groups joined it. A lighthouse whose ``--min_replicas`` is below
  ``min_groups`` lets a group left behind form quorums of its own, whose rounds never
  commit; the first such quorum is reported.
"""

import hashlib
import json
import logging
import re
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
from torch.distributed import ReduceOp, TCPStore

from callbacks.diloco.exchange import Exchange
from callbacks.diloco.settings import DiLoCoSettings, TorchftSettings, http_answer
from common.errors import ConfigError

log = logging.getLogger(__name__)
#: Fingerprint values per group: four 32-bit slices of a SHA-256 digest.
FINGERPRINT_SLOTS = 4
#: Seconds between two quorum requests of a new run's first round, waiting for every group.
REASK_S = 0.5
#: Seconds to wait for the lighthouse's status page.
STATUS_S = 3.0
#: Seconds a quorum request waits before it is sent again (within quorum_timeout_s): a lighthouse
#: restarted since the request was sent never answers it.
REQUEST_S = 10.0


def fingerprint(settings: dict[str, Any]) -> torch.Tensor:
    """Four float64 numbers that differ between any two different settings (by their repr)."""
    digest = hashlib.sha256(repr(sorted(settings.items())).encode()).digest()
    slices = [int.from_bytes(digest[4 * i : 4 * i + 4], "little") for i in range(FINGERPRINT_SLOTS)]
    return torch.tensor(slices, dtype=torch.float64)


def heartbeating(address: str) -> int | None:
    """How many replica groups heartbeat to the lighthouse (those alive), from its status page;
    -1 where the page does not say, None where nothing answers there."""
    parsed = urlparse(address)
    try:
        connection = socket.create_connection((parsed.hostname, parsed.port), timeout=STATUS_S)
        page = http_answer(connection, parsed.hostname, "/status")
    except OSError:
        return None
    found = re.search(r"\[(\d+) heartbeating\]", page)
    return int(found.group(1)) if found else -1


def group_store(host: str) -> tuple[socket.socket, TCPStore]:
    """This group's own c10d store (torchft's manager rendezvous), listening only on the
    address the other groups reach it at: c10d binds every interface unless handed a socket
    already bound (the socket is returned to keep it open)."""
    listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    port = listener.getsockname()[1]
    store = TCPStore(
        host, port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno(), use_libuv=True
    )
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
        self._min_groups = min_groups
        self._checked = 0  # quorums whose settings check this process passed (0: new to the run)
        self._pending: dict[str, Any] | None = None  # a heal's state, loaded once the settings agree
        self._refusal: str | None = None  # why this group may not join the run
        self._doubled: str | None = None  # refused as a second process of its group index
        self._small_quorum_reported = False
        #: Why the last round was discarded (None: it committed).
        self.discard_cause: str | None = None
        #: This group's seconds per global step, set before each sync; the peers' as of the
        #: last round they contributed to with this group (None until then).
        self.pace_s = 0.0
        self.peer_pace_s: float | None = None

    def _recover(self, state: dict[str, Any]) -> None:
        self._pending = state  # loaded in _quorum, once the settings are known to agree

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

    def _round(
        self, deltas: list[torch.Tensor], contribute: bool, final: bool, ends: bool, groups: int = 1
    ) -> Exchange:
        self._quorum(groups)
        contribute = contribute and self.healed_in is None and self._refusal is None
        flat = torch.cat([delta.reshape(-1).float() for delta in deltas])
        if not contribute:
            flat.zero_()
        tally = [float(contribute), float(contribute and final), float(contribute and ends), self.pace_s * contribute]
        summed = torch.cat([flat, torch.tensor(tally)])
        self.manager.allreduce(summed, reduce_op=ReduceOp.SUM).wait()
        committed = self.manager.should_commit()
        if self._refusal is not None:  # the round is the others' alone: leave it, then the run
            self.shutdown()
            raise ConfigError(self._refusal)
        contributors, finals, endings, paces = summed[-4:].tolist()
        self.contributors = round(contributors)
        if self.contributors > contribute:
            self.peer_pace_s = (paces - self.pace_s * contribute) / (self.contributors - contribute)
        self.discard_cause = self._discard_cause(committed)
        if self.discard_cause is not None:
            return Exchange.done(None)
        averaged = summed[:-4] / self.contributors
        parts = averaged.split([delta.numel() for delta in deltas])
        return Exchange.done(
            [part.view_as(delta) for part, delta in zip(parts, deltas)], final=finals > 0, ends=endings > 0
        )

    def _discard_cause(self, committed: bool) -> str | None:
        """Why the round just taken part in was discarded, or None where it committed."""
        if committed and self.contributors:
            return None
        if self.manager.errored() is not None:
            return "a replica group failed during it"
        if self.groups_present < self._min_groups:
            return f"{self.groups_present} group(s) joined it, fewer than min_groups={self._min_groups}"
        return "no group present had a round to contribute"

    def _quorum(self, groups: int) -> None:
        """Join the next quorum (receiving a live peer's state if behind), check that every
        group present runs the run's settings, then load that state."""
        self._pending, started = None, time.perf_counter()
        self._start_quorum()
        while self._waits_for_more(groups) and time.perf_counter() - started < self._quorum_timeout_s:
            time.sleep(REASK_S)  # the others are still starting up
            self._start_quorum()
        self._report_small_quorum()
        self._check_settings()
        healed = self._pending is not None and self._refusal is None
        if healed:
            self._load_state_dict(self._pending)
        self._pending = None
        self.healed_in = time.perf_counter() - started if healed else None
        self._checked += self._refusal is None

    def _waits_for_more(self, groups: int) -> bool:
        """Whether to ask again for a bigger quorum: only while every group present is new to a
        run (its step 0). A quorum with a group that has trained (this group was healed by it,
        or the quorum's step is past 0) is a run in progress, which this group joins at once: a
        group restarted without a checkpoint would otherwise keep forming quorums with one live
        group after another, so that the live groups never meet."""
        return self.groups_present < groups and self._pending is None and self.manager.current_step() == 0

    def _report_small_quorum(self) -> None:
        if self.groups_present >= self._min_groups or self._small_quorum_reported:
            return
        self._small_quorum_reported = True
        log.warning(
            "a quorum formed with %d replica group(s), fewer than min_groups=%d: the lighthouse's --min_replicas is"
            " below min_groups, so a group the others leave behind forms quorums of its own, whose rounds are"
            " discarded; start the lighthouse with --min_replicas %d to make such a group wait for its peers instead",
            self.groups_present,
            self._min_groups,
            self._min_groups,
        )

    def _check_settings(self) -> None:
        """Every process in the quorum shows, in its own row, its group index, how many quorums
        it has passed in the run and its settings' fingerprint. Two processes of one group index
        are caught first; then, where the fingerprints differ, the groups new to the run whose
        fingerprint is not that of the groups already training are refused (all of them, where
        none has trained yet)."""
        table = torch.zeros(self.groups_present, 2 + FINGERPRINT_SLOTS, dtype=torch.float64)
        me = self.manager.participating_rank()
        table[me] = torch.cat([torch.tensor([self._group, self._checked], dtype=torch.float64), self._fingerprint])
        self.manager.allreduce(table, reduce_op=ReduceOp.SUM).wait()
        if self.manager.errored() is not None:  # the round is discarded; the next quorum checks again
            self._pending = None
            return
        rows = {rank: (int(row[0]), int(row[1]), tuple(row[2:].tolist())) for rank, row in enumerate(table)}
        kept = self._refuse_doubles(me, rows)
        prints = {group: printed for rank, (group, _, printed) in rows.items() if rank in kept}
        if len(set(prints.values())) <= 1:
            return
        training = {printed for rank, (_, passed, printed) in rows.items() if rank in kept and passed > 0}
        refused = [group for group, printed in prints.items() if printed not in training]
        settings = self._gather_settings(me, {rows[rank][0]: rank for rank in kept})
        if self._group in refused and self._refusal is None:
            mine = prints[self._group]
            other = next(g for g in sorted(prints) if prints[g] != mine and (not training or prints[g] in training))
            self._refusal = (
                "the DiLoCo replica groups run with different settings: "
                f"{settings_difference(settings, self._group, other)}; start every group with the same"
                " overrides but technique.diloco.torchft.group."
            )
            return
        for group in refused:
            log.warning(
                "replica group %d was refused, its settings not the run's: %s; the groups already training go on",
                group,
                settings_difference(settings, group, self._group),
            )

    def _refuse_doubles(self, me: int, rows: dict[int, tuple[int, int, tuple]]) -> set[int]:
        """Two processes with one group index (a requeued job whose first copy still runs): the
        one that has passed the most quorums in the run goes on, the others are refused (all of
        them on a tie: none can be preferred); the other groups go on. Returns the participants kept."""
        kept = set(rows)
        for group in {group for group, _, _ in rows.values()}:
            ranks = [rank for rank, row in rows.items() if row[0] == group]
            if len(ranks) < 2:
                continue
            passed = sorted((rows[rank][1] for rank in ranks), reverse=True)
            older = [rank for rank in ranks if rows[rank][1] == passed[0] and passed[0] > passed[1]]
            kept -= set(ranks) - set(older)
            if me in ranks and me not in older:
                self._refusal = self._doubled = (
                    f"replica group {group} is already running in another process (a requeued job whose first copy"
                    f" still runs?): this one leaves the run; stop one of them, or start this one with another free"
                    f" {self._key}.torchft.group."
                )
            else:
                log.warning(
                    "%d processes started as replica group %d; %s",
                    len(ranks),
                    group,
                    "the one that trained longest goes on" if older else "none goes on (none trained longer)",
                )
        return kept

    def _gather_settings(self, me: int, ranks: dict[int, int]) -> dict[int, dict[str, Any]]:
        """The settings of the groups kept (``ranks``: group index -> its participant's row), each
        participant writing its own row of a summed tensor, its settings as JSON bytes."""
        encoded = b"" if self._doubled else json.dumps(self._agreed, sort_keys=True).encode()
        lengths = torch.zeros(self.groups_present, dtype=torch.float64)
        lengths[me] = len(encoded)
        self.manager.allreduce(lengths, reduce_op=ReduceOp.SUM).wait()
        data = torch.zeros(self.groups_present, int(lengths.max()), dtype=torch.float64)  # the same in every group
        data[me, : len(encoded)] = torch.tensor(list(encoded), dtype=torch.float64)
        self.manager.allreduce(data, reduce_op=ReduceOp.SUM).wait()
        return {
            group: json.loads(bytes(int(round(b)) for b in data[rank, : int(lengths[rank])].tolist()).decode())
            for group, rank in ranks.items()
            if lengths[rank]
        }

    def _start_quorum(self) -> None:
        """Ask the lighthouse for a quorum, again every ``REQUEST_S`` until one forms (a restarted
        lighthouse has forgotten the request before its restart); where none forms within the
        quorum timeout, leave and stop in one line rather than train alone."""
        deadline = time.perf_counter() + self._quorum_timeout_s
        while (left := deadline - time.perf_counter()) > 0:
            try:
                self.manager.start_quorum(timeout=timedelta(seconds=min(REQUEST_S, left)))
                return
            except TimeoutError:
                # torchft keeps the failed request's future and would raise its error again.
                self.manager._quorum_future = None
                log.info("no quorum within %g s; asking the lighthouse again", min(REQUEST_S, left))
        self.shutdown()
        raise ConfigError(self._no_quorum())

    def _no_quorum(self) -> str:
        """Why no quorum formed: the lighthouse is gone, or fewer groups ask than it waits for."""
        key, lighthouse, timeout = self._key, self._lighthouse, self._quorum_timeout_s
        alive = heartbeating(lighthouse)
        if alive is None:
            return (
                f"{key}.torchft: no quorum formed within quorum_timeout_s={timeout:g} s: the lighthouse at {lighthouse}"
                " was lost (nothing answers there); restart it on that address (the groups ask again every"
                f" {REQUEST_S:g} s within quorum_timeout_s) and resume this group from its last checkpoint."
            )
        return (
            f"{key}.torchft: no quorum formed within quorum_timeout_s={timeout:g} s: the lighthouse at {lighthouse}"
            f" waits for more replica groups than are running (its --min_replicas; {alive} heartbeating). Start the other groups"
            f" ({key}.torchft.group=...), or raise {key}.torchft.quorum_timeout_s. Where the others finished, this"
            " group's weights are not the run's: use the last checkpoint of a group that exited 0."
        )

    def live_peers(self) -> int | None:
        """The other groups alive (heartbeating to the lighthouse); None where it cannot say."""
        alive = heartbeating(self._lighthouse)
        return None if alive is None or alive < 0 else max(alive - 1, 0)

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


def settings_difference(settings: dict[int, dict[str, Any]], group: int, other: int) -> str:
    """The first key (in sorted order) in which ``group``'s settings differ from ``other``'s,
    with both values: what a refused group's one line names."""
    mine, theirs = settings.get(group, {}), settings.get(other, {})
    key = next((key for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)), None)
    if key is None:
        return f"group {group}'s and group {other}'s differ"
    return f"{key} is {mine.get(key, 'unset')} in group {group} and {theirs.get(key, 'unset')} in group {other}"
