"""A checkpoint of this project, made ready to evaluate: model, tokenizer and data settings.

A checkpoint holds the data module's constructor arguments
(`datamodule_hyper_parameters`; for a sharded folder they are in its `meta.pt`), so the
tokenizer the model was trained with and the corpus it held out can be rebuilt from the
checkpoint alone, exactly as the data module builds them. `scripts/export_hf.py` reads
checkpoints through the same functions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.errors import CheckpointError
from data.datamodule import TextDataModule
from data.tokenizers import Tokenizer
from lightning_modules.hf_interop import CheckpointContents, read_lightning_checkpoint
from lightning_modules.llama import Llama
from lightning_modules.training_state import WEIGHTS_NOTE

DATA_SETTINGS = "datamodule_hyper_parameters"
# Where a checkpoint keeps the training clock: "training_state", or "training_knobs" in older ones.
CLOCK_HOLDERS = ("training_state", "training_knobs")


@dataclass(frozen=True)
class EvaluationCheckpoint:
    """What evaluating a checkpoint needs. `clock` holds the training progress it was saved
    at (steps, sequences, tokens), empty when the checkpoint has none."""

    path: Path
    model: Llama
    tokenizer: Tokenizer
    data_settings: dict[str, Any]
    clock: dict[str, int]


def load_checkpoint_for_evaluation(
    path: str | os.PathLike[str],
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
    allow_stale: bool = False,
) -> EvaluationCheckpoint:
    """The model (in eval mode, on `device`), tokenizer and data settings of a `.ckpt` file or
    a sharded checkpoint folder. `cache_dir` replaces the settings' cache folder (where the
    tokenizer of a `bpe` run and the evaluation tasks are kept), e.g. on another machine;
    `allow_stale` as in `read_checkpoint`."""
    path = Path(path)
    contents = read_checkpoint(path, allow_stale)
    data_settings = _data_settings(contents.metadata, path)
    if cache_dir is not None:
        data_settings["cache_dir"] = str(cache_dir)
    model, tokenizer = checkpoint_model(contents, device), tokenizer_from_settings(data_settings)
    return EvaluationCheckpoint(path, model, tokenizer, data_settings, _clock(contents.metadata))


def read_checkpoint(path: Path, allow_stale: bool = False) -> CheckpointContents:
    """The checkpoint's weights, config and other entries; a missing or foreign file is a
    `CheckpointError` (one line for the user) rather than a traceback, and so is one whose
    weights are not its run's final weights (a DiLoCo replica group that ended behind its
    peers: its ``weights_note``) unless `allow_stale`."""
    try:
        contents = read_lightning_checkpoint(path)
    except (FileNotFoundError, KeyError) as error:
        reason = error.args[0] if error.args else error
        raise CheckpointError(f"{reason}; pass a checkpoint written by train.py (its checkpoints/ folder)") from error
    note = contents.metadata.get(WEIGHTS_NOTE)
    if note is not None and not allow_stale:
        raise CheckpointError(
            f"{path} holds weights that are not its run's: {note}; pass --allow-stale-weights to use them anyway"
        )
    return contents


def checkpoint_model(contents: CheckpointContents, device: str | torch.device = "cpu") -> Llama:
    """The checkpoint's weights in a `Llama` in eval mode, built on the meta device, so no
    memory goes to a throwaway initialisation."""
    with torch.device("meta"):
        model = Llama(contents.config)
    model.load_state_dict(contents.state_dict, strict=True, assign=True)
    model.tie_weights()
    return model.to(device).eval()


def tokenizer_from_settings(data_settings: Mapping[str, Any]) -> Tokenizer:
    """The run's tokenizer, built by the data module from its settings (a `bpe` tokenizer is
    read from the cache, or trained again, identically, if the cache lost it)."""
    return TextDataModule(**data_settings).tokenizer


def _data_settings(metadata: Mapping[str, Any], path: Path) -> dict[str, Any]:
    settings = metadata.get(DATA_SETTINGS)
    if settings is None:
        raise CheckpointError(
            f"{path} holds no data settings ({DATA_SETTINGS}): it was written before checkpoints stored "
            "them, so its tokenizer and held-out corpus are unknown; evaluate a checkpoint written by the "
            "current train.py (resuming the run with ckpt_path=... writes one at its next save)"
        )
    return dict(settings)


def _clock(metadata: Mapping[str, Any]) -> dict[str, int]:
    for holder in CLOCK_HOLDERS:
        if isinstance(metadata.get(holder), Mapping) and "clock" in metadata[holder]:
            return dict(metadata[holder]["clock"])
    return {}
