"""A digest of the tokens themselves, so that jobs can tell whether they train on the same data.

The token cache's key (``data/token_cache.py``) is made from what produced the tokens: the
source's paths, sizes and modification times, the tokenizer, the validation fraction. Two
byte-identical copies of a corpus on two hosts get different keys, which is right for a cache
and wrong for a question jobs at two sites ask each other (fault-tolerant DiLoCo's replica
groups: "do we train on the same data?"). This digest is of the token ids, in order, as
little-endian 32-bit integers (so a uint16 and a uint32 file of the same ids agree), split
by split. It reads every token once, so it is computed once per cache key and kept in
``cache_dir/content_digests/<key>`` beside the caches.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: Tokens hashed per slice: 16M ids, 64 MB as uint32.
CHUNK_TOKENS = 1 << 24
SUBDIR = "content_digests"


def digest_tokens(splits: Sequence[Sequence]) -> str:
    """SHA-256 of each split's segments (arrays or token streams, sliceable), in order."""
    digest = hashlib.sha256()
    for segments in splits:
        digest.update(b"split")
        for segment in segments:
            for start in range(0, len(segment), CHUNK_TOKENS):
                digest.update(np.asarray(segment[start : start + CHUNK_TOKENS]).astype("<u4").tobytes())
    return digest.hexdigest()[:32]


def cached_digest(cache_dir: Path, key: str, splits: Sequence[Sequence]) -> str:
    """The digest kept under ``key``, or computed and kept (written whole, then renamed)."""
    path = Path(cache_dir) / SUBDIR / key
    if path.is_file():
        return path.read_text().strip()
    value = digest_tokens(splits)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{key}.", delete=False) as file:
        file.write(value)
    os.replace(file.name, path)
    return value
