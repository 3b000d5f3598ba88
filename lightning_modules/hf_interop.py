"""Conversion between this project's Llama and Hugging Face ``LlamaForCausalLM``.

The two models compute the same function (same rotary convention, same norm order), so a
checkpoint converts by renaming keys only. Reading and writing Hugging Face folders needs only
``safetensors`` and ``json``; ``transformers`` is never imported here, so exporting works on
machines without it.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from common.errors import CheckpointError, ConfigError
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings

# Written into config.json; only a hint for inference tools, since rotary embeddings have no
# length limit here. 4096 is Llama-2's training context.
DEFAULT_MAX_POSITION_EMBEDDINGS = 4096

_TOP_LEVEL_TO_HF = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_PER_LAYER_TO_HF = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.q_proj.weight": "self_attn.q_proj.weight",
    "attention.k_proj.weight": "self_attn.k_proj.weight",
    "attention.v_proj.weight": "self_attn.v_proj.weight",
    "attention.o_proj.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
_TOP_LEVEL_FROM_HF = {hf: ours for ours, hf in _TOP_LEVEL_TO_HF.items()}
_PER_LAYER_FROM_HF = {hf: ours for ours, hf in _PER_LAYER_TO_HF.items()}
_OUR_LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)")
_HF_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+)")
# Older transformers versions saved the rotary frequencies as a buffer; they are recomputed.
_IGNORED_HF_SUFFIX = "rotary_emb.inv_freq"
# Wrappers that insert themselves into parameter names (torch.compile, activation checkpointing).
_WRAPPER_NAME_PARTS = ("_orig_mod.", "_checkpoint_wrapped_module.")


@dataclass(frozen=True)
class TokenizerIds:
    """What an exported model's configs must know of its tokenizer.

    ``vocab_size`` is the number of ids the tokenizer produces: the model's embedding has
    more rows (rounded up to a multiple of 64 for fast matmuls), and the rows beyond are no
    token, so generation must never pick them. Training packs documents separated by the
    end-of-document token only, so ``eos_id`` is what ends a generated document.
    """

    vocab_size: int
    eos_id: int
    bos_id: int
    pad_id: int

    def config_entries(self) -> dict[str, int]:
        """The special-token ids as transformers' config keys name them."""
        return {"bos_token_id": self.bos_id, "eos_token_id": self.eos_id, "pad_token_id": self.pad_id}


def to_hf_config_dict(
    config: LlamaSettings,
    max_position_embeddings: int = DEFAULT_MAX_POSITION_EMBEDDINGS,
    torch_dtype: str = "float32",
    tokenizer_ids: TokenizerIds | None = None,
) -> dict[str, Any]:
    """A Hugging Face ``config.json`` dict describing ``config``, with the special-token ids
    when ``tokenizer_ids`` is given.

    ``rope_theta`` is written at the top level, which both transformers 4.x and 5.x read.
    """
    if config.vocab_size is None:
        raise ValueError("LlamaSettings.vocab_size is None; fill it in from the tokenizer before exporting.")
    special = tokenizer_ids.config_entries() if tokenizer_ids is not None else {}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.d_model,
        "intermediate_size": config.mlp_hidden,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": float(config.rope_theta),
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": max_position_embeddings,
        "initializer_range": config.init_std,
        "hidden_act": "silu",
        "torch_dtype": torch_dtype,
        "attention_bias": False,
        "mlp_bias": False,
        **special,
    }


def to_hf_generation_config_dict(config: LlamaSettings, tokenizer_ids: TokenizerIds) -> dict[str, Any]:
    """A ``generation_config.json`` dict: ``generate()`` stops at the end-of-document token and
    never emits the padded embedding rows (``suppress_tokens`` sets their logits to -inf)."""
    padded_ids = list(range(tokenizer_ids.vocab_size, config.vocab_size or 0))
    return {**tokenizer_ids.config_entries(), **({"suppress_tokens": padded_ids} if padded_ids else {})}


def _reject_unsupported_hf_features(d: Mapping[str, Any]) -> None:
    """Fail loudly on Hugging Face options this model does not implement, rather than
    loading weights into a model that computes something else."""
    if d.get("model_type", "llama") != "llama":
        raise ValueError(f"Only model_type 'llama' is supported, got {d['model_type']!r}.")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Only hidden_act 'silu' (SwiGLU) is supported, got {d['hidden_act']!r}.")
    for flag in ("attention_bias", "mlp_bias"):
        if d.get(flag):
            raise ValueError(f"{flag}=true is not supported: this Llama has no biases.")
    if d.get("rope_scaling"):
        raise ValueError(f"rope_scaling {d['rope_scaling']!r} is not supported; only plain rotary embeddings are.")
    rope_type = (d.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"rope_parameters.rope_type {rope_type!r} is not supported; only 'default' is.")
    head_dim = d.get("head_dim")
    if head_dim is not None and head_dim * d["num_attention_heads"] != d["hidden_size"]:
        raise ValueError(
            f"head_dim {head_dim} * num_attention_heads != hidden_size; this Llama requires "
            "head_dim = hidden_size / num_attention_heads."
        )


def from_hf_config_dict(d: Mapping[str, Any]) -> LlamaSettings:
    """Our config from a Hugging Face Llama ``config.json`` dict (transformers 4.x or 5.x).

    Missing optional keys take transformers' ``LlamaConfig`` defaults.
    """
    _reject_unsupported_hf_features(d)
    rope_theta = d.get("rope_theta", (d.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    return LlamaSettings(
        name=str(d.get("_name_or_path") or "hf_llama"),
        vocab_size=d["vocab_size"],
        n_layers=d["num_hidden_layers"],
        d_model=d["hidden_size"],
        n_heads=d["num_attention_heads"],
        n_kv_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
        mlp_hidden=d["intermediate_size"],
        rope_theta=float(rope_theta),
        norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),
        init_std=float(d.get("initializer_range", 0.02)),
    )


def _rename(
    key: str,
    top_level: Mapping[str, str],
    per_layer: Mapping[str, str],
    layer_key: re.Pattern[str],
    layer_prefix: str,
) -> str | None:
    """Translate one key with the given tables; None when the key is not recognised."""
    if key in top_level:
        return top_level[key]
    match = layer_key.fullmatch(key)
    if match and match.group(2) in per_layer:
        return f"{layer_prefix}{match.group(1)}.{per_layer[match.group(2)]}"
    return None


def _raise_on_unknown(unknown: list[str], source: str) -> None:
    if unknown:
        raise KeyError(f"Unknown {source} state-dict keys (no mapping): {sorted(unknown)}")


def _rename_all(
    state_dict: Mapping[str, torch.Tensor], direction: tuple, source: str, skip_suffix: str | None = None
) -> dict[str, torch.Tensor]:
    """Rename every key with one direction's tables; unknown keys are an error listing them all."""
    renamed, unknown = {}, []
    for key, tensor in state_dict.items():
        if skip_suffix is not None and key.endswith(skip_suffix):
            continue
        new_key = _rename(key, *direction)
        if new_key is None:
            unknown.append(key)
        else:
            renamed[new_key] = tensor
    _raise_on_unknown(unknown, source)
    return renamed


def to_hf_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename our model's keys to Hugging Face ``LlamaForCausalLM`` keys (tensors untouched)."""
    return _rename_all(state_dict, (_TOP_LEVEL_TO_HF, _PER_LAYER_TO_HF, _OUR_LAYER_KEY, "model.layers."), "model")


def from_hf_state_dict(hf_state_dict: Mapping[str, torch.Tensor], config: LlamaSettings) -> dict[str, torch.Tensor]:
    """Rename Hugging Face keys to ours; fill in ``output.weight`` for tied embeddings, whose
    Hugging Face files usually omit ``lm_head.weight``. Checks that every weight is present."""
    direction = (_TOP_LEVEL_FROM_HF, _PER_LAYER_FROM_HF, _HF_LAYER_KEY, "layers.")
    ours = _rename_all(hf_state_dict, direction, "Hugging Face", skip_suffix=_IGNORED_HF_SUFFIX)
    if config.tie_embeddings and "output.weight" not in ours and "tok_embeddings.weight" in ours:
        ours["output.weight"] = ours["tok_embeddings.weight"]
    _check_complete(ours, config)
    return ours


def _expected_keys(config: LlamaSettings) -> set[str]:
    layer_keys = {f"layers.{i}.{suffix}" for i in range(config.n_layers) for suffix in _PER_LAYER_TO_HF}
    return layer_keys | set(_TOP_LEVEL_TO_HF)


def _check_complete(state_dict: Mapping[str, torch.Tensor], config: LlamaSettings) -> None:
    """Missing or surplus layers mean the config and the weights disagree."""
    expected = _expected_keys(config)
    missing, surplus = expected - state_dict.keys(), state_dict.keys() - expected
    if missing or surplus:
        raise KeyError(
            f"Weights do not match the config ({config.n_layers} layers, tie_embeddings="
            f"{config.tie_embeddings}): missing {sorted(missing)}, unexpected {sorted(surplus)}"
        )


def save_hf_pretrained(
    model: Llama,
    out_dir: str | Path,
    max_position_embeddings: int = DEFAULT_MAX_POSITION_EMBEDDINGS,
    tokenizer_ids: TokenizerIds | None = None,
) -> None:
    """Write ``config.json`` and ``model.safetensors`` loadable by ``LlamaForCausalLM.from_pretrained``,
    and with ``tokenizer_ids`` also ``generation_config.json`` (the tokenizer files themselves
    are written by ``data.tokenizer_export``).

    Tied embeddings are stored once (as ``model.embed_tokens.weight``), the way Hugging Face
    saves tied models; tensors are written contiguous and on the CPU, in the model's dtype.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = to_hf_state_dict(model.state_dict())
    if model.config.tie_embeddings:
        del tensors["lm_head.weight"]
    tensors = {key: t.detach().to("cpu").contiguous() for key, t in tensors.items()}
    dtype = str(model.tok_embeddings.weight.dtype).removeprefix("torch.")
    config_dict = to_hf_config_dict(model.config, max_position_embeddings, dtype, tokenizer_ids)
    (out_dir / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
    if tokenizer_ids is not None:
        generation = to_hf_generation_config_dict(model.config, tokenizer_ids)
        (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def _safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a Hugging Face folder: from the shard index when there is one."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shard_names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / name for name in shard_names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(
            f"No *.safetensors weights in {folder}; only safetensors checkpoints are supported "
            "(re-save pytorch_model.bin checkpoints with save_pretrained(safe_serialization=True))."
        )
    return files


def load_hf_pretrained(path: str | Path) -> tuple[LlamaSettings, dict[str, torch.Tensor]]:
    """Read a local Hugging Face Llama folder (``config.json`` + safetensors, sharded or not)
    into our config and state dict, without transformers."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ConfigError(
            f"init_from_hf={path}: {config_file} does not exist; give a local Hugging Face Llama folder"
            " (config.json and *.safetensors)."
        )
    config = from_hf_config_dict(json.loads(config_file.read_text()))
    hf_state_dict: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(folder):
        hf_state_dict.update(load_file(str(file)))
    return config, from_hf_state_dict(hf_state_dict, config)


def _config_from_hyper_parameters(checkpoint: Mapping[str, Any], path: Path) -> LlamaSettings:
    """The LlamaSettings saved by the LightningModule as ``hyper_parameters["model"]``
    (a LlamaSettings, or a mapping of its fields, possibly with a ``_target_`` key)."""
    model_hp = checkpoint.get("hyper_parameters", {}).get("model")
    if model_hp is None:
        raise KeyError(f"{path} has no hyper_parameters['model'] holding the LlamaSettings fields.")
    if isinstance(model_hp, LlamaSettings):
        return model_hp
    values = {key: model_hp[key] for key in model_hp if key != "_target_"}
    unknown = values.keys() - {f.name for f in fields(LlamaSettings)}
    if unknown:
        raise KeyError(
            f"{path}: hyper_parameters['model'] has keys that are not LlamaSettings fields: {sorted(unknown)}"
        )
    return LlamaSettings(**values)


def _model_state_dict(lightning_state_dict: Mapping[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Keep the ``model.``-prefixed entries, with the prefix and wrapper name parts removed."""
    state_dict = {}
    for key, tensor in lightning_state_dict.items():
        if key.startswith("model."):
            for part in _WRAPPER_NAME_PARTS:
                key = key.replace(part, "")
            state_dict[key.removeprefix("model.")] = tensor
    if not state_dict:
        raise KeyError(f"{path}: state_dict has no 'model.'-prefixed keys; is this a checkpoint of this project?")
    return state_dict


def _load_distributed_checkpoint(folder: Path) -> dict[str, Any]:
    """Read a ``torch.distributed.checkpoint`` folder written by Lightning's sharded strategies:
    ModelParallelStrategy (FSDP2) keeps the weights under ``state_dict``, FSDPStrategy (FSDP1)
    under ``model``; optimizer states and the rest sit beside them, other entries in ``meta.pt``.

    Only the ``<top>.model.*`` tensors are loaded (resharded into whole tensors), so the
    optimizer states, often twice the model's size, are never read.
    """
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not (folder / ".metadata").is_file():
        raise FileNotFoundError(f"{folder} is a directory but not a distributed checkpoint (no .metadata file).")
    reader = FileSystemReader(folder)
    saved = reader.read_metadata().state_dict_metadata
    top = "state_dict" if any(key.startswith("state_dict.model.") for key in saved) else "model"
    weights = {
        key.removeprefix(f"{top}."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in saved.items()
        if key.startswith(f"{top}.model.") and isinstance(meta, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # loading in one process is the intent here, not a fallback
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load({top: weights}, storage_reader=reader, no_dist=True)
    meta_file = folder / "meta.pt"
    checkpoint = torch.load(meta_file, map_location="cpu", weights_only=False) if meta_file.is_file() else {}
    checkpoint["state_dict"] = weights
    return checkpoint


@dataclass(frozen=True)
class CheckpointContents:
    """A Lightning checkpoint of this project, read for tools that work from it alone.

    ``metadata`` holds every other entry of the checkpoint (``datamodule_hyper_parameters``,
    the training clock, the optimizer state, ...): everything but the model weights.
    """

    config: LlamaSettings
    state_dict: dict[str, torch.Tensor]
    metadata: dict[str, Any]


def load_lightning_checkpoint(path: str | Path) -> tuple[LlamaSettings, dict[str, torch.Tensor]]:
    """Our config and model state dict from a Lightning checkpoint of this project
    (see ``read_lightning_checkpoint``)."""
    contents = read_lightning_checkpoint(path)
    return contents.config, contents.state_dict


def read_lightning_checkpoint(path: str | Path) -> CheckpointContents:
    """Our config, model state dict and the other entries of a Lightning checkpoint of this project.

    ``path`` is a ``.ckpt`` file or a distributed-checkpoint folder (ModelParallelStrategy).
    The checkpoint is unpickled (``weights_only=False``: hyper-parameters may hold config
    objects), so only load checkpoints you trust.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Checkpoint not found: {path}")
    if path.is_dir():
        checkpoint = _load_distributed_checkpoint(path)
    else:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except Exception as error:  # truncated, not a zip, not a pickle: any of them means unreadable
            reason = str(error).splitlines()[0].split(". ")[0] if str(error) else ""
            raise CheckpointError(f"{path} is not a readable checkpoint ({type(error).__name__}: {reason})") from None
    if not isinstance(checkpoint, Mapping) or "state_dict" not in checkpoint:
        raise KeyError(f"{path} is not a Lightning checkpoint: it has no 'state_dict' entry.")
    config = _config_from_hyper_parameters(checkpoint, path)
    state_dict = _model_state_dict(checkpoint["state_dict"], path)
    if config.vocab_size is None and "tok_embeddings.weight" in state_dict:
        # A config saved before the tokenizer filled it in: the embedding table knows.
        config = replace(config, vocab_size=state_dict["tok_embeddings.weight"].shape[0])
    metadata = {key: value for key, value in checkpoint.items() if key != "state_dict"}
    return CheckpointContents(config, state_dict, metadata)
