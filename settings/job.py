"""The run-level keys of ``conf/train.yaml``: the seed, where training stops, where it starts."""

from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError
from settings.run_context import RunContext
from settings.section import Section

#: Strategies that read a distributed checkpoint (a folder of shards) back.
SHARDED_CHECKPOINTS = ("fsdp", "fsdp2")


@dataclass(frozen=True, kw_only=True)
class JobSettings(Section):
    """``seed``, ``token_budget``, ``collective_timeout_s``, ``ckpt_path``, ``init_from_hf``,
    ``experiment_name`` and ``experiment_note`` (documented where their defaults live, ``conf/train.yaml``)."""

    key = ""

    seed: int
    token_budget: int | None
    collective_timeout_s: float
    ckpt_path: str | None
    init_from_hf: str | None
    experiment_name: str
    experiment_note: str | None

    def check(self, run: RunContext) -> None:
        if self.token_budget is not None and self.token_budget <= 0:
            raise ConfigError(
                f"token_budget={self.token_budget} must be > 0 (or null to train until trainer.max_steps)."
            )
        if not self.collective_timeout_s > 0:
            raise ConfigError(
                f"collective_timeout_s={self.collective_timeout_s} must be > 0: the seconds a process waits in a"
                " collective for its peers before the run ends."
            )
        if self.token_budget is None and run.max_steps < 0:
            raise ConfigError("set token_budget or trainer.max_steps: with neither, training would never stop.")

    def check_services(self, run: RunContext) -> None:
        """The Hugging Face folder to start from exists (checked as the run starts, not with the
        settings alone: documented commands name placeholder folders)."""
        self._check_checkpoint_layout(run)
        folder = self.init_from_hf
        if folder and not (Path(folder) / "config.json").is_file():
            raise ConfigError(
                f"init_from_hf={folder}: {Path(folder) / 'config.json'} does not exist; give a local Hugging Face Llama"
                " folder (config.json and *.safetensors)."
            )

    def _check_checkpoint_layout(self, run: RunContext) -> None:
        """A distributed checkpoint is a folder of shards only the sharded strategies read back;
        Lightning's others would open the folder as a file."""
        if self.ckpt_path and Path(self.ckpt_path).is_dir() and run.strategy_name not in SHARDED_CHECKPOINTS:
            raise ConfigError(
                f"ckpt_path={self.ckpt_path} is a distributed checkpoint (a folder of shards), which"
                f" strategy={run.strategy_name} cannot read: resume with the strategy that wrote it (strategy=fsdp2, and"
                " its process count), or give a single-file .ckpt."
            )
