"""Weighted mixtures (`data=mixture`): the draw rule against a position-by-position
reference, exact resume (also with changed weights), per-source validation and logging."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from analysis.runs import load_run
from common.errors import ConfigError
from data.datamodule import TextDataModule
from data.mixture import BLOCK, DRAW_STREAM, MixtureOrder, mixture_entries
from tests.run_helpers import TINY, datamodule, run_to_completion, run_train


def reference_rows(source_rows, history, seed, count):
    """Position by position, as the rule is written: u_p through the weights in force at p, the
    source's k-th draw reads row k mod rows of pass k // rows, a permutation seeded by (seed, source, pass)."""
    counts, rows = [0] * len(source_rows), []
    offsets = np.concatenate([[0], np.cumsum(source_rows)[:-1]])
    for p in range(count):
        u = np.random.default_rng([seed, DRAW_STREAM, p // BLOCK]).random(BLOCK)[p % BLOCK]
        weights = [w for start, w in history if start <= p][-1]
        source = next((s for s, edge in enumerate(np.cumsum(weights)) if u < edge), len(weights) - 1)
        epoch, offset = divmod(counts[source], source_rows[source])
        seed_s = int(np.random.SeedSequence([seed, source, epoch]).generate_state(1)[0])
        order = torch.randperm(source_rows[source], generator=torch.Generator().manual_seed(seed_s))
        rows.append(int(offsets[source]) + int(order[offset]))
        counts[source] += 1
    return rows, counts


def test_mixture_order_matches_the_rule_across_blocks_passes_and_a_weight_change():
    source_rows, seed = [7, 50, 3000], 11
    history = [(0, [0.2, 0.5, 0.3]), (5000, [0.6, 0.1, 0.3])]
    count = BLOCK + 6000  # three blocks; the small sources run through many passes
    expected, counts = reference_rows(source_rows, history, seed, count)
    order = MixtureOrder(source_rows, history, seed, shuffle=True)
    assert [order.row_at(p) for p in range(count)] == expected
    assert MixtureOrder(source_rows, history, seed, shuffle=True).rows_per_source(count) == counts  # cold start


def test_shares_follow_the_weights_and_earlier_draws_ignore_later_weights():
    order = MixtureOrder([100, 100], [(0, [0.25, 0.75])], seed=3, shuffle=False)
    counts = order.rows_per_source(40_000)
    assert abs(counts[0] / 40_000 - 0.25) < 0.01  # binomial std 0.002
    changed = MixtureOrder([100, 100], [(0, [0.25, 0.75]), (40_000, [0.9, 0.1])], seed=3, shuffle=False)
    assert changed.rows_per_source(40_000) == counts
    later = np.subtract(changed.rows_per_source(80_000), counts)
    assert abs(later[0] / 40_000 - 0.9) < 0.01


def test_mixture_settings_are_checked_in_one_line():
    assert [
        (e.name, e.weight)
        for e in mixture_entries({"a": {"weight": 1, "source": {}}, "b": {"weight": 3, "source": {}}})
    ] == [("a", 0.25), ("b", 0.75)]
    for cfg, message in [
        ({}, r"data\.mixture must map source names"),
        ({"a": {"weight": 0, "source": {}}}, r"data\.mixture\.a\.weight must be a positive number"),
        ({"a": {"weight": 1}}, r"data\.mixture\.a must have exactly the keys weight and source"),
        ({"a": {"weight": 1, "source": "embedded"}}, r"data\.mixture\.a\.source must be a source block"),
    ]:
        with pytest.raises(ConfigError, match=message):
            mixture_entries(cfg)


def mixture_module(tmp_path, weights=(0.3, 0.7)) -> TextDataModule:
    mixture = {
        "opening": {"weight": weights[0], "source": {"kind": "embedded", "max_documents": 300}},
        "later": {"weight": weights[1], "source": {"kind": "embedded", "skip_documents": 2626, "max_documents": 600}},
    }
    data = datamodule(tmp_path, None, mixture=mixture, seq_len=32, micro_batch_size=4, val_fraction=0.05)
    data.prepare_data()
    data.setup("fit")
    return data


def take(data: TextDataModule, count: int) -> list[list[list[int]]]:
    loader = iter(data.train_dataloader())
    return [next(loader)["input_ids"].tolist() for _ in range(count)]


def test_datamodule_resumes_mid_mixture_exactly_and_applies_changed_weights_from_there(tmp_path, caplog):
    data = mixture_module(tmp_path)
    assert data.source_names == ["opening", "later"]
    uninterrupted = take(data, 30)
    first = mixture_module(tmp_path)
    take(first, 12)
    state = first.state_dict()
    resumed = mixture_module(tmp_path)
    resumed.load_state_dict(state)
    assert take(resumed, 18) == uninterrupted[12:]
    reweighted = mixture_module(tmp_path, weights=(0.9, 0.1))
    with caplog.at_level(logging.INFO, logger="data.datamodule"):
        reweighted.load_state_dict(state)
    assert (
        "data.mixture weights changed since the checkpoint (opening 0.3 -> 0.9, later 0.7 -> 0.1); applied from row 48 on"
        in caplog.text
    )
    take(reweighted, 1)
    assert reweighted.rows_per_source(48) == first.rows_per_source(48)
    assert reweighted.state_dict()["mixture"]["weight_history"] == [(0, [0.3, 0.7]), (48, [0.9, 0.1])]


def test_validation_batches_come_per_source_and_are_tagged(tmp_path):
    data = mixture_module(tmp_path)
    batches = list(data.val_dataloader())
    names = [batch["source"] for batch in batches]
    assert names == sorted(names, key=["opening", "later"].index) and set(names) == {"opening", "later"}
    for name, rows in zip(data.source_names, data._val_parts()):
        expected = [rows.row(i)[:-1].tolist() for i in range(rows.num_rows)]
        assert [row for batch in batches if batch["source"] == name for row in batch["input_ids"].tolist()] == expected


def test_a_mixture_run_logs_each_source_and_resumes_exactly(tmp_path, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "cache"
    overrides = [o for o in TINY if not o.startswith("data.source")] + [
        "data=mixture",
        "data.mixture.sherlock.source.max_documents=300",
        "+data.mixture.other_books.source.max_documents=600",
        "token_budget=4096",
        "logger=csv",
        "callbacks.validation_schedule.every_n_steps=4",
        "callbacks.model_checkpoint.every_n_train_steps=8",
    ]
    run_to_completion(overrides, tmp_path / "full", cache)
    rows = load_run(tmp_path / "full").rows
    val = [row for row in rows if "val/loss/sherlock" in row]
    assert val and all("val/loss/other_books" in row and "val/loss" in row for row in val)
    train = [row for row in rows if "data/tokens/sherlock" in row]
    assert all(
        row["data/tokens/sherlock"] + row["data/tokens/other_books"] == row["train/tokens_seen"] for row in train
    )
    resumed = run_train(
        overrides + [f"ckpt_path={tmp_path / 'full/checkpoints/step000008.ckpt'}"], tmp_path / "resumed", cache
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    keys = ("step", "train/loss", "data/tokens/sherlock")
    again = [tuple(row[k] for k in keys) for row in load_run(tmp_path / "resumed").rows if "train/loss" in row]
    assert again == [tuple(row[k] for k in keys) for row in rows if "train/loss" in row and row["step"] > 8]
