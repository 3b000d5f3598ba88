"""Hugging Face interop: our logits against transformers' LlamaForCausalLM holding the same
weights, and checkpoints crossing in both directions (including the export script)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lightning_modules.hf_interop import (
    from_hf_config_dict,
    from_hf_state_dict,
    load_hf_pretrained,
    load_lightning_checkpoint,
    save_hf_pretrained,
    to_hf_config_dict,
    to_hf_state_dict,
)
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from tests.run_helpers import run_script

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")

REPO_ROOT = Path(__file__).resolve().parents[1]
VOCAB, SEQ = 300, 13


def random_config(tie: bool) -> LlamaSettings:
    return LlamaSettings(
        name="interop",
        vocab_size=VOCAB,
        n_layers=2,
        d_model=64,
        n_heads=4,
        n_kv_heads=2,
        mlp_hidden=96,
        rope_theta=500000.0,
        norm_eps=1e-6,
        tie_embeddings=tie,
        init_std=0.1,
    )


def random_model(tie: bool) -> Llama:
    """Norm gains are randomised too, so a swapped norm mapping would show in the logits."""
    torch.manual_seed(0)
    model = Llama(random_config(tie))
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 1:
                param.normal_(1.0, 0.3)
    return model.eval()


def hf_eager(config: dict) -> torch.nn.Module:
    """transformers' reference implementation: eager attention, fp32."""
    hf_config = transformers.LlamaConfig(**config)
    return transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager").float().eval()


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and custom positions: offsets, a restart mid-row, and large positions."""
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, SEQ))
    positions = torch.stack((torch.arange(SEQ) + 100, torch.cat((torch.arange(6), torch.arange(7) + 3000))))
    return ids, positions


def assert_same_logits(ours: Llama, hf: torch.nn.Module) -> None:
    ids, positions = inputs()
    with torch.no_grad():
        for pos in (None, positions):
            diff = (ours(ids, pos) - hf(input_ids=ids, position_ids=pos).logits).abs().max().item()
            assert diff < 1e-4, f"max |diff| {diff} with position_ids={pos}"


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers_with_same_weights(tie: bool) -> None:
    ours = random_model(tie)
    hf = hf_eager(to_hf_config_dict(ours.config))
    hf.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=True)
    assert_same_logits(ours, hf)


def test_config_dict_round_trip() -> None:
    config = random_config(tie=True)
    hf_dict = to_hf_config_dict(config, max_position_embeddings=2048)
    assert hf_dict["architectures"] == ["LlamaForCausalLM"] and hf_dict["max_position_embeddings"] == 2048
    assert from_hf_config_dict(hf_dict) == dataclasses.replace(config, name="hf_llama")


def test_transformers_5_rope_parameters_are_read() -> None:
    hf_dict = to_hf_config_dict(random_config(tie=False))
    hf_dict["rope_parameters"] = {"rope_type": "default", "rope_theta": hf_dict.pop("rope_theta")}
    assert from_hf_config_dict(hf_dict).rope_theta == 500000.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_scaling": {"type": "linear", "factor": 4.0}}, "rope_scaling"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1.0}}, "rope_type"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"head_dim": 32}, "head_dim"),
    ],
)
def test_unsupported_hf_features_are_rejected(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_hf_config_dict({**to_hf_config_dict(random_config(tie=False)), **change})


def test_unknown_keys_are_listed() -> None:
    model = random_model(tie=False)
    with pytest.raises(KeyError, match="extra.bias"):
        to_hf_state_dict({**model.state_dict(), "extra.bias": torch.zeros(1)})
    hf_state = to_hf_state_dict(model.state_dict())
    with pytest.raises(KeyError, match="q_norm"):
        from_hf_state_dict({**hf_state, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}, model.config)
    del hf_state["lm_head.weight"]
    with pytest.raises(KeyError, match="output.weight"):
        from_hf_state_dict(hf_state, model.config)


@pytest.mark.parametrize("tie", [False, True])
def test_save_hf_pretrained_loads_in_transformers(tie: bool, tmp_path: Path) -> None:
    ours = random_model(tie)
    save_hf_pretrained(ours, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert ("lm_head.weight" in f.keys()) is not tie  # tied weights stored once
    hf, info = transformers.LlamaForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_same_logits(ours, hf.eval())


@pytest.mark.parametrize(("tie", "shard"), [(False, False), (True, True)])
def test_transformers_save_pretrained_loads_into_ours(tie: bool, shard: bool, tmp_path: Path) -> None:
    torch.manual_seed(2)
    hf = hf_eager(to_hf_config_dict(random_config(tie)))
    hf.save_pretrained(tmp_path, max_shard_size="50KB" if shard else "5GB")
    assert (tmp_path / "model.safetensors.index.json").is_file() is shard
    config, state_dict = load_hf_pretrained(tmp_path)
    assert config.tie_embeddings is tie and config.rope_theta == 500000.0 and config.n_kv_heads == 2
    ours = Llama(config)
    ours.load_state_dict(state_dict, strict=True)
    assert_same_logits(ours.eval(), hf)


def lightning_checkpoint(model: Llama) -> dict:
    """What this project's LightningModule saves: ``model.``-prefixed weights, the config as
    ``hyper_parameters["model"]`` (here with Hydra's ``_target_``) and unrelated entries."""
    return {
        "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
        "hyper_parameters": {
            "model": {"_target_": "lightning_modules.llama_settings.LlamaSettings", **dataclasses.asdict(model.config)},
            "lr": 3e-4,
        },
        "global_step": 7,
    }


def test_export_script_writes_a_folder_transformers_loads(tmp_path: Path) -> None:
    """Tied embeddings: the harder case (lm_head is left out of the file)."""
    ours = random_model(tie=True)
    torch.save(lightning_checkpoint(ours), tmp_path / "last.ckpt")
    script = REPO_ROOT / "scripts" / "export_hf.py"
    result = run_script(script, [str(tmp_path / "last.ckpt"), str(tmp_path / "hf")])
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["tie_word_embeddings"] is True
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager")
    assert_same_logits(ours, hf.eval())


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_distributed_checkpoint_folder_is_consolidated(tmp_path: Path) -> None:
    """The layout ModelParallelStrategy writes: DCP tensors under ``state_dict`` and
    ``optimizer_0``, everything else in ``meta.pt``."""
    import torch.distributed.checkpoint as dcp

    model = random_model(tie=True)
    checkpoint = lightning_checkpoint(model)
    tensors = {
        "state_dict": checkpoint.pop("state_dict"),
        "optimizer_0": {"state": {"model.norm.weight": {"exp_avg": torch.zeros(64)}}},
    }
    dcp.save(tensors, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    torch.save(checkpoint, tmp_path / "ckpt" / "meta.pt")
    config, state_dict = load_lightning_checkpoint(tmp_path / "ckpt")
    assert config == model.config
    assert state_dict.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(state_dict[key], value), key


def test_checkpoint_without_vocab_size_takes_it_from_the_embedding(tmp_path: Path) -> None:
    model = random_model(tie=False)
    checkpoint = lightning_checkpoint(model)
    checkpoint["hyper_parameters"]["model"]["vocab_size"] = None
    torch.save(checkpoint, tmp_path / "last.ckpt")
    config, _ = load_lightning_checkpoint(tmp_path / "last.ckpt")
    assert config == model.config


def test_checkpoint_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        load_lightning_checkpoint(tmp_path / "missing.ckpt")
    torch.save({"weights": {}}, tmp_path / "plain.pt")
    with pytest.raises(KeyError, match="state_dict"):
        load_lightning_checkpoint(tmp_path / "plain.pt")
    torch.save({"state_dict": {}, "hyper_parameters": {}}, tmp_path / "no_config.ckpt")
    with pytest.raises(KeyError, match=r"hyper_parameters\['model'\]"):
        load_lightning_checkpoint(tmp_path / "no_config.ckpt")
    (tmp_path / "not_dcp").mkdir()
    with pytest.raises(FileNotFoundError, match="metadata"):
        load_lightning_checkpoint(tmp_path / "not_dcp")
