"""When each fragment syncs, which exchanges are in flight, and how results are merged.

Classic DiLoCo is the case of one fragment, no delay and no mixing. After global step t:

1. each fragment due at t (``fragments.py``) starts its exchange: the replicas' deltas
   (anchor - local weights, fp32) are averaged, on the wire for real replicas;
2. each exchange started ``fragment_delay`` steps ago (now, with no delay) is completed:
   the outer optimizer steps the fragment's anchors with the averaged delta, and the
   fragment's local weights become ``alpha * local + (1 - alpha) * anchor``, where local
   is what the replicas trained in the meantime.

Training always ends synced (``finish``): exchanges in flight complete, and every fragment
not already equal to its anchor is set to the replicas' mean (anchor minus the averaged
delta, with no outer momentum or learning rate, since a partial round's pseudo-gradient is
not a full outer gradient), so the final weights are one model.

A round the torchft replica groups discarded (a group failed during it) sends every
fragment back to its anchor, without an outer step; so does a discarded final average.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from callbacks.diloco.exchange import Exchange, average_in_process, start_average
from callbacks.diloco.fragments import fragments_due
from callbacks.diloco.outer_step import OuterStep

Norm = Callable[[list[int], list[torch.Tensor]], torch.Tensor]


@dataclass
class InFlight:
    """A fragment's exchange, started after one global step and merged after another."""

    fragment: int
    merge_after: int
    exchange: Exchange


@dataclass
class SyncRecord:
    """A completed sync, for the logs: the fragment (None: the final averaging), the norm of
    its averaged delta, the parameters it exchanged, and whether the run ends with it."""

    fragment: int | None
    norm: torch.Tensor
    indices: list[int]
    ends: bool = False


class FragmentSync:
    """Drives the outer loop over the weights of the replicas this process holds.

    ``weights``: per replica held here (all M when simulated, else one), the live local
    tensors of every parameter. ``group``: the replica group of real replicas (None when
    simulated or M = 1). ``average``: a fault-tolerant average over replica groups that are
    jobs of their own (torchft), given the deltas, whether this is the run's final plain
    average and whether the run ends with it; its exchange holds None for a round the groups
    discarded.
    """

    def __init__(
        self,
        weights: list[list[torch.Tensor]],
        fragments: list[list[int]],
        outer: OuterStep,
        sync_every: int,
        delay: int,
        alpha: float,
        compression: str,
        group: dist.ProcessGroup | None,
        norm: Norm,
        average: Callable[[list[torch.Tensor], bool, bool], Exchange] | None = None,
    ) -> None:
        self.weights, self.fragments, self.outer = weights, fragments, outer
        self.sync_every, self.delay, self.alpha = sync_every, delay, alpha
        self.compression, self.group, self.norm = compression, group, norm
        self.average = average
        #: Rounds the replica groups discarded (a group failed during them).
        self.discarded = 0
        self.in_flight: list[InFlight] = []
        self._synced: set[int] = set()  # fragments whose weights equal their anchors

    def after_global_step(self, step: int, ending: bool = False) -> list[SyncRecord]:
        """``ending``: the run ends after this step."""
        self._synced.clear()  # an inner step has moved every fragment
        for fragment in fragments_due(step, self.sync_every, len(self.fragments)):
            exchange = self._start(self.fragments[fragment], ends=ending)  # a torchft group healed here has new state
            self.in_flight.append(InFlight(fragment, step + self.delay, exchange))
        due = [flight for flight in self.in_flight if flight.merge_after <= step]
        self.in_flight = [flight for flight in self.in_flight if flight.merge_after > step]
        return [record for record in map(self._complete, due) if record is not None]

    def finish(self) -> list[SyncRecord]:
        """Complete every exchange now and average what is not synced (the end of training)."""
        records = [record for record in map(self._complete, self.in_flight) if record is not None]
        self.in_flight = []
        indices = [i for fragment, ids in enumerate(self.fragments) if fragment not in self._synced for i in ids]
        final = self._settle(None, indices, self._start(indices, final=True, ends=True)) if indices else None
        return records + ([final] if final else [])

    def join(self, take_part: Callable[[list[torch.Tensor]], Exchange]) -> list[SyncRecord]:
        """A torchft replica group joining the run takes part in the round the groups present
        are syncing, without contributing to it (``take_part``: its deltas, which it does not
        send). Where the others averaged a round, this group (healed to their state if it was
        behind) takes the same step; where none did (every group is joining), nothing moves."""
        indices = [i for ids in self.fragments for i in ids]
        exchange = take_part(self._deltas(indices, self.weights[0]))
        if exchange.wait() is None:
            return []
        return [self._settle(len(self.fragments) - 1, indices, exchange)]

    def _start(self, indices: list[int], final: bool = False, ends: bool = False) -> Exchange:
        deltas = [self._deltas(indices, weights) for weights in self.weights]
        if len(deltas) > 1:
            return Exchange.done([average_in_process(list(each), self.compression) for each in zip(*deltas)])
        if self.average is not None:
            return self.average(deltas[0], final, ends)
        if self.group is None:
            return Exchange.done(deltas[0])
        return start_average(deltas[0], self.group, self.compression)

    def _deltas(self, indices: list[int], weights: list[torch.Tensor]) -> list[torch.Tensor]:
        """anchor - local weights, in the anchors' precision (fp32 for any parameter dtype)."""
        anchors = self.outer.anchors
        return [anchors[i].to(weights[i].device) - weights[i].to(anchors[i].dtype) for i in indices]

    def _complete(self, flight: InFlight) -> SyncRecord | None:
        return self._settle(flight.fragment, self.fragments[flight.fragment], flight.exchange)

    def _settle(self, fragment: int | None, indices: list[int], exchange: Exchange) -> SyncRecord | None:
        """Apply an exchange: an outer step and the merge, or, for the run's final average
        (``fragment`` None, or the groups that sent it were ending), the plain mean. A round
        the groups discarded sends the fragment back to its anchor."""
        averaged = exchange.wait()
        if averaged is None:
            self.discarded += 1
            self._merge(indices, alpha=0.0)
            return None
        if fragment is None or exchange.final:
            self.outer.average(indices, averaged)
            self._merge(indices, alpha=0.0)
            self._synced.update(range(len(self.fragments)))  # nothing is left to average
            return SyncRecord(None, self.norm(indices, averaged), indices, ends=True)
        self.outer.step(indices, averaged)
        self._merge(indices, self.alpha)
        if self.alpha == 0:
            self._synced.add(fragment)
        return SyncRecord(fragment, self.norm(indices, averaged), indices, ends=exchange.ends)

    def _merge(self, indices: list[int], alpha: float) -> None:
        for weights in self.weights:
            for i in indices:
                anchor = self.outer.anchors[i].to(weights[i].device, weights[i].dtype)
                if alpha:
                    weights[i].mul_(alpha).add_(anchor, alpha=1 - alpha)
                else:
                    weights[i].copy_(anchor)

    def state_dict(self) -> dict:
        """The outer state and the exchanges in flight (waited for: their results are saved)."""
        flights = [
            (flight.fragment, flight.merge_after, [t.clone() for t in flight.exchange.wait()])
            for flight in self.in_flight
        ]
        return {"outer": self.outer.state_dict(), "in_flight": flights, "synced": sorted(self._synced)}

    def load_state_dict(self, state: dict) -> None:
        self.outer.load_state_dict(state["outer"])
        self.in_flight = [
            InFlight(fragment, merge_after, Exchange.done(values))
            for fragment, merge_after, values in state["in_flight"]
        ]
        self._synced = set(state["synced"])
