"""Pipeline parallelism on 2 and 4 CPU processes takes one process's steps: each schedule's
step gives the whole model's gradients and loss within 1e-5 relative, and a run under each
schedule (and D = 2 x P = 2) one process's per-step losses, gradient norms and validation
losses, on the same rows."""

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.meta_init_memory import free_port, join_process_group
from benchmarks.saved_activations import LiveSaved
from launch.from_config import read_settings
from lightning_modules.hf_interop import load_lightning_checkpoint
from lightning_modules.llama import Llama
from lightning_modules.llama_settings import LlamaSettings
from lightning_modules.memory_plan import PipelineShape, memory_plan
from lightning_modules.pipeline_parallel import Pipeline, keep_stage
from lightning_modules.pipeline_stages import rank_stages, stage_blocks
from tests.layout_runs import (
    ADAPTIVE_BATCH,
    EXPERIMENTS,
    SEQ_LEN_WARMUP,
    STEPS,
    assert_composes_or_refuses_in_one_line,
    assert_one_process_s_steps,
    assert_refused_in_one_line,
    one_process_runs,
    row_log,
)
from tests.run_helpers import TINY, compose_config, run_train

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


def on_two_ranks(rank: int, port: int, check, cases: dict[str, tuple], out_dir: str) -> None:
    """Run ``check(rank, group, *case)`` for every case on this rank of a 2-process group
    (one start-up for them all) and save the results by case name."""
    group = join_process_group(rank, 2, port).get_group()
    torch.save({name: check(rank, group, *case) for name, case in cases.items()}, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def results_on_two_ranks(check, cases: dict[str, tuple], out_dir: Path) -> list[dict]:
    mp.spawn(on_two_ranks, args=(free_port(), check, cases, str(out_dir)), nprocs=2)
    return [torch.load(out_dir / f"rank{rank}.pt") for rank in (0, 1)]


def pipelined(rank: int, group, schedule: str, stages_per_rank: int, one_at_a_time: bool) -> tuple[int, float]:
    """One optimizer step's rows through a 2-rank pipeline (together, or a micro-batch at a
    time as the adaptive batch's tested steps run); on this rank, the number of parameters
    and the largest relative difference of a gradient (and of the step's loss) from the
    whole model's."""
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
    pipeline = Pipeline(modules, indices, count, group, schedule)
    if one_at_a_time:
        chunks = zip(inputs.chunk(MICRO_BATCHES), labels.chunk(MICRO_BATCHES))
        loss = sum(pipeline.step(*chunk, 1, MICRO_BATCHES) for chunk in chunks) / MICRO_BATCHES
    else:
        loss = pipeline.step(inputs, labels, MICRO_BATCHES, MICRO_BATCHES)
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
    differences.append(abs(loss.item() - reference) / reference)  # every rank has the step's loss
    return len(differences), max(differences)


def stage_memory(rank: int, group, schedule: str, stages_per_rank: int) -> tuple[int, float]:
    """The first step of a 2-rank pipeline in fp32 (the one that also learns the stages'
    shapes): the peak bytes autograd held for backward on this rank (``LiveSaved``), and
    the memory plan's activations for it."""
    torch.manual_seed(0)
    shape = PipelineShape(2, schedule, stages_per_rank, MICRO_BATCHES)
    indices, blocks = shape.stages(rank), stage_blocks(CONFIG.n_layers, 2 * stages_per_rank)
    modules = []
    for index in indices:
        module = Llama(CONFIG)
        keep_stage(module, blocks[index], first=index == 0, last=index == 2 * stages_per_rank - 1)
        modules.append(module)
    tokens = torch.randint(0, 64, (ROWS, LENGTH + 1), generator=torch.Generator().manual_seed(1))
    saved = LiveSaved([p for module in modules for p in module.parameters()])
    with saved.hooks():
        Pipeline(modules, indices, 2 * stages_per_rank, group, schedule).step(
            tokens[:, :-1], tokens[:, 1:], MICRO_BATCHES, MICRO_BATCHES
        )
    model_plan = memory_plan(
        CONFIG,
        precision="32-true",
        optimizer="adamw",
        shards=1,
        micro_batch=ROWS // MICRO_BATCHES,
        seq_len=LENGTH,
        checkpointing="none",
        loss="plain",
        pipeline=shape,
        pipeline_rank=rank,
    )
    return saved.peak, model_plan.activations


def test_a_stage_keeps_the_micro_batches_its_schedule_has_in_flight_as_the_memory_plan_counts(tmp_path):
    """GPipe keeps all 4 micro-batches on both ranks; 1F1B 2 on the first rank and 1 on the
    last; interleaved 1F1B 2.5 and 1.5 of a rank's blocks: each rank's peak within 8% of its plan."""
    cases = {"gpipe": ("gpipe", 1), "1f1b": ("1f1b", 1), "interleaved": ("interleaved_1f1b", 2)}
    for rank, results in enumerate(results_on_two_ranks(stage_memory, cases, tmp_path)):
        for name, (peak, planned) in results.items():
            assert peak == pytest.approx(planned, rel=0.08), (name, rank, peak, planned)


def test_a_pipelined_step_takes_one_process_s_gradients(tmp_path):
    """Each schedule, the step's micro-batches together and (as the adaptive batch's tested
    steps run them) one at a time."""
    cases = {
        "gpipe": ("gpipe", 1, False),
        "1f1b": ("1f1b", 1, False),
        "interleaved": ("interleaved_1f1b", 2, False),
        "1f1b_one_at_a_time": ("1f1b", 1, True),
        "interleaved_one_at_a_time": ("interleaved_1f1b", 2, True),
    }
    first, last = results_on_two_ranks(pipelined, cases, tmp_path)
    parameters_per_block = 9  # two norms, four attention and three MLP matrices
    for name in cases:
        # rank 0 holds the embedding and the first blocks, rank 1 the last blocks, norm and head; both the loss
        assert first[name][0] + last[name][0] == 1 + CONFIG.n_layers * parameters_per_block + 2 + 2, name
        assert first[name][1] < 1e-5 and last[name][1] < 1e-5, (name, first[name], last[name])


# The tiny model with 4 blocks: 2 stages of 2, or 4 stages of 1 (2 per rank, interleaved). GPipe
# runs with Muon, the interleaved schedule with the batch warmup (its micro-batch count changing
# under 4 stages); the default, 1F1B, runs the other technique cases and D2xP2.
FOUR_BLOCKS = [*TINY, "model.n_layers=4"]
PIPELINE = ["strategy=fsdp2", "trainer.accelerator=cpu"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return one_process_runs(tmp_path_factory, FOUR_BLOCKS)


# Sequence-length warmup (stages learn each new shape); a batch warmup from 8 to 16 sequences
# after step 4 (4, then 8 micro-batches a step); the adaptive batch, whose tested steps run
# each micro-batch through the pipeline alone, growing the batch (and the micro-batch count).
BATCH_WARMUP = (
    "+technique=batch_warmup",
    "technique.batch_warmup.stage_sizes=[8,16]",
    "technique.batch_warmup.stage_tokens=1024",
)
P2 = ["trainer.devices=2"]


@pytest.mark.parametrize(
    ("layout", "extra", "line"),
    [
        (
            P2 + ["layout.pipeline_schedule=gpipe"],
            ("optimizer=muon",),
            "1 data-parallel x 2 pipeline ranks, 2 stages (gpipe",
        ),
        (
            P2 + ["layout.pipeline_schedule=interleaved_1f1b", "layout.stages_per_rank=2"],
            BATCH_WARMUP,
            "1 data-parallel x 2 pipeline ranks, 4 stages (interleaved_1f1b",
        ),
        (["trainer.devices=4"], (), "2 data-parallel x 2 pipeline ranks, 2 stages (1f1b"),
        (
            ["trainer.devices=4", "strategy.tensor_parallel_size=2", "layout.sequence_parallel=true"],
            (),
            "1 data-parallel x 2 pipeline x 2 tensor-parallel ranks, 2 stages (1f1b schedule), with sequence",
        ),
        (P2, SEQ_LEN_WARMUP, "1 data-parallel x 2 pipeline ranks, 2 stages (1f1b"),
        (P2, ADAPTIVE_BATCH, "1 data-parallel x 2 pipeline ranks, 2 stages (1f1b"),
    ],
    ids=[
        "P2_gpipe_muon",
        "P2_interleaved_batch_warmup",
        "D2xP2",
        "P2xT2_sequence_parallel",
        "P2_seq_len_warmup",
        "P2_adaptive_batch",
    ],
)
def test_a_pipelined_run_takes_one_process_s_steps(layout, extra, line, one_process, tmp_path, tmp_path_factory):
    run_dir = tmp_path / "run"
    overrides = FOUR_BLOCKS + STEPS + list(extra) + PIPELINE + ["strategy.pipeline_parallel_size=2", *layout]
    result = run_train(overrides + row_log(run_dir), run_dir, tmp_path_factory.getbasetemp() / "cache", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"layout: {line}" in result.stdout + result.stderr
    processes = int(layout[0].split("=")[1])
    model_parallel = 4 if "strategy.tensor_parallel_size=2" in layout else 2
    assert_one_process_s_steps(run_dir, one_process(extra), model_parallel, processes)


PP2 = [*PIPELINE, "trainer.devices=2", "strategy.pipeline_parallel_size=2"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [*PIPELINE, "trainer.devices=3", "strategy.pipeline_parallel_size=2"],
            "strategy.pipeline_parallel_size=2 x strategy.tensor_parallel_size=1 does not divide the 3 processes",
        ),
        (
            ["strategy=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "+strategy.pipeline_parallel_size=2"],
            "needs strategy=fsdp2",
        ),
        (PP2 + ["model.n_layers=1"], "2 stages, more than model.n_layers=1 blocks"),
        (PP2 + ["layout.pipeline_schedule=zero_bubble"], "layout.pipeline_schedule='zero_bubble' is unknown"),
        (PP2 + ["layout.pipeline_schedule=interleaved_1f1b"], "needs layout.stages_per_rank >= 2"),
        (
            PP2 + ["model.n_layers=6", "layout.pipeline_schedule=interleaved_1f1b", "layout.stages_per_rank=2"],
            "4 stages (strategy.pipeline_parallel_size=2 x layout.stages_per_rank=2) do not divide model.n_layers=6",
        ),
        (
            PP2 + ["layout.stages_per_rank=2"],
            "layout.stages_per_rank=2 needs layout.pipeline_schedule=interleaved_1f1b",
        ),
        (
            PP2 + ["batch.global_batch_size=2"],
            "1 micro-batch(es) per step, fewer than the 2 pipeline ranks, which would idle 50% of each step",
        ),
        (PP2 + ["strategy.save_distributed_checkpoint=false"], "needs strategy.save_distributed_checkpoint=true"),
        (PP2 + ["model.tie_embeddings=true"], "does not compose with model.tie_embeddings=true"),
        (
            PP2 + ["layout.compile=blocks"],
            "layout.compile=blocks does not compose with strategy.pipeline_parallel_size=2",
        ),
        (
            PP2 + ["+technique=seq_len_warmup"],
            "technique.seq_len_warmup.preallocate=true does not compose with strategy.pipeline_parallel_size=2",
        ),
    ],
    ids=[
        "processes",
        "ddp",
        "blocks",
        "schedule",
        "interleaved_stages",
        "interleaved_uneven",
        "stages_without_interleaving",
        "micro_batches",
        "gathered_checkpoint",
        "tied",
        "compile",
        "preallocate",
    ],
)
def test_a_pipeline_that_cannot_run_is_refused_in_one_line(overrides, message, tmp_path):
    assert_refused_in_one_line(FOUR_BLOCKS + overrides, message, tmp_path)


@pytest.mark.parametrize("technique", [(), ("+technique=constant_batch",)], ids=["alone", "with_a_technique"])
def test_the_automatic_micro_batch_leaves_a_micro_batch_per_pipeline_rank(technique, tmp_path):
    overrides = [*FOUR_BLOCKS, "batch.micro_batch_size=null", "batch.global_batch_size=16", *technique, *PP2]
    batch = read_settings(compose_config(overrides, tmp_path)).run.global_batch
    assert batch.accumulation >= 2 and batch.micro_batch_size * batch.accumulation == 16


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_with_two_pipeline_stages_or_refuses_in_one_line(experiment, tmp_path):
    assert_composes_or_refuses_in_one_line([f"+experiment={experiment}", *PP2], "pipeline_parallel_size=2", tmp_path)


def test_a_pipeline_s_checkpoint_resumes_on_two_stages_and_on_one_process(tmp_path, tmp_path_factory):
    """Saved at step 3 of 6 by 2 pipeline stages under Muon (whose groups a pipeline rank's
    distributed checkpoint restores bare), resumed on the same 2 stages and whole on one
    process (FSDP2, which reads the sharded checkpoint): the uninterrupted run's weights
    (reduction-order noise)."""
    cache = tmp_path_factory.getbasetemp() / "cache"
    common = FOUR_BLOCKS + [
        "optimizer=muon",
        "trainer.max_steps=6",
        "logger=none",
        "callbacks.validation_schedule.every_n_steps=100",
        "callbacks.model_checkpoint.every_n_train_steps=3",
    ]
    full = run_train(common + PP2, tmp_path / "full", cache)
    assert full.returncode == 0, full.stderr[-3000:]
    checkpoint = tmp_path / "full" / "checkpoints" / "step000003.ckpt"
    _, expected = load_lightning_checkpoint(tmp_path / "full" / "checkpoints" / "last.ckpt")
    for name, layout in (("two_stages", PP2), ("one_process", [*PIPELINE, "trainer.devices=1"])):
        resumed = run_train([*common, *layout, f"ckpt_path={checkpoint}"], tmp_path / name, cache)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        _, weights = load_lightning_checkpoint(tmp_path / name / "checkpoints" / "last.ckpt")
        assert weights.keys() == expected.keys() and len(weights) == 1 + 4 * 9 + 2
        for key, value in expected.items():
            torch.testing.assert_close(weights[key], value, rtol=1e-5, atol=1e-6, msg=f"{name}: {key}")
