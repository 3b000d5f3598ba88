"""Shared helpers for tests that train: tiny settings, Hydra composition, runs in a subprocess or in this process."""

import contextlib
import csv
import io
import os
import runpy
import subprocess
import sys
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from benchmarks.memory_logger import MemoryLogger  # noqa: F401 - tests import it from here
from benchmarks.tiny_run import TINY_RUN
from data.datamodule import TextDataModule
from launch.builders import build_callbacks, build_datamodule, build_module, build_trainer
from launch.from_config import read_settings
from lightning_modules.global_batch import BatchSettings, GlobalBatch
from lightning_modules.layout_settings import LayoutSettings
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.training_state import TrainingState
from settings.typed import settings_from_config

REPO = Path(__file__).resolve().parents[1]

# A model and corpus small enough that a few optimizer steps take about a second on CPU.
TINY = [*TINY_RUN, "batch.micro_batch_size=2", "batch.global_batch_size=8", "token_budget=100000"]

# Frequent validation and checkpoints, CSV logs: for runs whose outputs a test reads.
OBSERVED = [
    "callbacks.validation_schedule.every_n_steps=3",
    "callbacks.model_checkpoint.every_n_train_steps=2",
    "logger=csv",
]


def compose_config(overrides: list[str], tmp_path: Path):
    """The composed train config, with outputs and caches under tmp_path."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(
            "train",
            overrides=[
                f"paths.root_dir={tmp_path}",
                f"paths.run_dir={tmp_path / 'run'}",
                f"paths.cache_dir={tmp_path.parent / 'shared_cache'}",
            ]
            + overrides,
            return_hydra_config=False,
        )


def datamodule(tmp_path: Path, source: dict | None, **overrides) -> TextDataModule:
    """A byte-level data module over ``source`` (or ``mixture=...``) with its cache under
    ``tmp_path``: 16-token rows, a quarter of the documents for validation."""
    settings = dict(
        tokenizer={"kind": "byte"},
        seq_len=16,
        micro_batch_size=2,
        val_fraction=0.25,
        val_max_rows=None,
        shuffle=True,
        seed=0,
    )
    settings.update(overrides)
    return TextDataModule(source=source, cache_dir=str(tmp_path / "cache"), **settings)


def run_train(overrides: list[str], run_dir: Path, cache_dir: Path, timeout: int = 300, **popen):
    """Run train.py in a subprocess (as a user would) and return the finished process."""
    # One thread per process: the tiny test models gain nothing from more, and 2-process
    # runs would otherwise oversubscribe a 2-core machine.
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache_dir}"]
    return subprocess.run(
        command + overrides, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **popen
    )


def run_sweep(study: list[str], folder: Path, cache_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """One `train.py -m` of a study preset into ``folder`` (the command a worker runs)."""
    return run_train([*study, f"hydra.sweep.dir={folder}", *extra], folder.parent / "unused", cache_dir)


def tiny_study(preset: str, *, searched: tuple[str, ...] = ("optimizer.lr=", "token_budget=")) -> list[str]:
    """A study preset of tests/configs on the tiny settings, 1,536 tokens a job and a checkpoint
    every 2 steps; the tiny settings the preset sets itself (``searched``) are left out, since
    the command line would win over them."""
    return [
        "hydra.mode=MULTIRUN",
        f"hydra.searchpath=[file://{REPO / 'tests' / 'configs'}]",
        f"+sweep={preset}",
        *(o for o in TINY if not o.startswith(searched)),
        "token_budget=1536",
        "callbacks.model_checkpoint.every_n_train_steps=2",
    ]


def finished_study(study: list[str], tmp_path_factory, name: str) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """A study run to its end (a module fixture's, whose tests read its jobs): its sweep folder,
    the session's data cache and the command's result."""
    folder, cache = tmp_path_factory.mktemp(name) / "sweep", tmp_path_factory.getbasetemp() / "cache"
    result = run_sweep(study, folder, cache)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, cache, result


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """Model weights of a single-file Lightning checkpoint."""
    state = torch.load(path, map_location="cpu", weights_only=False)["state_dict"]
    return {key: value for key, value in state.items() if key.startswith("model.")}


def default_settings(cls: type, key: str, **overrides):
    """A settings section of conf/train.yaml (where the defaults live), with overrides."""
    node = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "train.yaml")[key])
    return settings_from_config(cls, {**node, **overrides}, key)


SMALL_MODEL = LlamaSettings(vocab_size=256, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, mlp_hidden=128)


def training_state(
    global_batch: int = 8,
    micro: int = 2,
    ranks: int = 1,
    cap: int | None = None,
    replicas: int = 1,
    budget: int | None = None,
    checkpointing: str = "none",
    log_every_n_steps: int = 1,
) -> TrainingState:
    """The real training state, as the training module builds it, for callbacks tested alone."""
    batch = BatchSettings(
        global_batch_size=global_batch, micro_batch_size=micro, max_micro_batch_size=micro, max_global_batch_size=cap
    )
    layout = default_settings(LayoutSettings, "layout", activation_checkpointing=checkpointing)
    state = TrainingState(GlobalBatch(batch, micro, ranks, replicas), budget, SMALL_MODEL, layout, log_every_n_steps)
    state.gradient_group_size = ranks
    return state


def fit_in_process(cfg, callbacks: list | None = None, loggers: list | None = None, datamodule_hook=None):
    """Build a run from a composed config as train.py does, and fit it in this process."""
    settings = read_settings(cfg, processes=1)
    L.seed_everything(cfg.seed, verbose=False)
    datamodule = build_datamodule(settings)
    if datamodule_hook is not None:
        datamodule_hook(datamodule)
    module = build_module(settings, datamodule.vocab_size)
    trainer = build_trainer(settings, list(loggers or []), build_callbacks(settings) + list(callbacks or []))
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    return module, trainer


def run_script(script: Path, arguments: list[str]) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGUMENTS` run in this process: its exit code, stdout and stderr as a
    subprocess would give them, without the seconds a new process spends importing torch and
    Lightning. For checks of what a script does, not of its process (signals, several ranks)."""
    out, errors, saved = io.StringIO(), io.StringIO(), sys.argv
    sys.argv, code = [str(script), *arguments], 0
    try:
        with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(errors):
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # sys.exit("message") prints it and exits 1
            errors.write(exit_.code + "\n")
        code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        sys.argv = saved
    return subprocess.CompletedProcess(
        [sys.executable, str(script), *arguments], code, out.getvalue(), errors.getvalue()
    )


def train_in_process(arguments: list[str], run_dir: Path, cache: Path) -> tuple[int, str]:
    """Exit code and stderr of `python train.py ARGUMENTS` (0 when it returns normally)."""
    result = run_script(REPO / "train.py", [f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache}", *arguments])
    return result.returncode, result.stderr


def run_to_completion(arguments: list[str], run_dir: Path, cache: Path) -> None:
    """`python train.py ARGUMENTS`, which must exit 0. A one-process run on the default strategy
    that does not resume trains in this process: as a subprocess, about nine tenths of its time
    would go to starting Python and importing Lightning. Runs of several processes or another
    strategy, and resumes (which must not find the first run's state in memory), get their own."""
    several = any(argument.startswith("trainer.devices=") and argument != "trainer.devices=1" for argument in arguments)
    if several or any(argument.startswith(("strategy=", "ckpt_path=")) for argument in arguments):
        result = run_train(arguments, run_dir, cache)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    else:
        code, stderr = train_in_process(arguments, run_dir, cache)
        assert code == 0, stderr[-3000:]


def export_matches_checkpoint(checkpoint: Path, export_dir: Path) -> tuple[LlamaSettings, dict[str, torch.Tensor]]:
    """Run scripts/export_hf.py on ``checkpoint``; transformers' logits on the export must be the
    framework's on the checkpoint's whole weights (1e-4). Returns those config and weights."""
    import transformers

    from lightning_modules.hf_interop import load_lightning_checkpoint
    from lightning_modules.llama import Llama

    result = run_script(REPO / "scripts" / "export_hf.py", [str(checkpoint), str(export_dir)])
    assert result.returncode == 0, result.stderr[-2000:]
    config, state_dict = load_lightning_checkpoint(checkpoint)
    trained = Llama(config).eval()
    trained.load_state_dict(state_dict)
    hf = transformers.LlamaForCausalLM.from_pretrained(export_dir, attn_implementation="eager").eval()
    tokens = torch.randint(0, config.vocab_size, (2, 16))
    with torch.no_grad():
        assert (hf(input_ids=tokens).logits - trained(tokens)).abs().max() < 1e-4
    return config, state_dict


def train_losses(run_dir: Path) -> dict[int, float]:
    """train/loss by optimizer step, from a run's CSV log (``logger=csv``)."""
    with open(run_dir / "csv" / "metrics.csv") as file:
        return {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(file) if row.get("train/loss")}
