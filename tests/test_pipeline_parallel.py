"""Pipeline parallelism on 2 CPU processes takes one process's gradients: each schedule, the
stages' gradients and the step's loss within 1e-5 relative of the whole model's."""

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.meta_init_memory import free_port, join_process_group
from lightning_modules.llama import Llama, LlamaSettings
from lightning_modules.pipeline_parallel import Pipeline, keep_stage, rank_stages, stage_blocks

CONFIG = LlamaSettings(vocab_size=64, n_layers=4, d_model=32, n_heads=4, n_kv_heads=2, mlp_hidden=64)
MICRO_BATCHES, ROWS, LENGTH = 4, 8, 16


def test_blocks_are_shared_out_evenly_in_order():
    assert stage_blocks(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_blocks(5, 2) == [range(0, 3), range(3, 5)]
    assert stage_blocks(7, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 7)]
    assert rank_stages(1, 2, 2) == [1, 3]


def test_stages_in_a_chain_are_the_whole_model():
    torch.manual_seed(0)
    whole = Llama(CONFIG)
    stages = []
    for index, blocks in enumerate(stage_blocks(CONFIG.n_layers, 3)):
        stage = copy.deepcopy(whole)
        keep_stage(stage, blocks, first=index == 0, last=index == 2)
        stages.append(stage)
    assert next(name for name, _ in stages[1].named_parameters()) == "layers.2.attention_norm.weight"
    tokens = torch.randint(0, 64, (2, LENGTH))
    hidden = tokens
    for stage in stages:
        hidden = stage(hidden)
    torch.testing.assert_close(hidden, whole(tokens), rtol=0, atol=0)


def pipelined(rank: int, port: int, schedule: str, stages_per_rank: int, out_dir: str) -> None:
    """One optimizer step's rows through a 2-rank pipeline; rank by rank, the largest relative
    difference of a gradient (and, on the last stage's rank, of the loss) from the whole model's."""
    group = join_process_group(rank, 2, port).get_group()
    torch.manual_seed(0)
    whole = Llama(CONFIG)
    count = 2 * stages_per_rank
    indices = rank_stages(rank, 2, stages_per_rank)
    blocks = stage_blocks(CONFIG.n_layers, count)
    modules = []
    for index in indices:
        module = copy.deepcopy(whole)
        keep_stage(module, blocks[index], first=index == 0, last=index == count - 1)
        modules.append(module)
    tokens = torch.randint(0, 64, (ROWS, LENGTH + 1), generator=torch.Generator().manual_seed(1))
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    loss = Pipeline(modules, indices, count, group, schedule).step(inputs, labels, MICRO_BATCHES)
    # the reference: gradient accumulation over the same micro-batches
    reference = 0.0
    for chunk_inputs, chunk_labels in zip(inputs.chunk(MICRO_BATCHES), labels.chunk(MICRO_BATCHES)):
        micro_loss = whole(chunk_inputs, labels=chunk_labels) / MICRO_BATCHES
        micro_loss.backward()
        reference += micro_loss.item()
    whole_parameters = dict(whole.named_parameters())
    differences = [
        ((parameter.grad - whole_parameters[name].grad).norm() / whole_parameters[name].grad.norm()).item()
        for module in modules
        for name, parameter in module.named_parameters()
    ]
    if loss is not None:
        differences.append(abs(loss.item() - reference) / reference)
    torch.save((len(differences), max(differences)), Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize(("schedule", "stages_per_rank"), [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)])
def test_a_pipelined_step_takes_one_process_s_gradients(schedule, stages_per_rank, tmp_path):
    mp.spawn(pipelined, args=(free_port(), schedule, stages_per_rank, str(tmp_path)), nprocs=2)
    parameters_per_block = 9  # two norms, four attention and three MLP matrices
    first, last = (torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1))
    # rank 0 holds the embedding and the first blocks; rank 1 the last blocks, norm, head and the loss
    assert first[0] + last[0] == 1 + CONFIG.n_layers * parameters_per_block + 2 + 1
    assert first[1] < 1e-5 and last[1] < 1e-5
