"""A plain study's jobs: each of the command line's jobs crossed with the arms and seeds.

Every job gets, after the command line's own overrides, its arm's overrides, ``study.arm=NAME``
and ``seed=S``; jobs are numbered arm by arm, seed by seed, so the same command always gives
a job the same folder (which is what lets a sweep resume). The command line wins over the
study: an arm's override of a key the command line also sets is dropped, and ``seed=...`` on
the command line replaces the study's seeds. An arm that sets ``seed=...`` itself runs once,
with that seed (branches of one seed's run). ``study.arm=A,B`` on the command line runs only
those arms, with the same overrides as in the whole study, so more seeds of a study's best
arms, run into another folder, group with its runs in the report.
"""

from pathlib import Path

from analysis.runs import recorded_overrides
from common.errors import ConfigError
from common.overrides import not_set_by, override_key
from launch.sweep_jobs import MARKER
from study.preset import StudySpec


def chosen_arms(spec: StudySpec, base: list[str]) -> tuple[list[str], list[str]]:
    """The arms a base job runs (``study.arm=A`` on the command line, else all) and the base
    job without that override."""
    chosen = [o.split("=", 1)[1] for o in base if override_key(o) == "study.arm"]
    for arm in chosen:
        if arm not in spec.arms:
            raise ConfigError(f"study.arm={arm} is not an arm of this study; its arms: {', '.join(spec.arms)}")
    return chosen or list(spec.arms), [o for o in base if override_key(o) != "study.arm"]


def study_jobs(spec: StudySpec, base_jobs: list[list[str]]) -> list[list[str]]:
    """Each base job (the command line's) crossed with every arm (or the one it names) and seed."""
    jobs = []
    for base in base_jobs:
        arms, base = chosen_arms(spec, base)
        for arm in arms:
            kept = not_set_by(base, spec.arms[arm])
            seeds = [None] if "seed" in {override_key(o) for o in [*base, *kept]} else spec.seeds
            for seed in seeds:
                jobs.append([*base, *kept, f"study.arm={arm}", *([f"seed={seed}"] if seed is not None else [])])
    return jobs


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
