"""Resuming: refuse a checkpoint that cannot continue this run, before any data is read.

What cannot change on resume (the checkpoint's weights, optimizer state or data position
would not fit): the model's shape, the optimizer's kind, the packed sequence length, the
replicas of simulated DiLoCo, and the process count of real DiLoCo replicas. A
missing, unreadable or foreign checkpoint is refused too. Settings that may change (the
learning rate and its schedule, the token budget, the global batch without a batch-size
technique) are applied, each with one line in the log: see
``LlamaLightningModule.on_load_checkpoint`` and ``lightning_modules/resume_notes.py``.
"""

from pathlib import Path
from typing import Any

import torch

from common.errors import CheckpointError
from lightning_modules.llama_settings import LlamaSettings

SHAPE_FIELDS = ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "mlp_hidden", "tie_embeddings")


def checkpoint_metadata(path: str) -> dict[str, Any]:
    """Everything but the tensors of a ``.ckpt`` file or a distributed-checkpoint folder."""
    location = Path(path)
    file = location / "meta.pt" if location.is_dir() else location
    if not location.exists():
        raise CheckpointError(
            f"ckpt_path={path} does not exist; give a checkpoint a run wrote (its checkpoints/ folder)."
        )
    if location.is_dir() and not (location / ".metadata").is_file():
        raise CheckpointError(f"ckpt_path={path} is a folder but not a distributed checkpoint (no .metadata file).")
    try:
        checkpoint = torch.load(file, map_location="cpu", weights_only=False, mmap=not location.is_dir())
    except Exception as error:  # truncated, not a zip, not a pickle: any of them means unreadable
        raise CheckpointError(
            f"ckpt_path={path} is not a readable checkpoint ({type(error).__name__}: {error})."
        ) from None
    if not isinstance(checkpoint, dict) or "training_state" not in checkpoint:
        raise CheckpointError(f"ckpt_path={path} is not a checkpoint of this framework (it has no training state).")
    return checkpoint


def check_resume(
    path: str, model: LlamaSettings, seq_len: int, sequential_replicas: int, optimizer: str, world_size: int
) -> None:
    """Raise ``CheckpointError`` naming the setting that must match the checkpoint's run
    (``optimizer``: the kind of this run's optimizer, whose state the checkpoint must hold).

    The process count may change (the weights and optimizer state are resharded, the data
    continues at the checkpoint's sequence), except under real DiLoCo replicas, whose
    checkpoint holds one replica state per process."""
    checkpoint = checkpoint_metadata(path)
    replica_ranks = checkpoint.get("diloco_ranks")
    if replica_ranks is not None and len(replica_ranks) != world_size:
        raise CheckpointError(
            f"ckpt_path={path} holds the DiLoCo replica states of {len(replica_ranks)} processes, but this run has"
            f" {world_size}; resume real DiLoCo replicas on {len(replica_ranks)} processes (trainer.devices x trainer.num_nodes)."
        )
    saved = checkpoint.get("hyper_parameters", {})
    saved_optimizer = saved.get("optimizer", {}).get("kind", "adamw")  # checkpoints before the optimizer group: AdamW
    if saved_optimizer != optimizer:
        raise CheckpointError(_mismatch(path, "optimizer", saved_optimizer, optimizer))
    for field in SHAPE_FIELDS:
        before, now = saved.get("model", {}).get(field), getattr(model, field)
        if before != now:
            raise CheckpointError(_mismatch(path, f"model.{field}", before, now))
    saved_seq_len = checkpoint.get("datamodule_hyper_parameters", {}).get("seq_len")
    if saved_seq_len != seq_len:
        raise CheckpointError(_mismatch(path, "data.seq_len", saved_seq_len, seq_len))
    saved_replicas = saved.get("sequential_replicas", 1)
    if saved_replicas != sequential_replicas:
        raise CheckpointError(
            _mismatch(path, "technique.diloco.replicas (simulated)", saved_replicas, sequential_replicas)
        )


def _mismatch(path: str, setting: str, before: Any, now: Any) -> str:
    return (
        f"ckpt_path={path} was trained with {setting}={before}, but this run has {setting}={now};"
        f" resume with {setting}={before}, or start a new run without ckpt_path."
    )
