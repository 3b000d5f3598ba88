"""The study sweeper: Hydra's adapter to the study package (``study/``).

Hydra finds sweepers only in the ``hydra_plugins`` namespace, hence this folder. A study
preset selects it (``override /hydra/sweeper: study``) and declares ``study.arms`` and
``study.seeds`` (``study/preset.py``). A plain study's jobs are the command line's jobs
(swept ones expanded as the basic sweeper does) crossed with the arms and seeds
(``study/jobs.py``), numbered by position; a folder that holds a finished run of other
overrides stops the sweep before any job starts. A tuned study runs in rounds
(``study/tuned_sweep.py``). This module only connects them to Hydra: it reads the preset
from the composed config, composes a job's config, and launches jobs.

Hydra imports every plugin module in every run, a plain one too, as it scans for plugins: the
study package (scipy, optuna: about half a second) is imported only when a study runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.utils import JobReturn
from omegaconf import OmegaConf

if TYPE_CHECKING:
    from study.preset import StudySpec


class StudySweeper(BasicSweeper):
    """The basic sweeper, with each job crossed with the study's arms and seeds; a tuned
    study runs in rounds."""

    def __init__(self, max_batch_size: int | None = None, params: dict[str, str] | None = None) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)

    def _spec(self) -> StudySpec:
        from study.preset import StudySpec

        return StudySpec.from_config(OmegaConf.to_container(self.config.get("study"), resolve=True))

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        from study.jobs import refuse_other_runs, study_jobs
        from study.tuned_sweep import check_arms

        spec = self._spec()
        base = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        check_arms(spec, self)
        jobs = study_jobs(spec, base)
        refuse_other_runs(Path(self.config.hydra.sweep.dir), jobs)
        size = max_batch_size or len(jobs)
        return [jobs[i : i + size] for i in range(0, len(jobs), size)]

    def sweep(self, arguments: list[str]) -> Any:
        spec = self._spec()
        if not spec.tuned:
            return super().sweep(arguments)
        from study.tuned_sweep import run_tuned_study

        sweep_dir = Path(self.config.hydra.sweep.dir)
        return run_tuned_study(spec, self._base_jobs(arguments), sweep_dir, self, self._launch, self._save_config)

    # ---------------------------------------------------------------- study.tuned_sweep.JobConfigs
    def model(self, overrides: list[str]) -> dict[str, Any]:
        return OmegaConf.to_container(self._compose(overrides).model, resolve=True)

    def has_setting(self, overrides: list[str], key: str) -> bool:
        missing = object()
        return OmegaConf.select(self._compose(overrides), key, default=missing) is not missing

    def parse(self, overrides: list[str]) -> None:
        OverridesParser.create(config_loader=self.hydra_context.config_loader).parse_overrides(overrides)

    # ---------------------------------------------------------------- Hydra
    def _save_config(self, sweep_dir: Path) -> None:
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")

    def _compose(self, overrides: list[str]) -> Any:
        return self.hydra_context.config_loader.load_sweep_config(self.config, overrides)

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
