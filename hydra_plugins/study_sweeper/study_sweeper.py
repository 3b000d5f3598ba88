"""The study sweeper: a study preset's arms x seeds as Hydra jobs, and tuned studies in rounds.

Hydra finds sweepers only in the ``hydra_plugins`` namespace, hence this folder. A study
preset selects it (``override /hydra/sweeper: study``) and declares ``study.arms`` and
``study.seeds`` (``analysis/study.py``). Every job gets, after the command line's own
overrides (swept ones expanded as the basic sweeper does), its arm's overrides,
``study.arm=NAME`` and ``seed=S``; jobs are numbered arm by arm, seed by seed, so the
same command always gives a job the same folder (which is what lets a sweep resume).

The command line wins over the study: an arm's override of a key the command line also
sets is dropped, and ``seed=...`` on the command line replaces the study's seeds. An arm
that sets ``seed=...`` itself runs once, with that seed (branches of one seed's run).
``study.arm=A,B`` on the command line runs only those arms; their jobs carry the same
overrides as in the whole study, so more seeds of a study's best arms, run into another
folder, group with its runs in the report.

A tuned study (one with a search, ``analysis/tuner.py``) runs in rounds that its plan
(``analysis/study_plan.py``, a pure function of the finished jobs) lays out: the searches'
points on the tuning seeds (``++study.phase=tune``), then each tuned arm's winner on the
judging seeds (``++study.phase=judge``, with more seeds in rounds where the preset asks for
them), then a ladder's held-out size (``++study.phase=held_out``), whose loss prediction is
written to ``ladder_prediction.yaml`` (``analysis/ladder.py``) before it trains. This sweeper
composes the plan and launches its jobs; the loop that asks the plan for open jobs, runs
those no other worker holds and records their final metrics is ``launch/study_worker.py``.
So the same command replays the finished rounds (their jobs are skipped) and continues where
it stopped, and a second worker started with it shares the rounds. A tuned study's job runs
in the folder given to its overrides before, else in the next unused number
(``launch/job_folders.py``): a study that gains an arm keeps every job where it is, started
or only planned. A plain study's jobs are numbered by position, and a folder that holds a finished
run of other overrides stops the sweep before any job starts.
"""

import fcntl
import logging
from functools import partial
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.utils import JobReturn
from omegaconf import OmegaConf

from analysis.model_search import SAMPLERS
from analysis.runs import recorded_overrides
from analysis.search_record import JOURNAL, LOCK as RECORD_LOCK, SearchRecord, check_record, fingerprint, open_storage
from analysis.study import StudySpec
from analysis.study_plan import StudyPlan, TunedJob
from common.overrides import not_set_by, override_key, override_value
from common.errors import ConfigError
from launch.job_folders import REGISTRY
from launch.study_worker import run_rounds
from launch.sweep_jobs import MARKER

log = logging.getLogger(__name__)


def _chosen_arms(spec: StudySpec, base: list[str]) -> tuple[list[str], list[str]]:
    """The arms a base job runs (``study.arm=A`` on the command line, else all) and the base
    job without that override."""
    chosen = [o.split("=", 1)[1] for o in base if override_key(o) == "study.arm"]
    for arm in chosen:
        if arm not in spec.arms:
            raise ConfigError(f"study.arm={arm} is not an arm of this study; its arms: {', '.join(spec.arms)}")
    return chosen or list(spec.arms), [o for o in base if override_key(o) != "study.arm"]


def refuse_other_runs(sweep_dir: Path, jobs: list[list[str]]) -> None:
    """Stop before any job starts (Hydra would first overwrite a folder's records) if job i's
    folder holds a finished run of other overrides."""
    for number, overrides in enumerate(jobs):
        folder = sweep_dir / str(number)
        recorded = recorded_overrides(folder) if (folder / MARKER).is_file() else None
        if recorded is not None and recorded != overrides:
            raise ConfigError(
                f"{folder} holds a finished run of other overrides ({' '.join(recorded)}), not job {number}'s"
                f" ({' '.join(overrides)}): the study's jobs changed; use a new hydra.sweep.dir."
            )


def study_jobs(spec: StudySpec, base_jobs: list[list[str]]) -> list[list[str]]:
    """Each base job (the command line's) crossed with every arm (or the one it names) and seed."""
    jobs = []
    for base in base_jobs:
        arms, base = _chosen_arms(spec, base)
        for arm in arms:
            kept = not_set_by(base, spec.arms[arm])
            seeds = [None] if "seed" in {override_key(o) for o in [*base, *kept]} else spec.seeds
            for seed in seeds:
                jobs.append([*base, *kept, f"study.arm={arm}", *([f"seed={seed}"] if seed is not None else [])])
    return jobs


class StudySweeper(BasicSweeper):
    """The basic sweeper, with each job crossed with the study's arms and seeds; a tuned
    study runs in rounds."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)

    def _spec(self) -> StudySpec:
        return StudySpec.from_config(OmegaConf.to_container(self.config.get("study"), resolve=True))

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        spec = self._spec()
        base = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        self._check_arms(spec)
        jobs = study_jobs(spec, base)
        refuse_other_runs(Path(self.config.hydra.sweep.dir), jobs)
        size = max_batch_size or len(jobs)
        return [jobs[i : i + size] for i in range(0, len(jobs), size)]

    def sweep(self, arguments: list[str]) -> Any:
        spec = self._spec()
        if not spec.tuned:
            return super().sweep(arguments)
        bases = []
        for job in self._base_jobs(arguments):
            arms, base = _chosen_arms(spec, job)
            bases.append((base, arms))
        budgeted = spec.tokens_per_parameter is not None and any("token_budget" not in {override_key(o) for o in base} for base, _ in bases)
        sizes = [self._parameters(base) for base, _ in bases] if budgeted or spec.held_out else None
        held_out = self._held_out_base(spec, [base for base, _ in bases])
        study = StudyPlan(spec, [(self._with_budget(spec, base, size), arms) for (base, arms), size in zip(bases, sizes or [None] * len(bases))],
                          held_out, sizes)  # fmt: skip
        self._check_arms(spec)
        self._check_search(study)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        self._check_seed_cap(spec, sweep_dir)
        searches = self._record_names(study)
        storage = open_storage(spec.storage, sweep_dir) if spec.storage or (sweep_dir / JOURNAL).is_file() else None
        for name, print_ in searches.values() if storage is not None else ():
            check_record(storage, name, print_)  # before the sweep folder exists
        sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = storage or (open_storage(None, sweep_dir) if searches else None)
        study.records = {key: SearchRecord(storage, name, print_, sweep_dir / RECORD_LOCK) for key, (name, print_) in searches.items()}
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        return run_rounds(study, sweep_dir, self._launch, partial(self._predict_held_out, study, sweep_dir))

    @staticmethod
    def _record_names(study: StudyPlan) -> dict[tuple[int, str], tuple[str, str]]:
        """Each joint search's name and settings in the record (the coordinate rule needs none)."""
        found = {}
        for base, arm in study.searches:
            search = study.spec.searches[arm]
            if search.searcher in SAMPLERS and search.space.dimensions:
                found[(base, arm)] = (study.search_name(base, arm), fingerprint(search))
        return found

    def _launch(self, overrides: list[str], number: int) -> JobReturn:
        """Run one job in folder ``number`` (it passes itself by if another worker holds it)."""
        self.validate_batch_is_legal([overrides])
        result = self.launcher.launch([overrides], initial_job_idx=number)[0]
        _ = result.return_value  # re-raises a job's failure
        return result

    def _base_jobs(self, arguments: list[str]) -> list[list[str]]:
        """The command line's jobs (and ``hydra.sweeper.params``'s): each is tuned on its own."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]

    def _parameters(self, base: list[str]) -> int:
        """The parameter count of a base job's model."""
        from analysis.scaling_laws import parameter_count  # torch: only for a study that needs it

        model = OmegaConf.to_container(self.hydra_context.config_loader.load_sweep_config(self.config, base).model, resolve=True)
        try:
            return parameter_count(model)
        except ValueError as error:
            raise ConfigError(f"study.tokens_per_parameter / study.held_out: {error} Set model.vocab_size.") from None

    @staticmethod
    def _with_budget(spec: StudySpec, base: list[str], n_params: int | None) -> list[str]:
        """A base job with its token budget from ``study.tokens_per_parameter`` (unless the
        command line sets one): that many tokens per parameter of the job's model."""
        if spec.tokens_per_parameter is None or "token_budget" in {override_key(o) for o in base}:
            return base
        return [*base, f"token_budget={round(spec.tokens_per_parameter * n_params)}"]

    @staticmethod
    def _held_out_base(spec: StudySpec, bases: list[list[str]]) -> int | None:
        """The base job of ``study.held_out`` (the one run with ``model=NAME``), which needs
        at least 3 other sizes to fit its settings and its loss on."""
        if spec.held_out is None:
            return None
        from analysis.ladder import MIN_SIZES

        models = [override_value(base, "model") for base in bases]
        if spec.held_out not in models:
            raise ConfigError(f"study.held_out={spec.held_out} is not one of the sizes this study runs"
                              f" (model={','.join(m for m in models if m) or '...'}); name one of them.")  # fmt: skip
        if len(set(models) - {spec.held_out}) < MIN_SIZES:
            raise ConfigError(f"study.held_out: the ladder has {len(set(models)) - 1} other size(s); fitting over N needs at"
                              f" least {MIN_SIZES}: add sizes to model=..., or drop study.held_out.")  # fmt: skip
        return models.index(spec.held_out)

    def _predict_held_out(self, study: StudyPlan, sweep_dir: Path, jobs: list[TunedJob]) -> None:
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
            predictions = write_prediction([sweep_dir], study.spec.held_out, study.sizes[study.held_out], settings=settings,
                                           seeds=len(study.spec.seeds))  # fmt: skip
        for p in predictions:
            log.info("held-out %s at %s: predicted %.4f (fit [%.4f, %.4f], prediction interval [%.4f, %.4f]) from %s on %s; runs with %s",
                     p.method, p.model, p.predicted, p.low, p.high, p.interval_low, p.interval_high, p.form, ", ".join(p.fitted_on),
                     " ".join(p.settings))  # fmt: skip

    def _check_arms(self, spec: StudySpec) -> None:
        """Parse every arm's overrides now, so a typo fails before the first job runs."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        for overrides in spec.arms.values():
            parser.parse_overrides(overrides)

    @staticmethod
    def _check_seed_cap(spec: StudySpec, sweep_dir: Path) -> None:
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
            raise ConfigError(f"study.seeds.max={spec.max_seeds} is below the {len(judged)} judging seeds this study already ran"
                              f" ({', '.join(sorted(judged, key=int))}); raise it to at least {len(judged)}.")  # fmt: skip

    def _check_search(self, study: StudyPlan) -> None:
        """Every searched setting must exist in its arm's config (composed without the search),
        so a misspelt key is one line before any job starts."""
        missing = object()
        for base, arm in study.searches:
            overrides = study.bases[base][0]
            overrides = [*overrides, *not_set_by(overrides, study.spec.arms[arm])]
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            for key in study.spec.spaces[arm].keys:
                if OmegaConf.select(cfg, key, default=missing) is missing:
                    raise ConfigError(
                        f"study.search: {key} is not a setting of arm {arm} (`python train.py --cfg job` lists the keys);"
                        " fix the key, or add the group that defines it to the arm's overrides."
                    )
