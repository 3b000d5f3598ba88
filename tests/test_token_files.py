"""Pre-tokenized token files (`data.source.kind=tokens`): nanoGPT-style flat binaries and
`.npy` arrays used in place, against rows cut by hand from the ids that were written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.errors import ConfigError, DataError
from data.datamodule import TextDataModule

REPO = Path(__file__).resolve().parents[1]
SEQ = 16
EOS = 256


def ids(count: int, seed: int) -> np.ndarray:
    """Byte-tokenizer ids with a separator now and then."""
    values = np.random.default_rng(seed).integers(0, 257, size=count)
    return values.astype(np.int64)


def module(tmp_path: Path, source: dict, **overrides) -> TextDataModule:
    settings = dict(
        tokenizer={"kind": "byte"},
        seq_len=SEQ,
        micro_batch_size=2,
        val_fraction=0.1,
        val_max_rows=None,
        shuffle=False,
        seed=0,
        cache_dir=str(tmp_path / "cache"),
    )
    settings.update(overrides)
    data = TextDataModule(source={"kind": "tokens", **source}, **settings)
    data.prepare_data()
    data.setup("fit")
    return data


def rows_by_hand(stream: np.ndarray) -> list[list[int]]:
    width = SEQ + 1
    return [list(stream[k * width : (k + 1) * width]) for k in range(len(stream) // width)]


def all_rows(rows) -> list[list[int]]:
    return [list(rows.row(i)) for i in range(rows.num_rows)]


def test_flat_uint16_and_npy_files_pack_per_file_with_each_tail_held_out(tmp_path):
    first, second = ids(1000, 1), ids(700, 2)
    first.astype(np.uint16).tofile(tmp_path / "train.bin")
    np.save(tmp_path / "shard.npy", second.astype(np.uint16))
    raw = module(tmp_path, {"paths": [str(tmp_path / "train.bin")], "dtype": "uint16"})
    assert all_rows(raw._rows("train")) == rows_by_hand(first[:900])
    assert all_rows(raw._rows("val")) == rows_by_hand(first[900:])
    both = module(tmp_path, {"paths": [str(tmp_path / "train.bin"), str(tmp_path / "shard.npy")], "dtype": "uint16"})
    # no row joins the end of one file to the start of the next
    assert all_rows(both._rows("train")) == rows_by_hand(first[:900]) + rows_by_hand(second[:630])
    assert all_rows(both._rows("val")) == rows_by_hand(first[900:]) + rows_by_hand(second[630:])
    batch = next(iter(both.train_dataloader()))
    assert batch["input_ids"].tolist() == [row[:-1] for row in rows_by_hand(first[:900])[:2]]
    assert batch["labels"].tolist() == [row[1:] for row in rows_by_hand(first[:900])[:2]]


def test_declared_validation_files_are_the_validation_split(tmp_path):
    train, val = ids(800, 3), ids(300, 4)
    train.astype(np.uint32).tofile(tmp_path / "train.bin")
    val.astype(np.uint32).tofile(tmp_path / "val.bin")
    data = module(
        tmp_path, {"paths": [str(tmp_path / "train.bin")], "val_paths": [str(tmp_path / "val.bin")], "dtype": "uint32"}
    )
    assert all_rows(data._rows("train")) == rows_by_hand(train)
    assert all_rows(data._rows("val")) == rows_by_hand(val)


def test_bad_token_files_get_one_line_naming_the_file_and_the_fix(tmp_path):
    good = tmp_path / "good.bin"
    ids(500, 5).astype(np.uint16).tofile(good)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x00\x02")
    np.save(tmp_path / "wide.npy", ids(500, 6).astype(np.uint32))
    np.save(tmp_path / "table.npy", ids(500, 6).astype(np.uint32).reshape(50, 10))
    cases = [
        ({"paths": [str(good)]}, ConfigError, r"data\.source\.dtype is not set.*set data\.source\.dtype=uint16"),
        (
            {"paths": [str(good)], "dtype": "int8"},
            ConfigError,
            r"data\.source\.dtype='int8' is not valid; choose one of: uint16, uint32",
        ),
        (
            {"paths": [str(tmp_path / "odd.bin")], "dtype": "uint16"},
            DataError,
            r"odd\.bin has 3 bytes, not a positive multiple of 2 \(uint16\)",
        ),
        (
            {"paths": [str(good)], "dtype": "uint32"},
            DataError,
            r"good\.bin holds token id \d+ at position \d+, outside the vocabulary of data\.tokenizer \(257 ids\).*read as uint32",
        ),
        (
            {"paths": [str(tmp_path / "wide.npy")], "dtype": "uint16"},
            DataError,
            r"wide\.npy holds uint32 ids \(its \.npy header\) but data\.source\.dtype=uint16",
        ),
        (
            {"paths": [str(tmp_path / "table.npy")]},
            DataError,
            r"table\.npy holds a <u4 array of shape \(50, 10\); token files must be one-dimensional",
        ),
        (
            {"paths": [str(good)], "dtype": "uint16", "eos_id": 0},
            ConfigError,
            r"data\.source\.eos_id=0 but data\.tokenizer's end-of-document token is 256",
        ),
        (
            {"paths": [str(tmp_path / "missing.bin")], "dtype": "uint16"},
            DataError,
            r"data\.source\.paths: '.*missing\.bin' matches no file",
        ),
    ]
    for source, error, message in cases:
        with pytest.raises(error, match=message):
            module(tmp_path, source)
    with pytest.raises(
        ConfigError, match=r"data\.tokenizer\.kind=bpe learns from text, and data\.source\.kind=tokens has none"
    ):
        module(tmp_path, {"paths": [str(good)], "dtype": "uint16"}, tokenizer={"kind": "bpe"})


def test_a_rewritten_file_is_checked_again(tmp_path):
    path = tmp_path / "train.bin"
    ids(500, 7).astype(np.uint16).tofile(path)
    module(tmp_path, {"paths": [str(path)], "dtype": "uint16"})
    values = ids(500, 7).astype(np.uint16)
    values[123] = 300
    values.tofile(path)
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    with pytest.raises(DataError, match=r"holds token id 300 at position 123"):
        module(tmp_path, {"paths": [str(path)], "dtype": "uint16"})


def test_train_py_trains_on_a_nanogpt_style_bin_without_any_text(tmp_path):
    text = ("The quick brown fox jumps over the lazy dog. " * 400).encode()
    np.frombuffer(text, dtype=np.uint8).astype(np.uint16).tofile(tmp_path / "train.bin")
    result = subprocess.run(
        [
            sys.executable,
            "train.py",
            "logger=csv",
            "callbacks=none",
            "token_budget=4000",
            "data.seq_len=32",
            "data.source.kind=tokens",
            f"data.source.paths=[{tmp_path / 'train.bin'}]",
            "data.source.dtype=uint16",
            f"paths.output_dir={tmp_path / 'out'}",
            f"paths.cache_dir={tmp_path / 'cache'}",
            "model.n_layers=1",
            "model.d_model=32",
            "model.n_heads=2",
            "model.n_kv_heads=1",
            "model.mlp_hidden=64",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "finished at step" in result.stderr + result.stdout
