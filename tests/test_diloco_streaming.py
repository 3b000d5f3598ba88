"""Streaming DiLoCo (Douillard et al. 2025): fragments that sync in turn, exchanges in flight, mixing.

- the outer loop (``FragmentSync``) against two references written out plainly in float64:
  classic DiLoCo (P = 1, tau = 0, alpha = 0 must equal it to 1e-7) and the streaming
  algorithm as the paper states it (P = 2 and 4, tau = 1 and 2, alpha = 0.5);
- which fragment holds which parameters, and when each syncs;
- bytes per sync: 1 / P of classic DiLoCo's at the same H;
- simulated replicas equal 2 real ones (2 processes) with P = 2, tau = 1;
- a run resumed while a fragment's exchange is in flight ends on the same weights.
"""

import csv

import pytest
import torch

from callbacks.diloco.exchange import Exchange, bytes_sent_per_sync
from callbacks.diloco.fragments import fragments_due, split_parameters
from callbacks.diloco.outer_step import OuterStep
from callbacks.diloco.sync import FragmentSync
from tests.run_helpers import TINY, checkpoint_weights, run_to_completion

SHAPES = [(3,), (2, 2), (4,), (1, 3), (2,), (5,)]  # six tensors, split into fragments by index


def inner_update(step: int, replica: int, index: int, shape: tuple[int, ...]) -> torch.Tensor:
    """What inner training moves one replica's tensor by in one global step (deterministic noise)."""
    generator = torch.Generator().manual_seed(1000 * step + 100 * replica + index)
    return 0.1 * torch.randn(shape, generator=generator, dtype=torch.float64)


def initial_weights() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in SHAPES]


def inner_step(weights: list[list[torch.Tensor]], step: int) -> None:
    """Every replica's inner step: the same scripted update in the engine and the references."""
    for replica, replica_weights in enumerate(weights):
        for index, weight in enumerate(replica_weights):
            weight.add_(inner_update(step, replica, index, weight.shape))


def run_engine(
    replicas: int,
    steps: int,
    sync_every: int,
    fragments: list[list[int]],
    delay: int,
    alpha: float,
    lr: float = 0.7,
    momentum: float = 0.9,
) -> list[list[torch.Tensor]]:
    weights = [[w.clone() for w in initial_weights()] for _ in range(replicas)]
    anchors = [w.clone() for w in initial_weights()]
    outer = OuterStep(anchors, lambda a: torch.optim.SGD(a, lr=lr, momentum=momentum, nesterov=True))
    sync = FragmentSync(
        weights, fragments, outer, sync_every, delay, alpha, "none", None, norm=lambda indices, deltas: torch.zeros(())
    )
    for step in range(1, steps + 1):
        inner_step(weights, step)
        sync.after_global_step(step)
    return weights


def classic_reference(replicas: int, steps: int, sync_every: int, lr: float = 0.7, momentum: float = 0.9):
    """Douillard et al. 2023: every H steps, Nesterov SGD on the anchor with the mean of anchor - weights."""
    weights = [[w.clone() for w in initial_weights()] for _ in range(replicas)]
    anchor, buffer = [w.clone() for w in initial_weights()], None
    for step in range(1, steps + 1):
        inner_step(weights, step)
        if step % sync_every:
            continue
        delta = [sum(anchor[i] - w[i] for w in weights) / replicas for i in range(len(anchor))]
        buffer = delta if buffer is None else [momentum * b + d for b, d in zip(buffer, delta)]
        anchor = [a - lr * (d + momentum * b) for a, d, b in zip(anchor, delta, buffer)]
        weights = [[a.clone() for a in anchor] for _ in range(replicas)]
    return weights


def streaming_reference(
    replicas: int,
    steps: int,
    sync_every: int,
    groups: list[list[int]],
    delay: int,
    alpha: float,
    lr: float = 0.7,
    momentum: float = 0.9,
):
    """Douillard et al. 2025 as stated: fragment p starts its exchange after steps t with
    t mod H = (p + 1) H / P mod H, the averaged delta arrives tau steps later, the outer
    Nesterov step moves that fragment's anchor, and the replicas take
    alpha * local + (1 - alpha) * anchor for that fragment."""
    weights = [[w.clone() for w in initial_weights()] for _ in range(replicas)]
    anchor = [w.clone() for w in initial_weights()]
    buffers: dict[int, torch.Tensor] = {}
    pending: list[tuple[int, int, list[torch.Tensor]]] = []  # (arrives after step, fragment, mean delta)
    offsets = [(p + 1) * sync_every // len(groups) % sync_every for p in range(len(groups))]
    for step in range(1, steps + 1):
        inner_step(weights, step)
        for p, offset in enumerate(offsets):
            if step % sync_every == offset:
                pending.append(
                    (step + delay, p, [sum(anchor[i] - w[i] for w in weights) / replicas for i in groups[p]])
                )
        for _arrival, p, delta in [entry for entry in pending if entry[0] <= step]:
            for i, d in zip(groups[p], delta):
                buffers[i] = d if i not in buffers else momentum * buffers[i] + d
                anchor[i] = anchor[i] - lr * (d + momentum * buffers[i])
                for w in weights:
                    w[i] = alpha * w[i] + (1 - alpha) * anchor[i]
        pending = [entry for entry in pending if entry[0] > step]
    return weights


def assert_same(actual: list[list[torch.Tensor]], expected: list[list[torch.Tensor]], atol: float) -> None:
    for replica_actual, replica_expected in zip(actual, expected, strict=True):
        for a, e in zip(replica_actual, replica_expected, strict=True):
            torch.testing.assert_close(a, e, rtol=0, atol=atol)


def test_one_fragment_without_delay_or_mixing_is_classic_diloco():
    engine = run_engine(replicas=3, steps=13, sync_every=4, fragments=[list(range(6))], delay=0, alpha=0.0)
    assert_same(engine, classic_reference(replicas=3, steps=13, sync_every=4), atol=1e-7)


@pytest.mark.parametrize(("fragments", "delay", "alpha"), [(2, 1, 0.0), (2, 1, 0.5), (3, 2, 0.5), (6, 0, 0.0)])
def test_streaming_fragments_follow_the_paper(fragments, delay, alpha):
    groups = [list(range(6))[p * 6 // fragments : (p + 1) * 6 // fragments] for p in range(fragments)]
    engine = run_engine(replicas=2, steps=14, sync_every=6, fragments=groups, delay=delay, alpha=alpha)
    reference = streaming_reference(replicas=2, steps=14, sync_every=6, groups=groups, delay=delay, alpha=alpha)
    assert_same(engine, reference, atol=1e-12)


def test_fragments_are_contiguous_blocks_with_the_embedding_first_and_the_head_last():
    names = [
        "tok_embeddings.weight",
        *(f"layers.{b}.attention.q_proj.weight" for b in range(4)),
        "norm.weight",
        "output.weight",
    ]
    assert split_parameters(names, n_layers=4, fragments=2) == [[0, 1, 2], [3, 4, 5, 6]]
    assert split_parameters(["_orig_mod.layers.3._checkpoint_wrapped_module.mlp.up_proj.weight"], 4, 4) == [
        [],
        [],
        [],
        [0],
    ]
    # H = 30, P = 3: syncs after steps 10, 20, 30 (and every 30 after), the last fragment on the round.
    assert [fragments_due(t, 30, 3) for t in (10, 20, 30, 40, 15)] == [[0], [1], [2], [0], []]


@pytest.mark.parametrize("fragments", [1, 2, 4])
def test_bytes_per_sync_are_one_pth_of_classic_diloco(fragments):
    """Four equal blocks: each fragment's exchange moves 1 / P of the model, P of them a round."""
    names = [f"layers.{b}.mlp.up_proj.weight" for b in range(4)]
    groups = split_parameters(names, n_layers=4, fragments=fragments)
    classic = bytes_sent_per_sync(4 * 1000, replicas=2, compression="none")
    assert [bytes_sent_per_sync(1000 * len(g), 2, "none") for g in groups] == [classic / fragments] * fragments


STREAMING = TINY + [
    "+technique=diloco",
    "batch.micro_batch_size=2",
    "batch.global_batch_size=4",
    "technique.diloco.sync_every=4",
    "technique.diloco.fragments=2",
    "technique.diloco.fragment_delay=1",
    "technique.diloco.fragment_alpha=0.5",
    "callbacks.validation_schedule.every_n_steps=1000",
]
REAL = ["strategy=fsdp2", "strategy.save_distributed_checkpoint=false", "trainer.accelerator=cpu", "trainer.devices=2"]


def train(overrides, run_dir, tmp_path_factory):
    run_to_completion(overrides, run_dir, tmp_path_factory.getbasetemp() / "cache")
    return checkpoint_weights(run_dir / "checkpoints" / "last.ckpt")


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """8 global steps of 2 simulated replicas (16 optimizer steps); every step checkpointed."""
    run_dir = tmp_path_factory.mktemp("simulated")
    overrides = STREAMING + ["trainer.max_steps=16", "logger=csv", "callbacks.model_checkpoint.every_n_train_steps=2"]
    return train(overrides, run_dir, tmp_path_factory), run_dir


def test_simulated_streaming_equals_real_replicas(simulated, tmp_path, tmp_path_factory):
    real = train(STREAMING + REAL + ["trainer.max_steps=8", "logger=none"], tmp_path / "real", tmp_path_factory)
    weights, _ = simulated
    for name, value in weights.items():
        torch.testing.assert_close(real[name], value, rtol=0, atol=1e-5, msg=name)


def test_logs_name_the_fragment_and_its_bytes(simulated):
    _, run_dir = simulated
    with open(run_dir / "csv" / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("diloco/fragment")]
    # Merges after global steps 3, 5, 7 (optimizer steps 6, 10, 14); at the end (16) fragment 1's
    # exchange completes and every fragment is averaged (-1, the last record of that step).
    assert [(int(r["step"]), int(float(r["diloco/fragment"]))) for r in rows] == [(6, 0), (10, 1), (14, 0), (16, -1)]
    sent = {int(float(r["diloco/fragment"])): float(r["diloco/bytes_per_sync"]) for r in rows}
    assert sent[0] + sent[1] == sent[-1] and 0 < sent[0] < sent[-1]  # the fragments split the model


def test_resume_with_a_fragment_in_flight_is_exact(simulated, tmp_path, tmp_path_factory):
    """Global step 2 (optimizer step 4) started fragment 0's exchange; it merges after step 3."""
    weights, run_dir = simulated
    checkpoint = run_dir / "checkpoints" / "step000004.ckpt"
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)["diloco_ranks"][0]["sync"]["in_flight"]
    assert [(fragment, merge_after) for fragment, merge_after, _ in saved] == [(0, 3)]
    resumed = train(
        STREAMING + ["trainer.max_steps=16", "logger=none", f"ckpt_path={checkpoint}"],
        tmp_path / "resumed",
        tmp_path_factory,
    )
    for name, value in weights.items():
        assert torch.equal(resumed[name], value), name


PEERS_DELTA = [0.05 * torch.ones(shape, dtype=torch.float64) for shape in SHAPES]


def one_group(exchange: Exchange, moved: float = 0.3) -> tuple[FragmentSync, list[torch.Tensor]]:
    """One torchft group's outer loop whose averages come back as ``exchange``, its weights moved off the anchors."""
    weights = [[w + moved for w in initial_weights()]]
    outer = OuterStep(
        [w.clone() for w in initial_weights()], lambda a: torch.optim.SGD(a, lr=0.7, momentum=0.9, nesterov=True)
    )
    sync = FragmentSync(
        weights,
        [list(range(len(SHAPES)))],
        outer,
        4,
        0,
        0.0,
        "none",
        None,
        norm=lambda indices, deltas: torch.zeros(()),
        average=lambda deltas, final, ends: exchange,
    )
    return sync, weights[0]


@pytest.mark.parametrize(("final", "ends"), [(False, False), (False, True), (True, True)])
def test_a_fault_tolerant_round_is_applied_as_the_groups_that_sent_it_did(final: bool, ends: bool) -> None:
    """A group healed into its peers' sync takes what they took: the outer step (Nesterov's
    first step moves by lr (1 + momentum) delta), or, where they were taking the run's final
    plain average, anchor - delta; and it ends the run where they end it."""
    sync, weights = one_group(Exchange.done(PEERS_DELTA, final=final, ends=ends))
    records = sync.after_global_step(4)
    scale = 1.0 if final else 0.7 * (1 + 0.9)
    for weight, start, delta in zip(weights, initial_weights(), PEERS_DELTA):
        torch.testing.assert_close(weight, start - scale * delta, rtol=0, atol=1e-12)
    assert [(record.fragment, record.ends) for record in records] == [(None if final else 0, ends)]


def test_a_joining_group_moves_only_where_the_others_averaged_a_round() -> None:
    """Joining: where no group contributed a round (a new run, every group joining), the
    group's weights stay where they are (a checkpoint's mid-round weights included); where
    the others averaged one, it takes their step from the anchors."""
    sync, weights = one_group(Exchange.done(None))
    assert sync.join(lambda deltas: Exchange.done(None)) == [] and sync.discarded == 0
    for weight, start in zip(weights, initial_weights()):
        torch.testing.assert_close(weight, start + 0.3, rtol=0, atol=0)
    records = sync.join(lambda deltas: Exchange.done(PEERS_DELTA))
    for weight, start, delta in zip(weights, initial_weights(), PEERS_DELTA):
        torch.testing.assert_close(weight, start - 0.7 * 1.9 * delta, rtol=0, atol=1e-12)
    assert len(records) == 1 and not records[0].ends
