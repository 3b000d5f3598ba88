"""Meta-device initialisation: the documented distributions, determinism, equality with a model
built whole (one process; two gloo processes under FSDP2 and FSDP1), and each rank's peak memory."""

import collections
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from benchmarks.meta_init_memory import free_port, join_process_group, peak_increase_per_rank
from lightning_modules.llama import Llama, TransformerBlock, count_parameters, seed_from_global_rng
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.meta_init import fsdp1_param_init_fn, materialize_and_init

CPU = torch.device("cpu")
# Odd vocabulary: the embedding's rows split unevenly over two ranks.
SMALL = LlamaSettings(vocab_size=97, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64)
# tinyllama_1b's structure at 1/12 of its size (95M parameters, 0.38 GB in fp32), the
# vocabulary cut so that, as in tinyllama_1b, no single matrix is more than a few percent.
MEMORY = LlamaSettings(vocab_size=2048, n_layers=8, d_model=1024, n_heads=16, n_kv_heads=4, mlp_hidden=2816)


def on_meta(config: LlamaSettings) -> Llama:
    with torch.device("meta"):
        return Llama(config)


def reference(config: LlamaSettings, seed: int) -> dict[str, torch.Tensor]:
    """A model built whole on the CPU, initialised with ``seed``."""
    model = Llama(config)
    model.init_weights(seed)
    return model.state_dict()


def assert_same_weights(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(state[name], value), name


def test_materialised_weights_have_the_documented_distribution():
    """N(0, init_std) for embeddings and projections, init_std / sqrt(2 n_layers) for the two
    residual writers, ones for gains; tensors drawn independently of each other."""
    config = LlamaSettings(vocab_size=1000, n_layers=4, d_model=256, n_heads=4, n_kv_heads=2, mlp_hidden=512)
    model = on_meta(config)
    materialize_and_init(model, CPU, seed=7)
    residual_std = 0.02 / math.sqrt(2 * 4)
    for name, param in model.named_parameters():
        assert param.device == CPU and param.dtype == torch.float32, name
        if name.endswith("norm.weight"):
            assert torch.equal(param, torch.ones_like(param)), name
            continue
        std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
        assert param.std().item() == pytest.approx(std, rel=0.03), name
        assert abs(param.mean().item()) < 0.05 * std, name
    first, second = (model.layers[i].attention.q_proj.weight.flatten() for i in ("0", "1"))
    assert abs(torch.corrcoef(torch.stack((first, second)))[0, 1].item()) < 0.02


def test_same_seed_same_weights_other_seed_other_weights():
    first, again, other = on_meta(SMALL), on_meta(SMALL), on_meta(SMALL)
    materialize_and_init(first, CPU, seed=3)
    materialize_and_init(again, CPU, seed=3)
    materialize_and_init(other, CPU, seed=4)
    assert_same_weights(again.state_dict(), first.state_dict())
    for name, value in first.state_dict().items():
        assert name.endswith("norm.weight") or not torch.equal(other.state_dict()[name], value), name


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_meta_materialised_model_equals_one_built_whole(tie, checkpointing):
    """``torch.manual_seed(s); Llama(config)`` and the meta path with the seed drawn after
    building (building on meta draws nothing) give the same weights, wrappers or not."""
    config = LlamaSettings(**{**vars(SMALL), "tie_embeddings": tie})
    torch.manual_seed(11)
    whole = Llama(config)
    torch.manual_seed(11)
    model = on_meta(config)
    if checkpointing:
        for index, block in model.layers.items():
            model.layers[index] = checkpoint_wrapper(block)
    materialize_and_init(model, CPU, seed_from_global_rng())
    assert_same_weights(model.state_dict(), whole.state_dict())
    assert (model.output.weight is model.tok_embeddings.weight) == tie


def test_bf16_parameters_hold_the_rounded_fp32_draw():
    model = Llama(SMALL).to(torch.bfloat16)
    model.init_weights(5)
    expected = {name: value.to(torch.bfloat16) for name, value in reference(SMALL, 5).items()}
    assert_same_weights(model.state_dict(), expected)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_fsdp1_param_init_fn_called_module_by_module_equals_init_weights(tie):
    """What FSDP1 does with a meta model: the function on each module in breadth-first order."""
    config = LlamaSettings(**{**vars(SMALL), "tie_embeddings": tie})
    model = on_meta(config)
    init_module = fsdp1_param_init_fn(model, seed=9, device=CPU)
    queue = collections.deque([model])
    while queue:
        module = queue.popleft()
        init_module(module)
        queue.extend(module.children())
    assert_same_weights(model.state_dict(), reference(config, 9))
    assert (model.output.weight is model.tok_embeddings.weight) == tie


def sharded_builds(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Rank's part of the 2-process test: FSDP2 (checkpointed blocks, then fully_shard per
    block and root, then materialise) and FSDP1 (param_init_fn), both from meta, tied and
    untied. Rank 0 saves the gathered weights and the logits of a fixed batch."""
    mesh = join_process_group(rank, world_size, port)
    ids = torch.arange(24).reshape(2, 12) % SMALL.vocab_size
    results = {}
    for tie in (False, True):
        config = LlamaSettings(**{**vars(SMALL), "tie_embeddings": tie})
        model = on_meta(config)
        for index, block in model.layers.items():
            model.layers[index] = checkpoint_wrapper(block)
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        materialize_and_init(model, CPU, seed=5)
        full = {name: value.full_tensor() for name, value in model.state_dict().items()}
        results[f"fsdp2-{tie}"] = (full, model(ids).detach(), model.output.weight is model.tok_embeddings.weight)

        meta_model = on_meta(config)
        wrapped = FullyShardedDataParallel(
            meta_model,
            auto_wrap_policy=ModuleWrapPolicy({TransformerBlock}),
            param_init_fn=fsdp1_param_init_fn(meta_model, seed=5, device=CPU),
            device_id=CPU,
            use_orig_params=True,
        )
        logits = wrapped(ids).detach()
        with FullyShardedDataParallel.summon_full_params(wrapped):
            full = {name: value.clone() for name, value in meta_model.state_dict().items()}
        results[f"fsdp1-{tie}"] = (full, logits, meta_model.output.weight is meta_model.tok_embeddings.weight)
    if rank == 0:
        torch.save(results, f"{out_dir}/results.pt")
    dist.destroy_process_group()


def test_two_sharded_processes_materialise_exactly_the_single_process_weights(tmp_path):
    mp.spawn(sharded_builds, args=(2, free_port(), str(tmp_path)), nprocs=2)
    results = torch.load(tmp_path / "results.pt")
    ids = torch.arange(24).reshape(2, 12) % SMALL.vocab_size
    for key, (state, logits, tied) in results.items():
        tie = key.endswith("True")
        config = LlamaSettings(**{**vars(SMALL), "tie_embeddings": tie})
        whole = Llama(config)
        whole.init_weights(5)
        assert_same_weights(state, whole.state_dict())
        torch.testing.assert_close(logits, whole(ids).detach(), msg=key)  # the shards FSDP gathers
        assert tied == tie, key


def test_meta_init_keeps_each_ranks_peak_memory_near_its_shards():
    """Two ranks: the meta path peaks at about half the model (this rank's shards) plus one
    full parameter, under 60% of the fp32 size; building whole first peaks above 90%."""
    fp32_bytes = 4 * count_parameters(MEMORY)
    with_meta = peak_increase_per_rank(MEMORY, 2, meta=True)
    whole_first = peak_increase_per_rank(MEMORY, 2, meta=False)
    print(
        f"\nfp32 model {fp32_bytes / 1e6:.0f} MB; each rank's peak RSS increase (MB) with meta init "
        f"{[round(b / 1e6) for b in with_meta]}, whole model first {[round(b / 1e6) for b in whole_first]}"
    )
    assert max(with_meta) < 0.6 * fp32_bytes
    assert min(whole_first) > 0.9 * fp32_bytes
