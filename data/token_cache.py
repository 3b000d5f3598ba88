"""Tokenize a document stream once into two flat token files (train and validation).

Layout of `cache_dir/<fingerprint>/`:

- `train.bin`, `val.bin`: raw native-endian token ids, `uint16` when every id fits
  (vocab_size <= 65536) else `uint32`; each document is followed by EOS.
- `meta.json`: token and document counts, dtype, tokenizer fingerprint, source, version.

The fingerprint hashes the source description, tokenizer fingerprint, validation
fraction and format version, and nothing about packing (seq_len, batch sizes): rows
are a view over the flat files, so every packing shares one cache.

The build writes into a temporary directory and renames it into place at the end, so
an interrupted build never leaves a directory that looks complete; a complete one is
reused as it is. The temporary directory's name records the host and process id of its
builder (`.<fingerprint>.tmp-<host>-<pid>-<random>`): a killed build cannot remove its
own, so the next build in the same cache directory removes those whose process is gone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from data.fingerprint import digest_json
from data.sources import DocumentSource
from data.token_files import TokenFiles
from data.split import ValidationSplit
from data.tokenizers import Tokenizer
from common.errors import DataError

CACHE_VERSION = 1
FLUSH_TOKENS = 1 << 20  # tokens buffered per split before writing (8 MiB as int64)
LOG_EVERY_TOKENS = 100_000_000
HF_DATASETS_SUBDIR = "hf_datasets"
SPLIT_FILES = {"train": "train.bin", "val": "val.bin"}
STAGING_NAME = re.compile(r"\.[0-9a-f]+\.tmp-(?P<host>[A-Za-z0-9._]+)-(?P<pid>[0-9]+)-[a-z0-9_]+")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenCache:
    """An opened cache: read-only memory maps of both splits (nothing is loaded into memory)."""

    directory: Path
    meta: dict[str, Any]
    train: np.ndarray
    val: np.ndarray


def cache_fingerprint(source: DocumentSource | TokenFiles, tokenizer: Tokenizer, val_fraction: float) -> str:
    """The cache key: what decides the token files' content, and only that (for token files used
    in place, what decides the rows; checkpoints compare it on resume)."""
    return digest_json(
        {
            "version": CACHE_VERSION,
            "source": source.description,
            "tokenizer": tokenizer.fingerprint,
            "val_fraction": str(val_fraction),
        }
    )


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding every id: half the disk and page cache of uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def build_token_cache(
    source: DocumentSource, tokenizer: Tokenizer, cache_dir: str | os.PathLike[str], val_fraction: float
) -> Path:
    """Return the cache directory for these inputs, tokenizing the corpus first unless it exists."""
    fingerprint = cache_fingerprint(source, tokenizer, val_fraction)
    final = Path(cache_dir) / fingerprint
    if (final / "meta.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(final.parent)
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(fingerprint, os.getpid()), dir=final.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the published cache is shared like any cache
    try:
        log.info("Tokenizing %s into %s", source.description["kind"], final)
        meta = _write_splits(source, tokenizer, ValidationSplit(val_fraction), staging, Path(cache_dir))
        meta.update(
            version=CACHE_VERSION,
            fingerprint=fingerprint,
            tokenizer=tokenizer.fingerprint,
            vocab_size=tokenizer.vocab_size,
            eos_id=tokenizer.eos_id,
            val_fraction=val_fraction,
            source=source.description,
        )
        (staging / "meta.json").write_text(json.dumps(meta, indent=2))
        _publish(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def staging_prefix(fingerprint: str, pid: int) -> str:
    """The start of the name of a build directory of process `pid` on this host."""
    return f".{fingerprint}.tmp-{_host()}-{pid}-"


def remove_stale_builds(cache_dir: Path) -> None:
    """Delete build directories left in `cache_dir` by killed builders on this host.

    Only a directory whose process is gone is removed: a live process may be another
    builder at work. Directories of other hosts are kept, since a cache directory on a
    shared file system is written from several machines and their processes are not
    visible here.
    """
    host = _host()
    for path in cache_dir.glob(".*.tmp-*"):
        match = STAGING_NAME.fullmatch(path.name)
        if match and match["host"] == host and path.is_dir() and not _process_alive(int(match["pid"])):
            log.info("Removing %s, left by an interrupted build", path)
            shutil.rmtree(path, ignore_errors=True)


def _host() -> str:
    """This host's name, with the characters a directory name or the pattern above cannot hold replaced."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())


def _process_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        return True
    return True


def open_token_cache(directory: str | os.PathLike[str]) -> TokenCache:
    """Memory-map a complete cache, checking that the files match their metadata."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"no token cache at {directory}: call prepare_data() first (Lightning does)")
    meta = json.loads(meta_path.read_text())
    if meta.get("version") != CACHE_VERSION:
        raise DataError(
            f"token cache {directory} has version {meta.get('version')}, expected {CACHE_VERSION}: "
            "delete that folder and run again to rebuild it"
        )
    dtype = np.dtype(meta["dtype"])
    splits = {name: _memmap(directory / file, dtype, meta[f"{name}_tokens"]) for name, file in SPLIT_FILES.items()}
    return TokenCache(directory, meta, splits["train"], splits["val"])


class _SplitWriter:
    """Appends documents (plus EOS) to one flat file, buffering so memory stays bounded."""

    def __init__(self, file: BinaryIO, dtype: np.dtype, tokenizer: Tokenizer) -> None:
        self._file = file
        self._dtype = dtype
        self._vocab_size = tokenizer.vocab_size
        self._eos = np.array([tokenizer.eos_id], dtype=np.int64)
        self._pending: list[np.ndarray] = []
        self._pending_tokens = 0
        self.tokens = 0
        self.documents = 0

    def add(self, ids: np.ndarray) -> int:
        """Buffer one document; return its token count including EOS."""
        self._pending += (ids, self._eos)
        count = len(ids) + 1
        self._pending_tokens += count
        self.tokens += count
        self.documents += 1
        if self._pending_tokens >= FLUSH_TOKENS:
            self.flush()
        return count

    def flush(self) -> None:
        """Write the buffer, refusing ids the dtype cannot hold (they would wrap around silently)."""
        if not self._pending:
            return
        chunk = np.concatenate(self._pending)
        if chunk.min() < 0 or chunk.max() >= self._vocab_size:
            raise DataError(
                f"data.tokenizer produced token ids outside [0, vocab_size={self._vocab_size}): its vocabulary "
                "and its ids disagree; use another data.tokenizer"
            )
        chunk.astype(self._dtype).tofile(self._file)
        self._pending, self._pending_tokens = [], 0


def _write_splits(
    source: DocumentSource, tokenizer: Tokenizer, split: ValidationSplit, staging: Path, cache_dir: Path
) -> dict[str, Any]:
    """Stream documents through the tokenizer into the two split files; return the counts."""
    dtype = token_dtype(tokenizer.vocab_size)
    start = time.perf_counter()
    with open(staging / SPLIT_FILES["train"], "wb") as train, open(staging / SPLIT_FILES["val"], "wb") as val:
        writers = {False: _SplitWriter(train, dtype, tokenizer), True: _SplitWriter(val, dtype, tokenizer)}
        total = 0
        next_log = LOG_EVERY_TOKENS
        for index, ids in enumerate(_encoded_documents(source, tokenizer, cache_dir / HF_DATASETS_SUBDIR)):
            total += writers[split.is_validation(index)].add(ids)
            if total >= next_log:
                log.info("Tokenized %d documents, %d tokens", index + 1, total)
                next_log += LOG_EVERY_TOKENS
            if source.max_tokens is not None and total >= source.max_tokens:
                break
        for writer in writers.values():
            writer.flush()
    train_writer, val_writer = writers[False], writers[True]
    if train_writer.documents == 0:
        raise source.no_documents_error()
    seconds = time.perf_counter() - start
    log.info("Wrote %d train and %d validation tokens in %.1f s", train_writer.tokens, val_writer.tokens, seconds)
    return {
        "dtype": dtype.name,
        "train_tokens": train_writer.tokens,
        "val_tokens": val_writer.tokens,
        "train_documents": train_writer.documents,
        "val_documents": val_writer.documents,
        "build_seconds": round(seconds, 3),
    }


def _encoded_documents(source: DocumentSource, tokenizer: Tokenizer, hf_cache_dir: Path) -> Iterator[np.ndarray]:
    """Token ids per document, in corpus order, encoded a batch at a time for speed."""
    for documents in source.batches(hf_cache_dir):
        yield from tokenizer.encode_batch(documents)


def _publish(staging: Path, final: Path) -> None:
    """Rename the finished build into place; if another process finished first, keep its cache."""
    try:
        os.replace(staging, final)
    except OSError:
        if not (final / "meta.json").is_file():
            raise DataError(f"{final} exists but is not a complete token cache: delete it and run again") from None


def _memmap(path: Path, dtype: np.dtype, tokens: int) -> np.ndarray:
    size = path.stat().st_size if path.is_file() else -1
    if size != tokens * dtype.itemsize:
        raise DataError(
            f"token cache file {path} has {size} bytes, expected {tokens * dtype.itemsize}: "
            f"delete {path.parent} and run again to rebuild it"
        )
    if tokens == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(tokens,))
