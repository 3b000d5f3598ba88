"""A tuned study's sweep from its command line's jobs to its end, independent of Hydra.

A tuned study (one with a search, ``study/tuner.py``) runs in rounds that its plan
(``study/plan.py``, a pure function of the finished jobs) lays out: the searches' points on
the tuning seeds (``++study.phase=tune``), then each tuned arm's winner on the judging seeds
(``++study.phase=judge``, with more seeds in rounds where the preset asks for them), then a
ladder's held-out size (``++study.phase=held_out``), whose loss prediction is written to
``ladder_prediction.yaml`` (``analysis/ladder.py``) before it trains. This module checks the
plan against the composed configs, opens the search record, and hands the plan to the worker
loop (``study/worker.py``), which runs the open jobs no other worker holds. So the same command
replays the finished rounds (their jobs are skipped) and continues where it stopped, and a
second worker started with it shares the rounds. A job runs in the folder given to its
overrides before, else in the next unused number (``study/job_folders.py``): a study that
gains an arm keeps every job where it is, started or only planned.

What it needs of the sweeper is ``JobConfigs``: what a job's composed config holds, and a
check that overrides parse.
"""

import fcntl
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from analysis.runs import recorded_overrides
from common.errors import ConfigError
from common.overrides import not_set_by, override_key, override_value
from launch.sweep_jobs import MARKER
from study.job_folders import REGISTRY
from study.jobs import chosen_arms
from study.joint_search import SAMPLERS
from study.plan import StudyPlan, TunedJob
from study.preset import StudySpec
from study.search_record import JOURNAL, SearchRecord, check_record, fingerprint, open_storage
from study.search_record import LOCK as RECORD_LOCK
from study.worker import Launch, run_rounds

log = logging.getLogger(__name__)


class JobConfigs(Protocol):
    """What a tuned sweep asks of the config system (Hydra's, in the sweeper)."""

    def model(self, overrides: list[str]) -> dict[str, Any]:
        """The ``model`` section of a job with these overrides, as plain resolved values."""

    def has_setting(self, overrides: list[str], key: str) -> bool:
        """Whether the composed config of a job with these overrides holds the dotted key."""

    def parse(self, overrides: list[str]) -> None:
        """Raise if an override does not parse."""


def run_tuned_study(
    spec: StudySpec,
    base_jobs: list[list[str]],
    sweep_dir: Path,
    configs: JobConfigs,
    launch: Launch,
    save_config: Callable[[Path], None] = lambda sweep_dir: None,
) -> list[Any]:
    """Check the study's plan for these base jobs, then run it to its end; returns what
    ``launch`` returned for each job launched here. ``save_config(sweep_dir)`` writes the
    sweep's config once the folder exists."""
    bases = []  # (base, arms)
    for job in base_jobs:
        arms, base = chosen_arms(spec, job)
        bases.append((base, arms))
    budgeted = spec.tokens_per_parameter is not None and any(
        "token_budget" not in {override_key(o) for o in base} for base, _ in bases
    )
    anchored = [arm for arm, search in spec.searches.items() if search.previous_size_anchor]
    if anchored and len({override_value(base, "model") for base, _ in bases}) < 2:
        raise ConfigError(
            f"study.previous_size_anchor (arm {anchored[0]}) anchors each size on the next smaller one's winner,"
            " but this study runs one model: cross it with sizes (model=a,b,...) or drop previous_size_anchor."
        )
    trends = any(claim.trend for claim in spec.claims) and len(bases) > 1
    sizes = (
        [parameters(configs, base) for base, _ in bases] if budgeted or spec.held_out or anchored or trends else None
    )
    held_out = held_out_base(spec, [base for base, _ in bases])
    study = StudyPlan(
        spec,
        [(with_budget(spec, base, size), arms) for (base, arms), size in zip(bases, sizes or [None] * len(bases))],
        held_out,
        sizes,
    )
    check_arms(spec, configs)
    check_search(study, configs)
    check_seed_cap(spec, sweep_dir)
    searches = record_names(study)
    storage = open_storage(spec.storage, sweep_dir) if spec.storage or (sweep_dir / JOURNAL).is_file() else None
    for name, print_ in searches.values() if storage is not None else ():
        check_record(storage, name, print_)  # before the sweep folder exists
    sweep_dir.mkdir(parents=True, exist_ok=True)
    storage = storage or (open_storage(None, sweep_dir) if searches else None)
    study.records = {
        key: SearchRecord(storage, name, print_, sweep_dir / RECORD_LOCK) for key, (name, print_) in searches.items()
    }
    save_config(sweep_dir)
    return run_rounds(study, sweep_dir, launch, partial(predict_held_out, study, sweep_dir))


def record_names(study: StudyPlan) -> dict[tuple[int, str], tuple[str, str]]:
    """Each joint search's name and settings in the record (the coordinate rule needs none)."""
    found = {}
    for base, arm in study.searches:
        search = study.spec.searches[arm]
        if search.searcher in SAMPLERS and search.space.dimensions:
            found[(base, arm)] = (study.search_name(base, arm), fingerprint(search))
    return found


def parameters(configs: JobConfigs, base: list[str]) -> int:
    """The parameter count of a base job's model."""
    from analysis.scaling_laws import parameter_count  # torch: only for a study that needs it

    try:
        return parameter_count(configs.model(base))
    except ValueError as error:
        raise ConfigError(f"study.tokens_per_parameter / study.held_out: {error} Set model.vocab_size.") from None


def with_budget(spec: StudySpec, base: list[str], n_params: int | None) -> list[str]:
    """A base job with its token budget from ``study.tokens_per_parameter`` (unless the
    command line sets one): that many tokens per parameter of the job's model."""
    if spec.tokens_per_parameter is None or "token_budget" in {override_key(o) for o in base}:
        return base
    return [*base, f"token_budget={round(spec.tokens_per_parameter * n_params)}"]


def held_out_base(spec: StudySpec, bases: list[list[str]]) -> int | None:
    """The base job of ``study.held_out`` (the one run with ``model=NAME``), which needs
    at least 3 other sizes to fit its settings and its loss on."""
    if spec.held_out is None:
        return None
    from analysis.ladder import MIN_SIZES

    models = [override_value(base, "model") for base in bases]
    if spec.held_out not in models:
        raise ConfigError(
            f"study.held_out={spec.held_out} is not one of the sizes this study runs"
            f" (model={','.join(m for m in models if m) or '...'}); name one of them."
        )
    if len(set(models) - {spec.held_out}) < MIN_SIZES:
        raise ConfigError(
            f"study.held_out: the ladder has {len(set(models)) - 1} other size(s); fitting over N needs at"
            f" least {MIN_SIZES}: add sizes to model=..., or drop study.held_out."
        )
    return models.index(spec.held_out)


def predict_held_out(study: StudyPlan, sweep_dir: Path, jobs: list[TunedJob]) -> None:
    """Before the held-out size's jobs (its base job is in no other round: it is neither
    searched nor judged), write its loss prediction from the judged sizes (kept if a worker
    wrote it already: its runs may have started since)."""
    if study.held_out is None or jobs[0].base != study.held_out:
        return
    from analysis.ladder import PREDICTION, write_prediction

    with open(sweep_dir / f"{REGISTRY}.lock", "w") as lock:  # two workers arrive together: one writes
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (sweep_dir / PREDICTION).is_file():
            return
        settings = {job.arm: list(job.settings) for job in jobs}
        predictions = write_prediction(
            [sweep_dir],
            study.spec.held_out,
            study.sizes[study.held_out],
            settings=settings,
            seeds=len(study.spec.seeds),
            laws={arm: [law.as_dict() for law in laws] for arm, laws in study.held_out_laws.items()},
        )
    for p in predictions:
        log.info(
            "held-out %s at %s: predicted %.4f (fit [%.4f, %.4f], prediction interval [%.4f, %.4f]) from %s on %s; runs with %s",
            p.method,
            p.model,
            p.predicted,
            p.low,
            p.high,
            p.interval_low,
            p.interval_high,
            p.form,
            ", ".join(p.fitted_on),
            " ".join(p.settings),
        )
    for arm, laws in study.held_out_laws.items():
        for law in laws:
            log.info("held-out %s: %s", arm, law.describe())


def check_arms(spec: StudySpec, configs: JobConfigs) -> None:
    """Parse every arm's overrides now, so a typo fails before the first job runs."""
    for overrides in spec.arms.values():
        configs.parse(overrides)


def check_seed_cap(spec: StudySpec, sweep_dir: Path) -> None:
    """A cap on judging seeds below those this study's folder already judged on is a
    mistake (the runs would be ignored): one line before any job starts."""
    if spec.max_seeds is None or not sweep_dir.is_dir():
        return
    judged = set()
    for folder in sweep_dir.iterdir():
        overrides = recorded_overrides(folder) if folder.name.isdigit() and (folder / MARKER).is_file() else None
        if overrides and "++study.phase=judge" in overrides:
            judged |= {o.split("=", 1)[1] for o in overrides if override_key(o) == "seed"}
    if len(judged) > spec.max_seeds:
        raise ConfigError(
            f"study.seeds.max={spec.max_seeds} is below the {len(judged)} judging seeds this study already ran"
            f" ({', '.join(sorted(judged, key=int))}); raise it to at least {len(judged)}."
        )


def check_search(study: StudyPlan, configs: JobConfigs) -> None:
    """Every searched setting must exist in its arm's config (composed without the search),
    so a misspelt key is one line before any job starts."""
    for base, arm in study.searches:
        overrides = study.bases[base][0]
        overrides = [*overrides, *not_set_by(overrides, study.spec.arms[arm])]
        for key in study.spec.spaces[arm].keys:
            if not configs.has_setting(overrides, key):
                raise ConfigError(
                    f"study.search: {key} is not a setting of arm {arm} (`python train.py --cfg job` lists the keys);"
                    " fix the key, or add the group that defines it to the arm's overrides."
                )
