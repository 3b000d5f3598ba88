"""A tuned study's plan: the next round of jobs, a pure function of the finished ones.

The study sweeper (``hydra_plugins/study_sweeper``) only runs what this says: it asks for a
round, launches it, records each job's final metrics, and asks again until the round is
empty. Everything here is decided from those records and the preset, never from what the
sweeper did before, so a resumed study (or a second worker) plans the same rounds.

The phases, each starting once the one before has nothing left:

1. **tune**: every (base job, arm) search's pending points (``study/tuner.py``) on every
   tuning seed, then its finalists and anchors on the finalist seeds;
2. **judge**: each tuned arm's winner on the judging seeds (an arm whose search is not tuned,
   say an anchor resolvably ahead of its search, is not judged; in a ladder with a held-out size its winner
   runs on the judging seeds all the same, for the loss law the prediction fits, and stays out
   of the claims). With ``study.seeds: {first: [...], max: N}``
   more seeds follow while a claim is unresolved (inconclusive or underpowered; in a ladder,
   a plain claim at any size or a trend claim across the sizes), up to the
   next planned look (``study.seeds.looks``, by default the cap N), numbered on from the
   largest seed the study uses, each look judged at its share of the tests' levels
   (``study/looks.py``);
3. **held out**: a ladder's held-out size, at settings fitted over the other sizes' winners,
   on the first judging seeds.
"""

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.overrides import not_set_by
from study.claim_tests import Spread
from study.looks import judge_in_looks
from study.preset import StudySpec
from study.search_record import SearchRecord, search_name
from study.search_space import Point
from study.tuner import Tuning, anchored_on, tuning_from_seeds

if TYPE_CHECKING:
    from study.setting_laws import SettingLaw

TUNE, JUDGE = "tune", "judge"


@dataclass(frozen=True)
class TunedJob:
    """One job of a tuned study: an arm at a point of its space, on one seed, in one base job
    (the command line's, or one of the values it crosses the study with)."""

    base: int
    arm: str
    point: Point | None  # None: a held-out size, at ``settings``
    seed: int
    phase: str  # tune | judge | held_out
    settings: tuple[str, ...] = ()


@dataclass
class StudyPlan:
    """The study's searches (each base job crossed with its arms; a held-out base is not
    searched) and the rounds they lead to."""

    spec: StudySpec
    bases: list[tuple[list[str], list[str]]]  # per base job: its overrides and the arms it runs
    held_out: int | None = None  # the held-out base job
    sizes: list[int] | None = None  # every base's parameter count (a ladder's)
    #: The final metrics of each finished job.
    finished: dict[TunedJob, dict[str, float]] = field(default_factory=dict)
    #: Each search's record, where the study keeps one (``study/search_record.py``).
    records: dict[tuple[int, str], SearchRecord] = field(default_factory=dict)
    #: Each held-out arm's setting laws, once its settings are fitted (``study/setting_laws.py``):
    #: the held-out round computes them, the prediction records them.
    held_out_laws: dict[str, list["SettingLaw"]] = field(default_factory=dict)

    @property
    def select(self) -> str:
        return self.spec.claims[0].select if self.spec.claims else "val/loss"

    @property
    def searches(self) -> list[tuple[int, str]]:
        """Every (base job, arm) searched, the smaller sizes first in a ladder."""
        bases = [base for base in range(len(self.bases)) if base != self.held_out]
        if self.sizes is not None:
            bases.sort(key=lambda base: self.sizes[base])
        return [(base, arm) for base in bases for arm in self.bases[base][1]]

    def previous_size(self, base: int, arm: str) -> tuple[int, str] | None:
        """The same arm's search at the next smaller size, where the arm anchors on it."""
        if not self.spec.searches[arm].previous_size_anchor or self.sizes is None:
            return None
        smaller = [b for b, a in self.searches if a == arm and self.sizes[b] < self.sizes[base]]
        return (max(smaller, key=lambda b: self.sizes[b]), arm) if smaller else None

    def record(self, job: TunedJob, metrics: dict[str, float]) -> None:
        self.finished[job] = dict(metrics)

    def tuning(self, base: int, arm: str, previous: Tuning | None = None) -> Tuning:
        """The search so far: each point whose every tuning seed finished, at its mean, and the
        finalists' and anchors' runs on the finalist seeds; ``previous``: the same arm's search,
        over, at the next smaller size (its winner joins the anchors)."""
        search = anchored_on(self.spec.searches[arm], previous)
        by_point: dict[Point, dict[int, float]] = defaultdict(dict)
        for job, metrics in self.finished.items():
            if job.phase == TUNE and (job.base, job.arm) == (base, arm):
                by_point[job.point][job.seed] = float(metrics.get(self.select, math.nan))
        return tuning_from_seeds(search, self.spec.tuning_seeds, by_point, self.records.get((base, arm)))

    def search_name(self, base: int, arm: str) -> str:
        """A search's name in the record: its arm, and the values its base job sets, if any."""
        return search_name(arm, self.bases[base][0])

    def next_round(self) -> list[TunedJob]:
        """The jobs to run next (those not finished yet); empty when the study is done."""
        tunings = self.tunings()
        for phase in (
            self._tune_round,
            self._judge_round,
            self._held_out_round,
        ):  # each only once the one before is done
            if waiting := [job for job in phase(tunings) if job not in self.finished]:
                return waiting
        return []

    def tunings(self) -> dict[tuple[int, str], Tuning]:
        """Every search that can run: one that anchors on the next smaller size's winner waits
        (and is left out) until that search is over."""
        found: dict[tuple[int, str], Tuning] = {}
        for search in self.searches:
            previous = self.previous_size(*search)
            if previous is not None and (previous not in found or not found[previous].over):
                continue
            found[search] = self.tuning(*search, found.get(previous))
        return found

    def _tune_round(self, tunings: dict[tuple[int, str], Tuning]) -> list[TunedJob]:
        """The searchers' points on the tuning seeds, then the finalists and anchors on the finalist seeds."""
        return [
            job
            for (base, arm), tuning in tunings.items()
            for job in (
                *(
                    TunedJob(base, arm, point, seed, TUNE)
                    for point in tuning.pending
                    for seed in self.spec.tuning_seeds
                ),
                *(TunedJob(base, arm, point, seed, TUNE) for point, seed in tuning.pending_reruns),
            )
        ]

    def judged(self, tunings: dict[tuple[int, str], Tuning]) -> list[tuple[int, str, Point]]:
        """The searches whose winner runs on the judging seeds: the tuned ones; in a ladder with a
        held-out size every finished search's, as its loss law and the held-out prediction take
        every size's winner (the claims still leave out the ones not tuned, ``_claim_groups``)."""
        return [
            (base, arm, tuning.winner)
            for (base, arm), tuning in tunings.items()
            if tuning.tuned or self.held_out is not None and tuning.over and tuning.winner is not None
        ]

    def _judge_round(self, tunings: dict[tuple[int, str], Tuning]) -> list[TunedJob]:
        """The judging seeds' jobs: the first seeds, then those each look asks for (``study/looks.py``)."""
        judged = self.judged(tunings)
        jobs = [TunedJob(base, arm, point, seed, JUDGE) for base, arm, point in judged for seed in self.spec.seeds]
        if any(job not in self.finished for job in jobs) or self.spec.max_seeds is None:
            return jobs
        bases = sorted({base for base, _, _ in judged})
        trends = self.sizes is not None and any(claim.trend for claim in self.spec.claims)
        sizes = [self.sizes[base] for base in bases] if trends else None
        groups = [self._claim_groups(base, judged, tunings) for base in bases]
        judgement = judge_in_looks(self.spec, groups, sizes=sizes)
        return [
            TunedJob(base, arm, point, seed, JUDGE)
            for base, arm, point in judged
            for seed in judgement.next_seeds or []
        ]

    def _claim_groups(
        self, base: int, judged: list[tuple[int, str, Point]], tunings: dict[tuple[int, str], Tuning]
    ) -> dict[str, dict[str, Spread]]:
        """A base job's judged arms whose search is tuned: each metric's final values over the
        judging seeds that finished (the report leaves the same arms out, so both replay the same looks)."""
        groups = {}
        for b, arm, point in judged:
            if b != base or not tunings[(b, arm)].tuned:
                continue
            runs = {
                job.seed: metrics
                for job, metrics in self.finished.items()
                if (job.base, job.arm, job.point, job.phase) == (b, arm, point, JUDGE)
            }
            names = {m for values in runs.values() for m in values}
            groups[arm] = {
                m: Spread(
                    tuple(runs[s][m] for s in sorted(runs) if m in runs[s]),
                    tuple(s for s in sorted(runs) if m in runs[s]),
                )
                for m in names
            }
        return groups

    def _held_out_round(self, tunings: dict[tuple[int, str], Tuning]) -> list[TunedJob]:
        """The held-out size's arms on the first judging seeds, each at its settings fitted over
        the searched sizes' winners."""
        if self.held_out is None:
            return []
        from analysis.ladder import HELD_OUT  # numpy and a fit: only for a ladder
        from study.setting_laws import setting_laws

        jobs = []
        for arm in self.bases[self.held_out][1]:
            winners = [(self.sizes[base], tunings[(base, name)].winner) for base, name in self.searches if name == arm]
            laws = setting_laws(self.spec.spaces[arm], winners, self.sizes[self.held_out])
            self.held_out_laws[arm] = laws
            settings = tuple(o for law in laws for o in law.overrides)
            jobs += [TunedJob(self.held_out, arm, None, seed, HELD_OUT, settings) for seed in self.spec.seeds]
        return jobs

    def overrides(self, job: TunedJob) -> list[str]:
        """A job's overrides: its base job's, its arm's fixed ones, its point's, the study's."""
        base = self.bases[job.base][0]
        fixed = not_set_by(base, self.spec.arms[job.arm])
        point = list(job.settings) if job.point is None else self.spec.spaces[job.arm].overrides(job.point)
        return [*base, *fixed, *point, f"study.arm={job.arm}", f"++study.phase={job.phase}", f"seed={job.seed}"]
