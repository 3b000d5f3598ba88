"""Tests of the data pipeline, each against an independent reference computed here.

Corpora are tiny files under tmp_path; one test reads the real embedded corpus, capped.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import data.sources
import data.token_cache
from common.errors import ConfigError, DataError
from data.bpe import train_bpe
from data.datamodule import TextDataModule
from data.sampler import ResumableRankSampler
from data.sources import build_source
from data.split import ValidationSplit
from data.token_cache import build_token_cache, open_token_cache
from data.tokenizers import ByteTokenizer, build_tokenizer
from tests.run_helpers import datamodule, run_script

EOS = 256
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hum; café naïve über 東京 ✓".split()

REPO = Path(__file__).resolve().parents[1]


def make_documents(count: int, seed: int = 0) -> list[str]:
    """Varied documents: different lengths, non-ASCII text, single newlines."""
    rng = np.random.default_rng(seed)
    return [
        " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), size=int(rng.integers(3, 60))))
        + ("\nsecond line." if i % 3 == 0 else "")
        for i in range(count)
    ]


def write_jsonl(path: Path, documents: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: doc, "id": i}) + "\n" for i, doc in enumerate(documents)))
    return path


def is_val_reference(index: int, fraction: float) -> bool:
    exact = Fraction(str(fraction))
    return math.floor((index + 1) * exact) > math.floor(index * exact)


def byte_stream(documents: list[str]) -> list[int]:
    """The token stream the cache must hold: each document's UTF-8 bytes, then EOS."""
    return [token for doc in documents for token in [*doc.encode("utf-8"), EOS]]


def ready(module: TextDataModule) -> TextDataModule:
    module.prepare_data()
    module.setup("fit")
    return module


def take(loader, count: int) -> list[torch.Tensor]:
    iterator = iter(loader)
    return [next(iterator)["input_ids"] for _ in range(count)]


class CountingTokenizer(ByteTokenizer):
    """A byte tokenizer that counts batch calls and can fail on a chosen call."""

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.calls = 0
        self.fail_on_call = fail_on_call

    def encode_batch(self, texts):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("simulated crash mid-build")
        return super().encode_batch(texts)


# -- tokenizers ------------------------------------------------------------------------------


def test_byte_tokenizer_round_trips_and_uses_utf8_bytes():
    tokenizer = build_tokenizer({"kind": "byte"}, cache_dir="unused")
    text = "Plain ASCII, café, 東京, emoji 🚀.\n\tend"
    ids = tokenizer.encode(text)
    assert list(ids) == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode([*ids, tokenizer.eos_id]) == text
    assert (tokenizer.vocab_size, tokenizer.eos_id) == (257, 256)
    assert [list(x) for x in tokenizer.encode_batch(["ab", "é"])] == [[97, 98], [0xC3, 0xA9]]


def test_bpe_tokenizer_trains_on_training_documents_caches_and_round_trips(tmp_path, monkeypatch):
    documents = make_documents(200)
    source = {"kind": "files", "paths": [str(write_jsonl(tmp_path / "docs.jsonl", documents))]}
    tokenizer_cfg = {"kind": "bpe", "vocab_size": 320}
    first = datamodule(tmp_path, source, tokenizer=tokenizer_cfg).tokenizer
    cached = list((tmp_path / "cache" / "tokenizers").glob("bpe-*/tokenizer.json"))
    assert len(cached) == 1
    assert first.vocab_size == 320
    text = "the lazy wizards hum über 東京 ✓\nnew words: zebra!"
    assert first.decode(first.encode(text)) == text
    assert len(first.encode("the quick brown fox")) < len("the quick brown fox".encode())

    def no_training(*args, **kwargs):
        raise AssertionError("the cached tokenizer should have been reused")

    monkeypatch.setattr("data.bpe.train_bpe", no_training)
    second = datamodule(tmp_path, source, tokenizer=tokenizer_cfg).tokenizer
    assert second.fingerprint == first.fingerprint
    assert list(second.encode(text)) == list(first.encode(text))
    assert second.eos_id == first.eos_id and first.decode([first.eos_id]) == ""


def test_file_tokenizer_loads_tokenizer_json_and_finds_eos(tmp_path):
    path = tmp_path / "tokenizer.json"
    train_bpe(iter(make_documents(50)), vocab_size=300).save(str(path))
    tokenizer = build_tokenizer({"kind": "file", "path": str(path)}, cache_dir=tmp_path)
    assert tokenizer.eos_id == 0  # <|endoftext|> is the trainer's first special token
    text = "a lazy dog, café"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert [list(x) for x in tokenizer.encode_batch([text])] == [list(tokenizer.encode(text))]
    with pytest.raises(ValueError, match=r"data\.tokenizer\.eos_token.*'<missing>'"):
        build_tokenizer({"kind": "file", "path": str(path), "eos_token": "<missing>"}, cache_dir=tmp_path)


def test_hf_tokenizer_from_local_folder_and_clear_offline_error(tmp_path):
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "hf_tokenizer"
    library_tokenizer = train_bpe(iter(make_documents(50)), vocab_size=300)
    PreTrainedTokenizerFast(tokenizer_object=library_tokenizer, eos_token="<|endoftext|>").save_pretrained(folder)
    tokenizer = build_tokenizer({"kind": "hf", "name": str(folder)}, cache_dir=tmp_path)
    text = "seven wizards hum über 東京"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_id == library_tokenizer.token_to_id("<|endoftext|>")
    assert tokenizer.vocab_size == 300
    with pytest.raises(DataError, match=r"data\.tokenizer\.name='no-such-org/no-such-tokenizer'.*network"):
        build_tokenizer({"kind": "hf", "name": "no-such-org/no-such-tokenizer"}, cache_dir=tmp_path)


# -- sources ---------------------------------------------------------------------------------


def read_documents(cfg: dict, tmp_path: Path) -> list[str]:
    return [doc for batch in build_source(cfg).batches(tmp_path / "hf") for doc in batch]


def test_json_jsonl_parquet_sources_read_text_field(tmp_path):
    documents = make_documents(30)
    jsonl = write_jsonl(tmp_path / "a.jsonl", documents[:10], field="body")
    parquet = tmp_path / "b.parquet"
    pq.write_table(pa.table({"body": documents[10:20], "n": list(range(10))}), parquet)
    json_array = tmp_path / "c.json"
    json_array.write_text(json.dumps([{"body": doc} for doc in documents[20:]] + [{"body": "  "}]))
    cfg = {"kind": "files", "paths": [str(jsonl), str(parquet), str(json_array)], "text_field": "body"}
    # one `datasets` stream per format, in the order formats first appear: json files, then parquet
    assert read_documents(cfg, tmp_path) == documents[:10] + documents[20:] + documents[10:20]
    assert read_documents({**cfg, "max_documents": 4}, tmp_path) == documents[:4]
    with pytest.raises(ValueError, match=r"data\.source\.text_field='text'.*columns found: \['body', 'n'\]"):
        read_documents({**cfg, "paths": [str(parquet)], "text_field": "text"}, tmp_path)


def test_text_files_split_into_paragraph_documents_skipping_empty_ones(tmp_path):
    (tmp_path / "one.txt").write_text("First para\nstill first.\n\nSecond para.\n\n\n\nThird.\n")
    (tmp_path / "two.txt").write_text("Other file.")
    cfg = {"kind": "files", "paths": [str(tmp_path / "*.txt")]}
    assert read_documents(cfg, tmp_path) == ["First para\nstill first.", "Second para.", "Third.\n", "Other file."]
    assert read_documents({**cfg, "sample_by": "line"}, tmp_path)[:2] == ["First para", "still first."]


def test_markdown_and_rst_are_read_as_text_and_a_declared_format_overrides_the_extension(tmp_path):
    (tmp_path / "play.md").write_text("# Act I\n\nEnter Hamlet.\n")
    (tmp_path / "notes.rst").write_text("Notes\n=====\n\nA line.")
    (tmp_path / "corpus.dat").write_text('{"text": "from json"}\n')
    cfg = {"kind": "files", "paths": [str(tmp_path / "play.md"), str(tmp_path / "notes.rst")]}
    assert read_documents(cfg, tmp_path) == ["# Act I", "Enter Hamlet.\n", "Notes\n=====", "A line."]
    declared = {"kind": "files", "paths": [str(tmp_path / "corpus.dat")], "format": "json"}
    assert read_documents(declared, tmp_path) == ["from json"]
    as_text = {**declared, "format": "text"}
    assert read_documents(as_text, tmp_path) == ['{"text": "from json"}\n']
    assert build_source(as_text).description != build_source(declared).description  # separate token caches
    with pytest.raises(
        ConfigError, match=r"data\.source\.format='csv' is not valid; choose one of: text, json, parquet"
    ):
        build_source({**declared, "format": "csv"})


def test_hub_source_offline_gives_a_clear_error(tmp_path):
    source = build_source({"kind": "hub", "name": "no-such-org/no-such-dataset", "max_documents": 10})
    with pytest.raises(DataError, match=r"data\.source\.name='no-such-org/no-such-dataset'.*network"):
        next(source.batches(tmp_path / "hf"))


# -- token cache, split and packing ---------------------------------------------------------


def test_validation_split_is_evenly_spaced_and_exact():
    for fraction in (0.005, 0.1, 0.25, 0.3333, 0.49):
        split = ValidationSplit(fraction)
        picks = [split.is_validation(i) for i in range(2000)]
        assert picks == [is_val_reference(i, fraction) for i in range(2000)]
        for n in (1, 7, 199, 200, 2000):
            assert sum(picks[:n]) == math.floor(n * Fraction(str(fraction)))
    assert list(ValidationSplit(0.25).training_documents([["a", "b", "c"], ["d", "e"]])) == ["a", "b", "c", "e"]


def test_cache_holds_exactly_the_documents_and_rows_pack_them(tmp_path):
    documents = make_documents(61)
    with_blank = documents[:40] + [" \n "] + documents[40:]  # a blank document is skipped, not counted
    source = {"kind": "files", "paths": [str(write_jsonl(tmp_path / "d.jsonl", with_blank))]}
    module = ready(datamodule(tmp_path, source, seq_len=16, val_fraction=0.1))
    val_docs = [doc for i, doc in enumerate(documents) if is_val_reference(i, 0.1)]
    train_docs = [doc for i, doc in enumerate(documents) if not is_val_reference(i, 0.1)]
    assert len(val_docs) == 6 and not set(val_docs) & set(train_docs)
    cache = open_token_cache(tmp_path / "cache" / module.fingerprint)
    assert cache.train.dtype == np.uint16
    assert list(cache.train[:]) == byte_stream(train_docs)
    assert list(cache.val[:]) == byte_stream(val_docs)
    assert cache.meta["train_documents"] == 55 and cache.meta["val_documents"] == 6
    for rows, stream in ((module._train_rows, byte_stream(train_docs)), (module._rows("val"), byte_stream(val_docs))):
        assert rows.num_rows == len(stream) // 17
        packed = [token for k in range(rows.num_rows) for token in rows.row(k)]
        assert packed == stream[: rows.num_rows * 17]
        batch = rows.batch([2, 0])
        assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape == (2, 16)
        assert batch["input_ids"][0].tolist() == stream[34:50] and batch["labels"][0].tolist() == stream[35:51]


def test_max_tokens_stops_after_the_document_that_reaches_it(tmp_path):
    documents = make_documents(40)
    path = write_jsonl(tmp_path / "d.jsonl", documents)
    source = build_source({"kind": "files", "paths": [str(path)], "max_tokens": 500})
    meta = open_token_cache(build_token_cache(source, ByteTokenizer(), tmp_path / "cache", 0.25)).meta
    lengths = np.cumsum([len(doc.encode()) + 1 for doc in documents])
    kept = int(np.searchsorted(lengths, 500)) + 1
    assert meta["train_documents"] + meta["val_documents"] == kept
    assert meta["train_tokens"] + meta["val_tokens"] == lengths[kept - 1] >= 500


def test_cache_is_reused_without_retokenizing(tmp_path):
    source = build_source({"kind": "files", "paths": [str(write_jsonl(tmp_path / "d.jsonl", make_documents(20)))]})
    tokenizer = CountingTokenizer()
    first = build_token_cache(source, tokenizer, tmp_path / "cache", 0.25)
    calls, mtime = tokenizer.calls, (first / "train-00000.bin").stat().st_mtime_ns
    second = build_token_cache(source, tokenizer, tmp_path / "cache", 0.25)
    assert second == first and tokenizer.calls == calls > 0
    assert (first / "train-00000.bin").stat().st_mtime_ns == mtime
    assert build_token_cache(source, tokenizer, tmp_path / "cache", 0.2) != first  # val_fraction is in the key


def test_interrupted_build_leaves_no_complete_looking_cache_and_the_next_one_continues_it(tmp_path, monkeypatch):
    monkeypatch.setattr(data.token_cache, "SHARD_DOCUMENTS", 6)
    monkeypatch.setattr(data.token_cache, "ENCODE_BATCH", 3)
    documents = make_documents(40)
    source = build_source({"kind": "files", "paths": [str(write_jsonl(tmp_path / "d.jsonl", documents))]})
    reference = open_token_cache(build_token_cache(source, ByteTokenizer(), tmp_path / "reference", 0.25))
    cache_dir = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_token_cache(source, CountingTokenizer(fail_on_call=8), cache_dir, 0.25)  # in shard 3 (2 calls a shard)
    assert not list(cache_dir.glob("*/meta.json")) and not list(cache_dir.glob("*/*/meta.json"))
    resumed_tokenizer = CountingTokenizer()
    built = open_token_cache(build_token_cache(source, resumed_tokenizer, cache_dir, 0.25))
    assert resumed_tokenizer.calls == 2 * 4  # shards 3..6 only, two calls each (the last holds 4 documents)
    assert (
        list(built.train[:])
        == list(reference.train[:])
        == byte_stream([d for i, d in enumerate(documents) if not is_val_reference(i, 0.25)])
    )
    assert list(built.val[:]) == list(reference.val[:])
    assert {k: v for k, v in built.meta.items() if k != "build_seconds"} == {
        k: v for k, v in reference.meta.items() if k != "build_seconds"
    }
    assert [p.name for p in cache_dir.iterdir() if p.name != "hf_datasets"] == [built.directory.name]


def test_a_killed_build_process_is_continued_by_the_next_process(tmp_path):
    """kill -9 mid-build (after some shards), then a new process: the cache equals an uninterrupted build."""
    documents = make_documents(60)
    corpus = write_jsonl(tmp_path / "d.jsonl", documents)
    script = tmp_path / "build.py"
    script.write_text(
        "import logging, sys, time\nlogging.basicConfig(level=logging.INFO)\nimport data.token_cache as tc\nfrom data.sources import build_source\n"
        "from data.tokenizers import ByteTokenizer\ntc.SHARD_DOCUMENTS = 5\n"
        "class Slow(ByteTokenizer):\n    def encode_batch(self, texts):\n        time.sleep(float(sys.argv[2]))\n"
        "        return super().encode_batch(texts)\n"
        f"source = build_source({{'kind': 'files', 'paths': [{str(corpus)!r}]}})\n"
        "print(tc.build_token_cache(source, Slow(), sys.argv[1], 0.25))\n"
    )
    run = [sys.executable, str(script)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.Popen([*run, str(tmp_path / "cache"), "0.3"], cwd=REPO, env=env)
    staging = None
    deadline = time.monotonic() + 60
    while staging is None and time.monotonic() < deadline:
        staging = next(iter((tmp_path / "cache").glob(".*.tmp-*/shard-00002.json")), None)
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert staging is not None and not list((tmp_path / "cache").glob("*/meta.json"))
    resumed = subprocess.run(
        [*run, str(tmp_path / "cache"), "0"], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    whole = subprocess.run(
        [*run, str(tmp_path / "whole"), "0"], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert "shards (" in resumed.stderr and "were finished before" in resumed.stderr
    a, b = open_token_cache(resumed.stdout.strip()), open_token_cache(whole.stdout.strip())
    assert list(a.train[:]) == list(b.train[:]) and list(a.val[:]) == list(b.val[:]) and a.meta["shards"] == 12


# -- sampler ----------------------------------------------------------------------------------


def global_order(num_rows: int, seed: int, length: int) -> list[int]:
    """Reference: concatenated per-epoch permutations seeded with seed + epoch."""
    order: list[int] = []
    epoch = 0
    while len(order) < length:
        order += torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        epoch += 1
    return order[:length]


def batches(sampler: ResumableRankSampler, count: int) -> list[list[int]]:
    iterator = iter(sampler)
    return [next(iterator) for _ in range(count)]


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_rank_shards_partition_the_global_order(dp_size):
    num_rows, b, groups = 23, 3, 12  # groups straddle epoch boundaries (23 is not a multiple of b * dp)
    per_rank = [batches(ResumableRankSampler(num_rows, b, r, dp_size, seed=5), groups) for r in range(dp_size)]
    interleaved = [i for g in range(groups) for rank in per_rank for i in rank[g]]
    assert interleaved == global_order(num_rows, 5, groups * b * dp_size)
    single = batches(ResumableRankSampler(num_rows, b * dp_size, 0, 1, seed=5), groups)
    assert interleaved == [i for batch in single for i in batch]
    first_epoch = [i for rank in per_rank for batch in rank[: num_rows // (b * dp_size)] for i in batch]
    assert len(first_epoch) == len(set(first_epoch))  # disjoint across ranks within an epoch


def test_sampler_resume_matches_uninterrupted_run_across_epochs():
    num_rows, b, dp = 23, 2, 2
    uninterrupted = batches(ResumableRankSampler(num_rows, b, 1, dp, seed=7), 30)
    for consumed_batches in (0, 5, 6, 11, 17):
        resumed = ResumableRankSampler(num_rows, b, 1, dp, seed=7, position=consumed_batches * b * dp)
        assert batches(resumed, 30 - consumed_batches) == uninterrupted[consumed_batches:]
        assert resumed.position == 30 * b * dp
    epochs = global_order(num_rows, 7, 2 * num_rows)
    assert epochs[:num_rows] != epochs[num_rows:] and sorted(epochs[num_rows:]) == list(range(num_rows))


def test_sampler_position_counts_groups_and_sequential_order():
    sampler = ResumableRankSampler(10, 2, 1, 2, shuffle=False, position=8)
    iterator = iter(sampler)
    assert next(iterator) == [0, 1] and sampler.position == 12  # positions 10, 11 wrap to epoch 1
    assert next(iterator) == [4, 5] and sampler.position == 16
    assert next(iter(sampler)) == [8, 9]  # a new iterator continues from the position


def test_sampler_rejects_start_position_off_group_boundary():
    with pytest.raises(ValueError, match=r"start position 6 .* micro_batch_size \* dp_size = 2 \* 2 = 4"):
        ResumableRankSampler(100, 2, 0, 2, position=6)


# -- datamodule -------------------------------------------------------------------------------


def rank_of(rank: int, size: int) -> SimpleNamespace:
    """What the data module reads from a Trainer of `size` processes on process `rank`."""
    return SimpleNamespace(global_rank=rank, world_size=size, lightning_module=None)


def test_datamodule_resume_gives_the_same_next_batches(tmp_path):
    source = {"kind": "files", "paths": [str(write_jsonl(tmp_path / "d.jsonl", make_documents(40)))]}
    original = ready(datamodule(tmp_path, source))
    original.trainer = rank_of(1, 2)
    loader = iter(original.train_dataloader())
    [next(loader) for _ in range(5)]
    state = original.state_dict()
    assert state["rows_consumed"] == 5 * 2 * 2
    expected = [next(loader)["input_ids"] for _ in range(30)]  # past a data epoch boundary

    resumed = ready(datamodule(tmp_path, source))
    resumed.trainer = rank_of(1, 2)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(take(resumed.train_dataloader(), 30), expected))


class Recorder(L.LightningModule):
    """A do-nothing model that records the first token of every row it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch["input_ids"][:, 0].tolist())
        return (self.weight * batch["input_ids"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_lightning_fit_resumed_from_checkpoints_sees_the_uninterrupted_batches(tmp_path):
    """Through a real Trainer, which prefetches from loaders without a length and restarts
    its epochs: resuming mid-epoch, at an epoch end and after it must not shift the data."""
    source = {"kind": "files", "paths": [str(write_jsonl(tmp_path / "d.jsonl", make_documents(30)))]}
    settings = dict(seq_len=32, micro_batch_size=4)
    epoch = len(ready(datamodule(tmp_path, source, **settings)).train_dataloader())
    total = 2 * epoch + 3  # crosses Lightning epoch ends and a data epoch

    def fit(ckpt_path: str | None = None, **trainer_args) -> Recorder:
        trainer = L.Trainer(
            max_steps=total,
            max_epochs=-1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
            accelerator="cpu",
            devices=1,
            default_root_dir=tmp_path,
            **trainer_args,
        )
        recorder = Recorder()
        trainer.fit(recorder, datamodule=datamodule(tmp_path, source, **settings), ckpt_path=ckpt_path)
        return recorder

    checkpoints = ModelCheckpoint(tmp_path / "ckpt", "{step}", save_top_k=-1, every_n_train_steps=1)
    uninterrupted = fit(callbacks=[checkpoints]).seen
    assert len(uninterrupted) == total and epoch > 3
    for step in (3, epoch, epoch + 1):
        resumed = fit(ckpt_path=str(tmp_path / "ckpt" / f"step={step}.ckpt"), enable_checkpointing=False).seen
        assert resumed == uninterrupted[step:]


def test_validation_rows_split_evenly_over_ranks(tmp_path):
    source = {"kind": "files", "paths": [str(write_jsonl(tmp_path / "d.jsonl", make_documents(80)))]}
    module = ready(datamodule(tmp_path, source, val_max_rows=14))
    total = min(module.num_val_rows, 14) // 3 * 3
    shards = []
    for rank in range(3):
        module.trainer = rank_of(rank, 3)
        shards.append(torch.cat([b["input_ids"] for b in module.val_dataloader()]))
    assert len({len(shard) for shard in shards}) == 1
    expected = torch.stack([torch.from_numpy(module._rows("val").row(k)[:-1].astype(np.int64)) for k in range(total)])
    assert torch.equal(torch.stack(shards, dim=1).reshape(total, -1), expected)


def test_load_state_dict_rejects_other_data_and_misaligned_positions(tmp_path):
    source = {"kind": "files", "paths": [str(write_jsonl(tmp_path / "d.jsonl", make_documents(30)))]}
    module = ready(datamodule(tmp_path, source))
    state = module.state_dict()
    with pytest.raises(ValueError, match=r"data\.source, data\.tokenizer or data\.val_fraction"):
        ready(datamodule(tmp_path, source, val_fraction=0.2)).load_state_dict(state)
    with pytest.raises(ValueError, match=r"data\.seq_len=16"):
        module.load_state_dict({**state, "seq_len": 32})
    with pytest.raises(ValueError, match=r"start position 3 .*micro_batch_size \* dp_size"):
        module.load_state_dict({**state, "rows_consumed": 3})


def test_too_little_data_for_the_packing_names_the_settings(tmp_path):
    source = {"kind": "files", "paths": [str(write_jsonl(tmp_path / "d.jsonl", make_documents(8)))]}
    with pytest.raises(ValueError, match=r"training split has \d+ rows.*data\.seq_len"):
        ready(datamodule(tmp_path, source, seq_len=2048))
    with pytest.raises(ValueError, match=r"validation split has 0 usable rows.*data\.val_fraction"):
        ready(datamodule(tmp_path, source, seq_len=64, val_fraction=0.01))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"source": {"kind": "web"}}, r"data\.source\.kind='web'.*embedded, files, hub"),
        ({"source": {"kind": "files", "paths": ["/nonexistent/*.txt"]}}, r"data\.source\.paths.*matches no file"),
        ({"source": {"kind": "files", "paths": ["{tmp}/d.csv"]}}, r"data\.source\.paths.*unsupported extension"),
        ({"source": {"kind": "hub", "name": "org/corpus"}}, r"data\.source\.max_tokens"),
        ({"source": {"kind": "embedded", "max_document": 5}}, r"data\.source has unknown key\(s\) \['max_document'\]"),
        ({"source": {"kind": "embedded", "max_tokens": -1}}, r"data\.source\.max_tokens must be a positive integer"),
        ({"tokenizer": {"kind": "sentencepiece"}}, r"data\.tokenizer\.kind='sentencepiece'.*byte, bpe, file, hf"),
        ({"tokenizer": {"kind": "file", "path": "/nonexistent.json"}}, r"data\.tokenizer\.path"),
        ({"tokenizer": {"kind": "bpe", "vocab_size": 100}}, r"data\.tokenizer\.vocab_size must be an integer >= 258"),
        ({"val_fraction": 0.0}, r"data\.val_fraction must be a number in \(0, 0\.5\)"),
        ({"val_fraction": 0.5}, r"data\.val_fraction"),
        ({"seq_len": 4}, r"data\.seq_len must be an integer >= 8"),
        ({"micro_batch_size": 0}, r"batch\.micro_batch_size"),
        ({"val_max_rows": 0}, r"data\.val_max_rows"),
    ],
)
def test_bad_settings_fail_early_naming_the_setting(tmp_path, overrides, message):
    (tmp_path / "d.csv").write_text("text\nhello\n")
    settings = {
        "source": {"kind": "embedded"},
        "tokenizer": {"kind": "byte"},
        "cache_dir": str(tmp_path / "cache"),
        "seq_len": 16,
        "micro_batch_size": 2,
        "val_fraction": 0.25,
        "val_max_rows": None,
        "shuffle": True,
        "seed": 0,
    }
    settings.update(json.loads(json.dumps(overrides).replace("{tmp}", str(tmp_path))))
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        TextDataModule(**settings)
    assert not (tmp_path / "cache").exists()  # nothing was read or written


def test_hydra_data_configs_compose_and_instantiate(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    (tmp_path / "a.txt").write_text("one\n\ntwo")
    common = ["+seed=3", f"+paths.cache_dir={tmp_path / 'cache'}"]
    conf_dir = str(Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(config_dir=conf_dir, version_base=None):
        modules = {
            name: instantiate(compose(overrides=[f"+data={name}", *common, *extra]).data, micro_batch_size=4)
            for name, extra in {
                "embedded": ["data.tokenizer.kind=bpe"],
                "local_files": [f"data.source.paths=[{tmp_path / '*.txt'}]", "data.source.max_tokens=1e6"],
                "hub": [],
            }.items()
        }
    assert modules["embedded"].micro_batch_size == 4 and modules["embedded"].seed == 3
    assert modules["embedded"].tokenizer_config == {"kind": "bpe", "vocab_size": 4096, "max_train_documents": 100_000}
    assert modules["local_files"].parts[0].source.max_tokens == 1_000_000
    assert modules["hub"].parts[0].source.description["name"] == "HuggingFaceFW/fineweb-edu"


def test_embedded_corpus_builds_a_small_capped_cache(tmp_path):
    module = ready(datamodule(tmp_path, {"kind": "embedded", "max_documents": 300}, seq_len=64, val_fraction=0.01))
    cache = open_token_cache(tmp_path / "cache" / module.fingerprint)
    assert cache.meta["train_documents"] + cache.meta["val_documents"] == 300
    assert module.tokenizer.decode(cache.train[:64]).startswith("The Project Gutenberg EBook of The Adventures")
    batch = next(iter(module.train_dataloader()))
    assert batch["input_ids"].shape == (2, 64) and int(batch["input_ids"].max()) <= EOS


def test_prepare_data_script_builds_the_cache_a_run_then_reuses(tmp_path):
    """scripts/prepare_data.py tokenizes on its own (a CPU node's job); a run with the same data
    settings finds the cache complete, and a misspelt key is one line with exit code 2."""
    (tmp_path / "a.txt").write_text("one paragraph\n\nanother one\n" * 200)
    data_args = [
        "data=local_files",
        f"data.source.paths=[{tmp_path / 'a.txt'}]",
        f"paths.cache_dir={tmp_path / 'cache'}",
    ]
    script = REPO / "scripts" / "prepare_data.py"
    built = run_script(script, data_args)
    assert built.returncode == 0, built.stderr[-2000:]
    (cache,) = (tmp_path / "cache").glob("*/meta.json")
    source = {"kind": "files", "paths": [str(tmp_path / "a.txt")], "sample_by": "paragraph", "text_field": "text"}
    # The run's split and seed; the row length and micro-batch are not in the cache's fingerprint.
    module = datamodule(tmp_path, source, val_fraction=0.005, val_max_rows=512, seed=1234)
    assert module.fingerprint == cache.parent.name and module.fingerprint in built.stdout
    wrong = run_script(script, ["data.source.kindd=files"])
    assert (wrong.returncode, wrong.stderr.strip()) == (
        2,
        "error: data.source.kindd is not a setting; did you mean "
        "data.source.kind? (`python train.py --cfg job` prints the config and its keys)",
    )
