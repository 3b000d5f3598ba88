"""Every `python train.py` and `python scripts/...` command in the README and docs/ works as written.

Each train.py command is composed as Hydra composes it (a multirun's every job, a sweep
preset's parameters, launchers such as SLURM included) and goes through the config checks
of train.py with the process count it states; GPU and cluster commands are checked that
way without being run. Each script command's arguments go through the script's own
parser. The README's CPU-sized train.py commands are also run, stopped after two steps
(not those that need a service, such as a torchft lighthouse).
"""

import importlib.util
import itertools
import re
import shlex
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from launch.from_config import read_settings
from tests.run_helpers import REPO, run_train, train_in_process

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PARSER = OverridesParser.create()
# Stand-ins for what a reader fills in: a run's time stamp, a folder of their own.
PLACEHOLDERS = {
    "<time>": "2026-01-01_00-00-00",
    "<tokenizer>": "/path/to/tokenizer",
    "<a 32k tokenizer>": "/path/to/tokenizer",
}
HYDRA_FLAGS = {"-m", "--multirun"}


def commands() -> list[tuple[str, str]]:
    """(where, command) for every python train.py / python scripts/ command in a bash block; a
    torchrun command's train.py arguments are checked as python train.py's."""
    found = []
    for document in DOCUMENTS:
        for block in re.findall(r"```bash\n(.*?)```", document.read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                for part in line.split("&&"):
                    command = part.split(" #")[0].strip()
                    for name, value in PLACEHOLDERS.items():
                        command = command.replace(name, value)
                    where = f"{document.relative_to(REPO)}: {command}"
                    if command.startswith("torchrun ") and " train.py" in command:  # checked as train.py's
                        command = "python train.py" + command.split(" train.py", 1)[1]
                    if command.startswith(("python train.py", "python scripts/")):
                        found.append((where, command))
    return found


COMMANDS = commands()


def test_the_docs_hold_commands():
    assert sum(c.startswith("python train.py") for _, c in COMMANDS) >= 30
    assert sum(c.startswith("python scripts/") for _, c in COMMANDS) >= 10


def compose_jobs(overrides: list[str]) -> list:
    """The composed config of every job the command would run (one without -m)."""
    multirun = any(flag in overrides for flag in HYDRA_FLAGS)
    arguments = [
        o for o in overrides if o not in HYDRA_FLAGS and not o.startswith("--cfg") and o not in ("job", "hydra")
    ]
    parsed = PARSER.parse_overrides(arguments)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        fixed = [o.input_line for o in parsed if not (multirun and o.is_sweep_override())]
        base = compose("train", overrides=fixed, return_hydra_config=True)
        # The basic sweeper's parameters are lists to cross; others (Optuna) search ranges,
        # whose jobs tests/test_sweeps.py composes at both ends of each range.
        basic = str(base.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper")
        params = base.hydra.sweeper.get("params") if multirun and basic else None
        params = OmegaConf.to_container(params) if params else {}
        axes = []
        for override in parsed:
            key = override.get_key_element()
            values = list(override.sweep_string_iterator()) if multirun and override.is_sweep_override() else None
            axes.append([f"{key}={v}" for v in values] if values else [override.input_line])
        axes += [
            [f"{key}={v}" for v in str(value).split(",")]
            for key, value in params.items()
            if not any(o.get_key_element() == key for o in parsed)
        ]
        return [compose("train", overrides=list(job), return_hydra_config=True) for job in itertools.product(*axes)]


@pytest.mark.parametrize(
    ("where", "command"),
    [c for c in COMMANDS if c[1].startswith("python train.py")],
    ids=lambda value: value[:90] if isinstance(value, str) else None,
)
def test_train_command_composes_and_passes_the_checks(where, command):
    for cfg in compose_jobs(shlex.split(command)[2:]):
        read_settings(cfg, processes=read_settings(cfg).trainer.stated_processes() or 1)


def script_module(path: Path):
    name = f"documented_script_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the script loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("where", "command"),
    [c for c in COMMANDS if c[1].startswith("python scripts/")],
    ids=lambda value: value[:90] if isinstance(value, str) else None,
)
def test_script_command_parses(where, command):
    words = shlex.split(command)
    script = REPO / words[1]
    assert script.is_file(), f"{where}: no such script"
    arguments = words[2:]
    if "--" in arguments:  # train.py overrides passed through: they must compose too
        arguments, overrides = arguments[: arguments.index("--")], arguments[arguments.index("--") + 1 :]
        compose_jobs(overrides)
    script_module(script).parse_args(arguments)


CPU_SIZED = sorted(
    {
        command
        for where, command in COMMANDS
        if where.startswith("README.md")
        and command.startswith("python train.py")
        and not re.search(
            r"trainer=gpu|hydra/launcher|-m |--cfg|ckpt_path=|init_from_hf=|model=(?!tiny)|devices=[3-9]|data=hub|backend=torchft",
            command,
        )
    }
)
# Stopped after 2 optimizer steps (1 global step of 2 simulated replicas), with a short validation.
SHORT = ["trainer.max_steps=2", "trainer.num_sanity_val_steps=0", "data.val_max_rows=16", "logger=csv"]


@pytest.mark.parametrize("command", CPU_SIZED)
def test_readme_cpu_command_trains(command, tmp_path, tmp_path_factory):
    """The README's CPU commands as pasted, stopped early: in this process, or as processes
    of their own where they start several."""
    overrides, cache = shlex.split(command)[2:] + SHORT, tmp_path_factory.getbasetemp() / "cache"
    if "trainer.devices=2" in command:
        result = run_train(overrides, tmp_path / "run", cache)
        code, stderr = result.returncode, result.stderr
    else:
        code, stderr = train_in_process(overrides, tmp_path / "run", cache)
    assert code == 0, stderr[-3000:]
