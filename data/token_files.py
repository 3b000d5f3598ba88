"""Token files written by other tools (`data.source.kind=tokens`), trained on in place.

Two layouts are read, both as read-only memory maps, so nothing is copied or re-tokenized:

- flat binaries of token ids (nanoGPT's `train.bin`: `uint16`; OLMo's `.npy` shards are such
  flat `uint32` memory maps too, despite the suffix): `data.source.dtype` says the width;
- NumPy `.npy` arrays with a header (`np.save`): the header gives the dtype and shape.

The files hold documents separated by one end-of-document token, as our own cache does,
and were written with a tokenizer that the run declares (`data.tokenizer`), so that the
vocabulary size, evaluation, samples and the Hugging Face export all work. Every file is
checked once against that vocabulary (the result is remembered in the cache directory,
keyed by the files' sizes and times): an id outside it means another tokenizer or the wrong
dtype, and is reported in one line before training.

Validation reads `data.source.val_paths` (nanoGPT's `val.bin`); without them, the last
`data.val_fraction` of every training file is held out, so that each file is represented.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from common.errors import ConfigError, DataError
from data.file_paths import resolve_paths
from data.fingerprint import digest_json
from data.tokenizers import Tokenizer

SETTING = "data.source"
RAW_DTYPES = ("uint16", "uint32")
NPY_DTYPES = ("uint16", "uint32", "int32", "int64")
NPY_MAGIC = b"\x93NUMPY"
SCAN_CHUNK = 1 << 26  # tokens per chunk of the vocabulary check (128 MiB of uint16)
CHECKED_SUBDIR = "token_files_checked"


@dataclass(frozen=True)
class TokenFile:
    """One file of token ids: where its ids start and how many there are."""

    path: str
    dtype: np.dtype
    offset: int
    tokens: int

    def array(self) -> np.ndarray:
        """The ids as a read-only memory map (nothing is read until used)."""
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.tokens,))

    def version(self) -> list[Any]:
        stat = os.stat(self.path)
        return [self.path, stat.st_size, stat.st_mtime_ns]


@dataclass(frozen=True)
class TokenFiles:
    """Pre-tokenized training (and optionally validation) files, checked but never copied."""

    train: tuple[TokenFile, ...]
    val: tuple[TokenFile, ...]
    eos_id: int | None
    description: dict[str, Any]

    @property
    def label(self) -> str:
        """The corpus in words, for messages."""
        return "the token files " + ", ".join(Path(file.path).name for file in self.train)

    def check(self, tokenizer: Tokenizer, cache_dir: Path) -> None:
        """Refuse a separator or any id that the declared tokenizer does not have (scanned once per file version)."""
        if self.eos_id is not None and self.eos_id != tokenizer.eos_id:
            raise ConfigError(
                f"{SETTING}.eos_id={self.eos_id} but data.tokenizer's end-of-document token is {tokenizer.eos_id}: "
                "declare the tokenizer the files were written with (data.tokenizer.eos_token names its separator)"
            )
        for file in self.train + self.val:
            _check_ids(file, tokenizer.vocab_size, cache_dir / CHECKED_SUBDIR)

    def splits(self, val_fraction: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Training and validation segments, views over the files: `val_paths`, or each file's tail."""
        arrays = [file.array() for file in self.train]
        if self.val:
            return arrays, [file.array() for file in self.val]
        cuts = [len(array) - int(len(array) * val_fraction) for array in arrays]
        return [a[:cut] for a, cut in zip(arrays, cuts)], [a[cut:] for a, cut in zip(arrays, cuts)]


def token_files(settings: Mapping[str, Any]) -> TokenFiles:
    """Check `data.source` of kind `tokens` and read the files' layouts (their headers only)."""
    dtype = settings.get("dtype")
    if dtype is not None and dtype not in RAW_DTYPES:
        raise ConfigError(f"{SETTING}.dtype={dtype!r} is not valid; choose one of: {', '.join(RAW_DTYPES)}")
    eos_id = settings.get("eos_id")
    if eos_id is not None and (isinstance(eos_id, bool) or not isinstance(eos_id, int) or eos_id < 0):
        raise ConfigError(f"{SETTING}.eos_id must be a non-negative integer or null, got {eos_id!r}")
    train = tuple(_layout(path, dtype) for path in resolve_paths(settings.get("paths"), f"{SETTING}.paths", "*.bin"))
    val_paths = settings.get("val_paths")
    val = (
        ()
        if val_paths is None
        else tuple(_layout(path, dtype) for path in resolve_paths(val_paths, f"{SETTING}.val_paths", "*.bin"))
    )
    description = {
        "files": [file.version() for file in train],
        "val_files": [file.version() for file in val],
        "dtype": dtype,
        "eos_id": eos_id,
    }
    return TokenFiles(train, val, eos_id, description)


def _layout(path: str, declared: str | None) -> TokenFile:
    """Where the ids of `path` start, their dtype and count; a size that does not fit the dtype is an error."""
    with open(path, "rb") as handle:
        if handle.read(len(NPY_MAGIC)) == NPY_MAGIC:
            return _npy_layout(path, handle, declared)
    if declared is None:
        raise ConfigError(
            f"{SETTING}.dtype is not set, and {path} is a flat file of ids whose width only you know: "
            "set data.source.dtype=uint16 (nanoGPT) or uint32 (OLMo)"
        )
    dtype = np.dtype(declared)
    size = os.path.getsize(path)
    if size == 0 or size % dtype.itemsize:
        raise DataError(
            f"{path} has {size} bytes, not a positive multiple of {dtype.itemsize} ({declared}): it is not a file of "
            f"{declared} token ids; check {SETTING}.dtype and the file"
        )
    return TokenFile(path, dtype, 0, size // dtype.itemsize)


def _npy_layout(path: str, handle: Any, declared: str | None) -> TokenFile:
    """An `.npy` file's header: one dimension, C order, an integer dtype that agrees with any declared one."""
    handle.seek(0)
    major, _ = npy_format.read_magic(handle)
    read_header = npy_format.read_array_header_1_0 if major == 1 else npy_format.read_array_header_2_0
    shape, fortran_order, dtype = read_header(handle)
    if len(shape) != 1 or fortran_order or dtype.name not in NPY_DTYPES or not dtype.isnative:
        raise DataError(
            f"{path} holds a {dtype.str} array of shape {shape}; token files must be one-dimensional arrays of "
            f"{', '.join(NPY_DTYPES)} (np.save(path, ids.astype(np.uint32)))"
        )
    if declared is not None and declared != dtype.name:
        raise DataError(
            f"{path} holds {dtype.name} ids (its .npy header) but {SETTING}.dtype={declared}; "
            f"set {SETTING}.dtype={dtype.name} or null"
        )
    if shape[0] == 0:
        raise DataError(f"{path} holds no token ids; leave it out of {SETTING}.paths")
    return TokenFile(path, dtype, handle.tell(), shape[0])


def _check_ids(file: TokenFile, vocab_size: int, checked_dir: Path) -> None:
    """Scan `file` for ids outside [0, vocab_size), once per file version and vocabulary."""
    marker = checked_dir / f"{digest_json({'file': file.version(), 'vocab_size': vocab_size})}.json"
    if marker.is_file():
        return
    ids = file.array()
    for start in range(0, len(ids), SCAN_CHUNK):
        chunk = ids[start : start + SCAN_CHUNK]
        bad = np.flatnonzero((chunk < 0) | (chunk >= vocab_size))
        if bad.size:
            position = start + int(bad[0])
            raise DataError(
                f"{file.path} holds token id {int(ids[position])} at position {position}, outside the vocabulary of "
                f"data.tokenizer ({vocab_size} ids): declare the tokenizer the file was written with, or the right "
                f"{SETTING}.dtype (read as {file.dtype.name} here)"
            )
    checked_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"file": file.version(), "vocab_size": vocab_size}))
