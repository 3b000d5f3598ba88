"""The study sweeper: a study preset's arms x seeds as Hydra jobs.

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
"""

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import OmegaConf

from analysis.study import StudySpec
from common.errors import ConfigError


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def study_jobs(spec: StudySpec, base_jobs: list[list[str]]) -> list[list[str]]:
    """Each base job (the command line's) crossed with every arm (or the one it names) and seed."""
    jobs = []
    for base in base_jobs:
        chosen = [o.split("=", 1)[1] for o in base if _key(o) == "study.arm"]
        base = [o for o in base if _key(o) != "study.arm"]
        given = {_key(o) for o in base}
        for arm in chosen or spec.arms:
            if arm not in spec.arms:
                raise ConfigError(f"study.arm={arm} is not an arm of this study; its arms: {', '.join(spec.arms)}")
            kept = [o for o in spec.arms[arm] if _key(o) not in given]
            seeds = [None] if "seed" in given | {_key(o) for o in kept} else spec.seeds
            for seed in seeds:
                jobs.append([*base, *kept, f"study.arm={arm}", *([f"seed={seed}"] if seed is not None else [])])
    return jobs


class StudySweeper(BasicSweeper):
    """The basic sweeper, with each job crossed with the study's arms and seeds."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        spec = StudySpec.from_config(OmegaConf.to_container(self.config.get("study"), resolve=True))
        base = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        self._check_arms(spec)
        jobs = study_jobs(spec, base)
        size = max_batch_size or len(jobs)
        return [jobs[i : i + size] for i in range(0, len(jobs), size)]

    def _check_arms(self, spec: StudySpec) -> None:
        """Parse every arm's overrides now, so a typo fails before the first job runs."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        for overrides in spec.arms.values():
            parser.parse_overrides(overrides)
