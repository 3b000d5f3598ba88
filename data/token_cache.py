"""Tokenize a document stream once into sharded flat token files (train and validation).

Layout of `cache_dir/<fingerprint>/`:

- `train-00000.bin`, `val-00000.bin`, ...: shard k holds documents [k * D, (k + 1) * D) of
  the corpus (D = `SHARD_DOCUMENTS`), as raw native-endian token ids, `uint16` when every
  id fits (vocab_size <= 65536) else `uint32`; each document is followed by EOS. A split
  is its shards laid end to end (`TokenStream`), exactly the stream one file would hold.
- `shard-00000.json`, ...: each finished shard's token and document counts.
- `meta.json`: the totals, dtype, shard count, tokenizer fingerprint, source, version.

The fingerprint hashes the source description, tokenizer fingerprint, validation
fraction and format version, and nothing about packing (seq_len, batch sizes): rows
are a view over the flat files, so every packing shares one cache.

The build writes into a temporary directory and renames it into place at the end, so
an interrupted build never leaves a directory that looks complete; a complete one is
reused as it is. The temporary directory's name records the host and process id of its
builder (`.<fingerprint>.tmp-<host>-<pid>-<random>`). A killed build cannot finish its
own, so the next build of the same cache on the same host adopts it (renaming it, which
only one builder can do) and continues after its last finished shard: the documents of
the finished shards are read again but not tokenized. Other dead builds on this host are
removed; those of other hosts are kept, since their builders may be alive.
"""

from __future__ import annotations

import itertools
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

from common.errors import DataError
from data.fingerprint import digest_json
from data.sources import DocumentSource
from data.split import ValidationSplit
from data.token_files import TokenFiles
from data.tokenizers import Tokenizer

CACHE_VERSION = 2
SHARD_DOCUMENTS = 50_000  # documents per shard: what an interrupted build redoes at most
FLUSH_TOKENS = 1 << 20  # tokens buffered per split before writing (8 MiB as int64)
LOG_EVERY_TOKENS = 100_000_000
HF_DATASETS_SUBDIR = "hf_datasets"
SPLITS = ("train", "val")
STAGING_NAME = re.compile(r"\.[0-9a-f]+\.tmp-(?P<host>[A-Za-z0-9._]+)-(?P<pid>[0-9]+)-[a-z0-9_]+")
_SHARD_NAME = re.compile(r"(?:train|val|shard)-(?P<index>[0-9]{5})\.(?:bin|json(?:\.partial)?)")
ENCODE_BATCH = 1000  # documents per tokenizer call
log = logging.getLogger(__name__)


class TokenStream:
    """One split's shards laid end to end, sliced like one flat array (a slice within a shard
    is a view of its memory map; one across shards is copied, as it is only a row long)."""

    def __init__(self, shards: list[np.ndarray], dtype: np.dtype) -> None:
        self._shards = [shard for shard in shards if len(shard)]
        self._starts = np.cumsum([0] + [len(shard) for shard in self._shards])
        self.dtype = dtype

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: slice) -> np.ndarray:
        start, stop, step = index.indices(len(self))
        if step != 1:
            raise ValueError("token streams are sliced contiguously")
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        pieces = []
        while start < stop:
            shard, offset = self._shards[first], start - int(self._starts[first])
            piece = shard[offset : offset + stop - start]
            pieces.append(piece)
            start, first = start + len(piece), first + 1
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=self.dtype)


@dataclass(frozen=True)
class TokenCache:
    """An opened cache: read-only memory maps of both splits (nothing is loaded into memory)."""

    directory: Path
    meta: dict[str, Any]
    train: TokenStream
    val: TokenStream


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
    """Return the cache directory for these inputs, tokenizing the corpus first unless it exists
    (continuing an interrupted build of the same cache on this host)."""
    fingerprint = cache_fingerprint(source, tokenizer, val_fraction)
    final = Path(cache_dir) / fingerprint
    if (final / "meta.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = _adopt_or_create_staging(final.parent, fingerprint)
    try:
        log.info("Tokenizing %s into %s", source.description["kind"], final)
        meta = _write_shards(source, tokenizer, ValidationSplit(val_fraction), staging, Path(cache_dir))
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
        shutil.rmtree(staging, ignore_errors=True)  # left only if another builder published first
    except DataError:  # the input is wrong: its shards are of no use to a later build
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def _adopt_or_create_staging(cache_dir: Path, fingerprint: str) -> Path:
    """A build directory of this process: a dead builder's of the same cache (renamed, so only
    one process adopts it), or a new one. Other dead builders' directories on this host go."""
    prefix = staging_prefix(fingerprint, os.getpid())
    for dead in stale_builds(cache_dir):
        if dead.name.startswith(f".{fingerprint}.tmp-"):
            adopted = cache_dir / (prefix + "adopted")
            try:
                os.rename(dead, adopted)
            except OSError:  # another builder adopted it first
                continue
            log.info("Continuing the interrupted build %s", dead.name)
            return adopted
        log.info("Removing %s, left by an interrupted build", dead)
        shutil.rmtree(dead, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=cache_dir))
    staging.chmod(0o755)  # mkdtemp makes it private; the published cache is shared like any cache
    return staging


def staging_prefix(fingerprint: str, pid: int) -> str:
    """The start of the name of a build directory of process `pid` on this host."""
    return f".{fingerprint}.tmp-{_host()}-{pid}-"


def stale_builds(cache_dir: Path) -> list[Path]:
    """Build directories in `cache_dir` left by killed builders on this host.

    Only a directory whose process is gone (or is this one, whose builds run one at a time)
    counts: a live process may be another builder at work. Directories of other hosts are
    never touched, since a cache directory on a shared file system is written from several
    machines and their processes are not visible here.
    """
    host = _host()
    stale = []
    for path in sorted(cache_dir.glob(".*.tmp-*")):
        match = STAGING_NAME.fullmatch(path.name)
        pid = int(match["pid"]) if match else -1
        if match and match["host"] == host and path.is_dir() and (pid == os.getpid() or not _process_alive(pid)):
            stale.append(path)
    return stale


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
    counts = [json.loads((directory / _shard_file(k, "json")).read_text()) for k in range(meta["shards"])]
    splits = {
        split: TokenStream(
            [_memmap(directory / _shard_file(k, split), dtype, c[f"{split}_tokens"]) for k, c in enumerate(counts)],
            dtype,
        )
        for split in SPLITS
    }
    for split in SPLITS:
        if len(splits[split]) != meta[f"{split}_tokens"]:
            raise DataError(
                f"token cache {directory} holds {len(splits[split])} {split} tokens, its meta.json says "
                f"{meta[f'{split}_tokens']}: delete that folder and run again to rebuild it"
            )
    return TokenCache(directory, meta, splits["train"], splits["val"])


class _SplitWriter:
    """Appends documents (plus EOS) to one flat file, buffering so memory stays bounded."""

    def __init__(self, file: BinaryIO, dtype: np.dtype, tokenizer: Tokenizer) -> None:
        self._file = file
        self.file_number = file.fileno()
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


def _write_shards(
    source: DocumentSource, tokenizer: Tokenizer, split: ValidationSplit, staging: Path, cache_dir: Path
) -> dict[str, Any]:
    """Stream documents through the tokenizer into shards, after those already finished in
    `staging`; return the totals. Memory stays flat: one buffer per split, whatever the corpus."""
    dtype = token_dtype(tokenizer.vocab_size)
    done = _finished_shards(staging)
    totals = {key: sum(c[key] for c in done) for key in _COUNT_KEYS}
    start = time.perf_counter()
    if done:
        log.info(
            "%d shards (%d documents, %d tokens) were finished before; tokenizing from document %d",
            len(done),
            len(done) * SHARD_DOCUMENTS,
            totals["train_tokens"] + totals["val_tokens"],
            len(done) * SHARD_DOCUMENTS,
        )
    documents = _documents_from(source, cache_dir / HF_DATASETS_SUBDIR, len(done) * SHARD_DOCUMENTS)
    shard, next_log = len(done), LOG_EVERY_TOKENS
    capped = source.max_tokens is not None and totals["train_tokens"] + totals["val_tokens"] >= source.max_tokens
    while not capped:
        batch = list(itertools.islice(documents, SHARD_DOCUMENTS))
        if not batch:
            break
        counts, capped = _write_shard(batch, shard, tokenizer, split, dtype, staging, totals, source.max_tokens)
        for key in _COUNT_KEYS:
            totals[key] += counts[key]
        shard += 1
        if totals["train_tokens"] + totals["val_tokens"] >= next_log:
            log.info("Tokenized %d shards, %d tokens", shard, totals["train_tokens"] + totals["val_tokens"])
            next_log += LOG_EVERY_TOKENS
    if totals["train_documents"] == 0:
        raise source.no_documents_error()
    seconds = time.perf_counter() - start
    log.info("Wrote %d train and %d validation tokens in %.1f s", totals["train_tokens"], totals["val_tokens"], seconds)
    return {"dtype": dtype.name, "shards": shard, **totals, "build_seconds": round(seconds, 3)}


_COUNT_KEYS = ("train_tokens", "val_tokens", "train_documents", "val_documents")


def _write_shard(
    documents: list[str],
    shard: int,
    tokenizer: Tokenizer,
    split: ValidationSplit,
    dtype: np.dtype,
    staging: Path,
    totals: dict[str, int],
    max_tokens: int | None,
) -> tuple[dict[str, int], bool]:
    """Tokenize one shard's documents into its two files, then record it as finished (the
    record is written last and atomically, so a shard without one is redone)."""
    first_document = shard * SHARD_DOCUMENTS
    tokens_before = totals["train_tokens"] + totals["val_tokens"]
    capped = False
    with (
        open(staging / _shard_file(shard, "train"), "wb") as train,
        open(staging / _shard_file(shard, "val"), "wb") as val,
    ):
        writers = {False: _SplitWriter(train, dtype, tokenizer), True: _SplitWriter(val, dtype, tokenizer)}
        for offset in range(0, len(documents), ENCODE_BATCH):
            chunk = documents[offset : offset + ENCODE_BATCH]
            for index, ids in enumerate(tokenizer.encode_batch(chunk), start=first_document + offset):
                tokens_before += writers[split.is_validation(index)].add(ids)
                if max_tokens is not None and tokens_before >= max_tokens:
                    capped = True
                    break
            if capped:
                break
        for writer in writers.values():
            writer.flush()
            os.fsync(writer.file_number)
    counts = {
        "train_tokens": writers[False].tokens,
        "val_tokens": writers[True].tokens,
        "train_documents": writers[False].documents,
        "val_documents": writers[True].documents,
    }
    _write_atomically(staging / _shard_file(shard, "json"), json.dumps(counts))
    return counts, capped


def _finished_shards(staging: Path) -> list[dict[str, int]]:
    """The counts of the shards finished in a (possibly adopted) build directory: 0, 1, ... up
    to the first without a record; the files of any later shard are deleted."""
    done = []
    while (record := staging / _shard_file(len(done), "json")).is_file():
        done.append(json.loads(record.read_text()))
    for path in staging.iterdir():
        shard = _SHARD_NAME.fullmatch(path.name)
        if shard and int(shard["index"]) >= len(done):
            path.unlink()
    return done


def _documents_from(source: DocumentSource, hf_cache_dir: Path, skip: int) -> Iterator[str]:
    """The corpus's documents in order, without the first `skip` (read, but not tokenized)."""
    documents = itertools.chain.from_iterable(source.batches(hf_cache_dir))
    return itertools.islice(documents, skip, None)


def _shard_file(shard: int, kind: str) -> str:
    """`train-00003.bin`, `val-00003.bin` or `shard-00003.json`."""
    return f"shard-{shard:05d}.json" if kind == "json" else f"{kind}-{shard:05d}.bin"


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


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
