"""Every setting has one home: only the settings reader reads the composed config, every
setting's check lives on its section's class, and each check phase reaches every section."""

import ast
import dataclasses
from pathlib import Path

from launch.from_config import read_settings
from settings.section import Section
from tests.run_helpers import REPO, TINY, compose_config

PRODUCT = [path for path in REPO.rglob("*.py") if path.relative_to(REPO).parts[0] not in ("tests", "outputs", "build")]

#: Modules that may read the composed DictConfig: the settings reader, the entry point and its
#: error path (which composes the config again to suggest a misspelt key), and the Hydra
#: sweeper, which Hydra hands the config.
CONFIG_READERS = {
    "launch/from_config.py",
    "train.py",
    "launch/cli.py",
    "hydra_plugins/study_sweeper/study_sweeper.py",
}

#: Modules that may raise ConfigError, and why. Settings are checked by their section's class;
#: the rest report what they find while running (data, other groups, a sweep's folders) or
#: check a script's or a study's own arguments.
CONFIG_ERROR_RAISERS = {
    # the sections' classes and the settings package
    "settings/typed.py": "keys and types of every section",
    "launch/run_settings.py": "the tree: at most one technique sets the batch",
    "settings/job.py": "section: token_budget, init_from_hf",
    "settings/strategy.py": "section: strategy",
    "settings/trainer.py": "section: trainer",
    "lightning_modules/llama_settings.py": "section: model",
    "lightning_modules/global_batch.py": "section: batch (and the batch arithmetic it implies)",
    "lightning_modules/lr_schedule.py": "section: lr_schedule",
    "lightning_modules/layout_settings.py": "section: layout (float8, kernels, the memory plan)",
    "lightning_modules/memory_plan.py": "the layout section's memory plan: what does not fit",
    "lightning_modules/optimizers/settings.py": "section: optimizer",
    "lightning_modules/optimizers/muon_settings.py": "section: optimizer=muon",
    "callbacks/technique.py": "the techniques' shared refusal of tensor parallelism",
    "callbacks/batch_size/adaptive_settings.py": "section: technique.adaptive_batch",
    "callbacks/batch_size/schedules.py": "section: the batch schedules",
    "callbacks/batch_size/seesaw.py": "section: technique.seesaw",
    "callbacks/batch_size/lr_scaling.py": "the batch techniques' shared lr_scaling setting",
    "callbacks/seq_len_warmup/settings.py": "section: technique.seq_len_warmup",
    "callbacks/diloco/settings.py": "section: technique.diloco",
    # instantiated sections, checked by the class they build as it is built (before any work)
    "data/config_checks.py": "data: sources' and tokenizers' settings",
    "data/datamodule.py": "data: the data module's settings and the rows found",
    "data/sources.py": "data: a source's settings",
    "data/mixture.py": "data: a mixture's settings",
    "data/tokenizers.py": "data: a tokenizer's settings",
    "data/token_files.py": "data: token files found while reading",
    "data/file_paths.py": "data: files found while reading",
    "evaluation/corpus_cloze.py": "evaluation: its settings and the tasks found",
    "evaluation/lm_adapter.py": "evaluation: lm-eval's arguments",
    "launch/builders.py": "a built class's refusal of its arguments, kept as one line",
    # found while running
    "callbacks/diloco/torchft_group.py": "another replica group's settings, found in a quorum",
    "launch/sweep_jobs.py": "a sweep folder written by another command",
    "lightning_modules/hf_interop.py": "a Hugging Face folder's contents",
    # a study's and a script's own settings
    "study/preset.py": "a study preset",
    "study/search_space.py": "a study preset's search",
    "study/search_record.py": "a recorded search",
    "study/jobs.py": "a study's arms on the command line, a sweep folder of other runs",
    "study/tuned_sweep.py": "a tuned study's preset against the composed configs and its folder",
    "study/setting_laws.py": "a ladder's held-out size with too few searched sizes to fit",
    "study/archive.py": "a study archive against the sweep folder it is saved from or restored into",
    "analysis/critical_batch.py": "the critical-batch analysis' arguments",
    "analysis/ladder.py": "the scaling ladder's arguments",
    "scripts/critical_batch.py": "the script's arguments",
    "scripts/evaluate.py": "the script's arguments",
    "scripts/ladder.py": "the script's arguments",
    "scripts/prepare_data.py": "the script's arguments",
}


def _imports_or_names(path: Path, module: str, name: str) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(alias.name.split(".")[0] == module for alias in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == module:
            return True
        if isinstance(node, ast.Name) and node.id == name:
            return True
    return False


def _raises_config_error(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ConfigError":
            return True
    return False


def _relative(paths) -> set[str]:
    return {path.relative_to(REPO).as_posix() for path in paths}


def test_only_the_settings_reader_and_the_entry_points_read_the_composed_config() -> None:
    readers = _relative(path for path in PRODUCT if _imports_or_names(path, "omegaconf", "DictConfig"))
    assert readers == CONFIG_READERS


def test_every_module_that_raises_config_error_is_a_section_or_says_why() -> None:
    raisers = _relative(path for path in PRODUCT if _raises_config_error(path)) - {"common/errors.py"}
    assert raisers == set(CONFIG_ERROR_RAISERS)


def test_each_check_phase_reaches_every_section_of_the_tree(tmp_path, monkeypatch) -> None:
    """A section left out of ``sections()`` would never be checked: every section field of the
    tree, and every technique, is in it, and both phases call each of them."""
    settings = read_settings(compose_config([*TINY, "+technique=seq_len_warmup"], tmp_path), processes=1)
    fields = [getattr(settings, field.name) for field in dataclasses.fields(settings)]
    expected = [value for value in fields if isinstance(value, Section)] + list(settings.techniques.values())
    assert sorted(map(id, settings.sections())) == sorted(map(id, expected))
    called: list[tuple[str, type]] = []
    for section in expected:
        for phase in ("check", "check_services"):
            monkeypatch.setattr(type(section), phase, lambda self, run, phase=phase: called.append((phase, type(self))))
    settings.check()
    settings.check_services(lambda: 256)
    for phase in ("check", "check_services"):
        assert sorted(cls.__name__ for name, cls in called if name == phase) == sorted(
            type(s).__name__ for s in expected
        )
