"""Every mistake in data settings or files ends in one `ConfigError` or `DataError`.

Each error must be one line naming the setting or file (and the place in it) and the
fix, and must leave the cache as it was: no folder with a `meta.json` for a failed
build, no temporary build folder. Corpora are tiny files under tmp_path.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

import data.corpus_checks
import data.sources
from common.errors import ConfigError, DataError
from data.datamodule import TextDataModule
from data.sources import build_source
from data.split import ValidationSplit
from data.token_cache import build_token_cache, staging_prefix
from data.tokenizers import ByteTokenizer
from tests.run_helpers import compose_config, datamodule

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards hum".split()


def documents(count: int) -> list[str]:
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(5 + i % 7)) for i in range(count)]


def jsonl(records: list[object]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def good_lines(count: int = 40) -> str:
    return jsonl([{"text": text} for text in documents(count)])


def files_source(*paths: Path, **settings) -> dict:
    return {"kind": "files", "paths": [str(path) for path in paths], **settings}


def build(module: TextDataModule) -> None:
    module.prepare_data()
    module.setup("fit")


def raised(error_type: type[Exception], call, *args, **kwargs) -> str:
    """Call and return the message of the error it must raise, checking it is one line."""
    with pytest.raises(error_type) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def assert_no_cache(cache_dir: Path) -> None:
    """No build looks complete and no temporary build folder is left."""
    if cache_dir.exists():
        assert list(cache_dir.rglob("meta.json")) == []
        assert [path.name for path in cache_dir.iterdir() if ".tmp-" in path.name] == []
        assert list(cache_dir.glob("tokenizers/*/tokenizer.json")) == []


# -- 1. bad scalar settings ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"seq_len": 4}, r"^data\.seq_len must be an integer >= 8, got 4$"),
        ({"seq_len": "abc"}, r"^data\.seq_len must be an integer >= 8, got 'abc'$"),
        ({"val_fraction": 0.7}, r"^data\.val_fraction must be a number in \(0, 0\.5\), got 0\.7$"),
        ({"val_fraction": "abc"}, r"^data\.val_fraction must be a number"),
        ({"micro_batch_size": 0}, r"^batch\.micro_batch_size must be an integer >= 1"),
        ({"val_max_rows": 0}, r"^data\.val_max_rows must be a positive integer or null"),
        ({"shuffle": "yes"}, r"^data\.shuffle must be true or false"),
        ({"seed": 1.5}, r"^data\.seed must be an integer"),
        ({"source": {"kind": "embedded", "max_tokens": "abc"}}, r"^data\.source\.max_tokens must be a positive"),
        ({"source": {"kind": "files", "paths": []}}, r"^data\.source\.paths must be a list of file paths or globs"),
        ({"source": {"kind": "files", "paths": ["*"], "sample_by": "word"}}, r"^data\.source\.sample_by='word'"),
        ({"source": {"kind": "files", "paths": ["*"], "text_field": ""}}, r"^data\.source\.text_field must be set"),
        ({"source": {"kind": "hub", "name": "org/corpus"}}, r"^data\.source\.kind=hub .* data\.source\.max_tokens"),
        ({"source": {"kind": "web"}}, r"^data\.source\.kind='web' is not a known kind"),
        ({"tokenizer": {"kind": "bpe", "vocab_size": 100}}, r"^data\.tokenizer\.vocab_size must be an integer >= 258"),
        ({"tokenizer": {"kind": "bpe", "max_train_documents": 0}}, r"^data\.tokenizer\.max_train_documents must"),
        ({"tokenizer": {"kind": "hf"}}, r"^data\.tokenizer\.name must be set to a non-empty string, got None$"),
        ({"tokenizer": {"kind": "byte", "vocab_sise": 1}}, r"^data\.tokenizer has unknown key\(s\) \['vocab_sise'\]"),
    ],
)
def test_bad_settings_raise_config_error_naming_the_setting(tmp_path, monkeypatch, overrides, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("text")
    settings = {"source": {"kind": "embedded"}, **overrides}
    source = settings.pop("source")
    error = raised(ConfigError, datamodule, tmp_path, source, **settings)
    assert re.search(message, error), error
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("setting", "cfg", "message"),
    [
        (
            "tokenizer",
            {"kind": "byte", "vocab_size": 4096},
            "data.tokenizer.vocab_size=4096 applies to kind=bpe, not kind=byte; add data.tokenizer.kind=bpe, "
            "or remove it (data.tokenizer.vocab_size=null)",
        ),
        (
            "tokenizer",
            {"kind": "bpe", "eos_token": "</s>"},
            "data.tokenizer.eos_token='</s>' applies to kind=file or kind=hf, not kind=bpe; "
            "add data.tokenizer.kind=file or data.tokenizer.kind=hf, or remove it (data.tokenizer.eos_token=null)",
        ),
        (
            "source",
            {"kind": "embedded", "text_field": "body"},
            "data.source.text_field='body' applies to kind=files or kind=hub, not kind=embedded; "
            "add data.source.kind=files or data.source.kind=hub, or remove it (data.source.text_field=null)",
        ),
    ],
)
def test_keys_of_another_kind_are_rejected_when_set(tmp_path, setting, cfg, message):
    settings = {"source": {"kind": "embedded"}, "tokenizer": {"kind": "byte"}, setting: cfg}
    source = settings.pop("source")
    assert raised(ConfigError, datamodule, tmp_path, source, **settings) == message


def test_null_keys_mean_unset_and_take_the_kind_defaults(tmp_path):
    nulls = {key: None for key in ("vocab_size", "max_train_documents", "path", "name", "eos_token")}
    assert datamodule(tmp_path, {"kind": "embedded"}, tokenizer={"kind": "byte", **nulls}).tokenizer_config == {
        "kind": "byte"
    }
    bpe = datamodule(tmp_path, {"kind": "embedded"}, tokenizer={**nulls, "kind": "bpe", "vocab_size": 512})
    assert bpe.tokenizer_config == {"kind": "bpe", "vocab_size": 512, "max_train_documents": 100_000}
    source = {"kind": None, "paths": None, "text_field": None, "max_documents": None}
    assert datamodule(tmp_path, source).parts[0].source.description["kind"] == "embedded"


# -- 2. missing files, globs and extensions -----------------------------------------------


def test_missing_file_glob_folder_and_extension_raise_data_error(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "notes.csv").write_text("text\nhello\n")
    missing, glob, folder, csv = (tmp_path / name for name in ("missing.txt", "*.jsonl", "corpus", "notes.csv"))
    message = raised(DataError, datamodule, tmp_path, files_source(missing))
    assert message.startswith(f"data.source.paths: '{missing}' matches no file (working directory ")
    assert message.endswith("; fix the path or glob, or remove it")
    assert f"'{glob}' matches no file" in raised(DataError, datamodule, tmp_path, files_source(glob))
    assert f"it is a folder: give a glob of its files, such as '{folder / '*.txt'}'" in raised(
        DataError, datamodule, tmp_path, files_source(folder)
    )
    assert raised(DataError, datamodule, tmp_path, files_source(csv)) == (
        f"data.source.paths: {csv} has unsupported extension '.csv'; supported: .txt, .text, .md, .markdown, .rst, "
        ".json, .jsonl, .parquet; declare the format of such files with data.source.format=text (or json, parquet), "
        "or leave it out of data.source.paths"
    )
    assert not (tmp_path / "cache").exists()


# -- 3. empty corpora and corpora too small for the packing --------------------------------


def test_empty_corpus_is_reported_before_any_cache_is_published(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n   \n\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    spaces = tmp_path / "spaces.jsonl"
    spaces.write_text(jsonl([{"text": "  "}, {"text": "\n"}]))
    expected = (
        f"no non-empty document in the files {blank}, {empty}, {spaces} (blank documents are skipped); point "
        "data.source.paths at files that hold text, or set data.source.text_field to the field that holds it"
    )
    assert raised(DataError, datamodule(tmp_path, files_source(blank, empty, spaces)).prepare_data) == expected
    assert_no_cache(tmp_path / "cache")
    bpe = datamodule(tmp_path, files_source(blank, empty, spaces), tokenizer={"kind": "bpe", "vocab_size": 300})
    assert raised(DataError, bpe.prepare_data) == expected
    assert_no_cache(tmp_path / "cache")


def test_corpus_too_small_for_the_packing_names_the_corpus_and_the_fix(tmp_path):
    path = tmp_path / "small.jsonl"
    path.write_text(good_lines(8))
    message = raised(DataError, build, datamodule(tmp_path, files_source(path), seq_len=512))
    assert message.startswith("the training split has 0 rows of seq_len + 1 = 513 tokens from the files ")
    assert str(path) in message and message.endswith("lower data.seq_len or batch.micro_batch_size, or use more text")
    message = raised(DataError, build, datamodule(tmp_path, files_source(path), seq_len=32, val_fraction=0.01))
    assert message.startswith(f"the validation split has 0 usable rows of 33 tokens from the files {path}, ")
    assert "raise data.val_fraction (now 0.01) or data.val_max_rows, lower data.seq_len, or use more text" in message


# -- 4. text files that are not UTF-8 ------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 2, 5, 1 << 20])
def test_text_file_that_is_not_utf8_is_named_with_byte_and_line(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(data.corpus_checks, "UTF8_CHUNK", chunk)  # bad bytes and characters across chunk ends
    good = "First paragraph, café.\n\nÜber 東京 ✓\n".encode()
    path = tmp_path / "latin.txt"
    path.write_bytes(good + b"caf\xe9 au lait\n")
    message = raised(DataError, datamodule(tmp_path, files_source(path)).prepare_data)
    assert message == (
        f"{path}: not valid UTF-8 at byte {len(good) + 3} (line 4); convert it to UTF-8, e.g. if it is Latin-1: "
        f"iconv -f latin1 -t utf-8 {path} > {tmp_path / 'latin.utf8.txt'}, and list that file in data.source.paths"
    )
    assert_no_cache(tmp_path / "cache")
    path.write_bytes(good + "✓".encode()[:2])  # a character cut off by the end of the file
    message = raised(DataError, datamodule(tmp_path, files_source(path)).prepare_data)
    assert message.startswith(f"{path}: not valid UTF-8 at byte {len(good)} (line 4); ")
    path.write_bytes(good)
    datamodule(tmp_path, files_source(path)).prepare_data()  # valid text builds
    assert len(list((tmp_path / "cache").rglob("meta.json"))) == 1


# -- 5. broken JSON lines and records without text -----------------------------------------

FIX_RECORD = "fix or remove it, or set data.source.text_field to the field that holds the text"


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        (b'{"text": "cut\n', "is not valid JSON (Unterminated string starting at column 10); fix or remove that line"),
        (b'{"text": "caf\xe9"}\n', "is not valid JSON (byte 0xe9 at column 14 is not UTF-8); fix or remove that line"),
        (b"[1, 2]\n", f"is an array, not an object with a 'text' field (data.source.text_field); {FIX_RECORD}"),
        (b'{"body": "x"}\n', f"has no 'text' field (data.source.text_field); {FIX_RECORD}"),
        (b'{"text": 5}\n', f"has a number in its 'text' field (data.source.text_field), not a string; {FIX_RECORD}"),
        (b'{"text": null}\n', f"has null in its 'text' field (data.source.text_field), not a string; {FIX_RECORD}"),
    ],
)
def test_bad_json_line_is_named_by_file_and_line(tmp_path, monkeypatch, bad_line, problem):
    monkeypatch.setattr(data.sources, "READ_BATCH", 8)  # a missing text fails after some batches were written
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(good_lines(20))
    second.write_bytes(good_lines(40).encode() + b"\n" + bad_line + good_lines(3).encode())  # line 41 is blank
    message = raised(DataError, datamodule(tmp_path, files_source(first, second)).prepare_data)
    assert message == f"{second}: line 42 {problem}"
    assert_no_cache(tmp_path / "cache")


def test_bad_record_in_a_json_array_file_is_named(tmp_path):
    path = tmp_path / "records.json"
    path.write_text('[{"text": "one"},\n {"text": "two"},\n {"text": }\n]')
    assert raised(DataError, datamodule(tmp_path, files_source(path)).prepare_data) == (
        f"{path}: line 3 is not valid JSON (Expecting value at column 11); fix or remove that line"
    )
    path.write_text(json.dumps([{"text": "one"}, {"body": "two"}]))
    assert raised(DataError, datamodule(tmp_path, files_source(path)).prepare_data) == (
        f"{path}: record 2 of the JSON array has no 'text' field (data.source.text_field); {FIX_RECORD}"
    )
    assert_no_cache(tmp_path / "cache")


def test_bad_json_is_reported_without_datasets_error_log(tmp_path, caplog):
    path = tmp_path / "a.jsonl"
    path.write_text(good_lines(3) + "{not json}\n")
    with caplog.at_level(logging.INFO):
        assert "line 4 is not valid JSON" in raised(DataError, datamodule(tmp_path, files_source(path)).prepare_data)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


# -- 6. stale build folders ----------------------------------------------------------------


def dead_pid() -> int:
    process = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(process.stdout)


def test_next_build_removes_build_folders_of_dead_processes_on_this_host_only(tmp_path):
    """Of another cache (fingerprint): a dead builder's folder on this host is removed; a live
    one's (the parent process) and another host's are kept."""
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    stale = cache_dir / (staging_prefix("0123456789abcdef", dead_pid()) + "abc_1")
    live = cache_dir / (staging_prefix("0123456789abcdef", os.getppid()) + "abc_2")
    other_host = cache_dir / f".0123456789abcdef.tmp-another.host-{dead_pid()}-abc_3"
    for folder in (stale, live, other_host):
        folder.mkdir()
        (folder / "train.bin").write_bytes(b"\0" * 8)
    path = tmp_path / "a.jsonl"
    path.write_text(good_lines(20))
    built = build_token_cache(build_source(files_source(path)), ByteTokenizer(), cache_dir, 0.25)
    assert sorted(p.name for p in cache_dir.iterdir() if p.name != "hf_datasets") == sorted(
        [built.name, live.name, other_host.name]
    )
    assert (built / "meta.json").is_file()


# -- 7. a failed build leaves the cache as it was ------------------------------------------


def test_failed_build_keeps_other_caches_and_fixing_the_file_builds(tmp_path, monkeypatch):
    monkeypatch.setattr(data.sources, "READ_BATCH", 8)
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(good_lines(20))
    build(datamodule(tmp_path, files_source(good)))
    complete = list((tmp_path / "cache").rglob("meta.json"))
    bad.write_text(good_lines(30) + jsonl([{"text": ["not", "text"]}]))
    assert "line 31 has an array" in raised(DataError, datamodule(tmp_path, files_source(bad)).prepare_data)
    assert list((tmp_path / "cache").rglob("meta.json")) == complete
    assert [p.name for p in (tmp_path / "cache").iterdir() if ".tmp-" in p.name] == []
    bad.write_text(good_lines(30))
    build(datamodule(tmp_path, files_source(bad)))
    assert len(list((tmp_path / "cache").rglob("meta.json"))) == 2


def test_bad_file_met_while_training_bpe_caches_no_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setattr(data.sources, "READ_BATCH", 8)  # the bad record is read by the trainer, not before it
    path = tmp_path / "a.jsonl"
    path.write_text(good_lines(30) + jsonl([{"text": 7}]))
    module = datamodule(tmp_path, files_source(path), tokenizer={"kind": "bpe", "vocab_size": 300})
    assert raised(DataError, module.prepare_data).startswith(f"{path}: line 31 has a number in its 'text' field")
    assert_no_cache(tmp_path / "cache")


# -- 8. BPE training is logged -------------------------------------------------------------


def test_bpe_training_logs_one_line_with_size_documents_time_and_path(tmp_path, caplog):
    path = tmp_path / "a.jsonl"
    path.write_text(good_lines(100))
    tokenizer = {"kind": "bpe", "vocab_size": 300}
    with caplog.at_level(logging.INFO, logger="data.bpe"):
        _ = datamodule(tmp_path, files_source(path), tokenizer=tokenizer).tokenizer
    (cached,) = (tmp_path / "cache" / "tokenizers").glob("bpe-*/tokenizer.json")
    training = sum(not ValidationSplit(0.25).is_validation(i) for i in range(100))
    (line,) = [record.getMessage() for record in caplog.records if record.name == "data.bpe"]
    assert line.startswith(f"Trained a 300-token BPE tokenizer on {training} documents in ")
    assert line.endswith(f" s; cached at {cached}")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="data.bpe"):
        _ = datamodule(tmp_path, files_source(path), tokenizer=tokenizer).tokenizer
    assert [record for record in caplog.records if record.name == "data.bpe"] == []


# -- 9. Hydra: every key of every kind composes --------------------------------------------


def compose_data(tmp_path: Path, overrides: list[str]) -> TextDataModule:
    return instantiate(compose_config(overrides, tmp_path).data, micro_batch_size=2, _convert_="all")


def test_hydra_composes_every_tokenizer_and_source_key(tmp_path):
    (tmp_path / "a.txt").write_text("one\n\ntwo")
    bpe = compose_data(tmp_path, ["data.tokenizer.kind=bpe", "data.tokenizer.vocab_size=4096"])
    assert bpe.tokenizer_config == {"kind": "bpe", "vocab_size": 4096, "max_train_documents": 100_000}
    hf = compose_data(tmp_path, ["data.tokenizer.kind=hf", "data.tokenizer.name=/some/folder"])
    assert hf.tokenizer_config == {"kind": "hf", "name": "/some/folder"}
    files = compose_data(
        tmp_path, ["data=local_files", f"data.source.paths=[{tmp_path / '*.txt'}]", "data.source.sample_by=line"]
    )
    assert (
        files.parts[0].source.description["sample_by"] == "line"
        and files.parts[0].source.description["text_field"] == "text"
    )
    hub = compose_data(
        tmp_path, ["data=hub", "data.tokenizer.kind=hf", "data.tokenizer.name=x", "data.tokenizer.vocab_size=null"]
    )
    assert hub.tokenizer_config == {"kind": "hf", "name": "x"}
    assert hub.parts[0].source.description["config_name"] == "sample-10BT"
    with pytest.raises(InstantiationException) as caught:
        compose_data(tmp_path, ["data.tokenizer.vocab_size=4096"])
    assert isinstance(caught.value.__cause__, ConfigError)
    assert str(caught.value.__cause__).startswith("data.tokenizer.vocab_size=4096 applies to kind=bpe, not kind=byte")
