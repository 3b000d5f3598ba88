"""Short stable hashes used as cache keys.

Caches are keyed by what produced their content (corpus, tokenizer, settings), so a
changed input gets a new cache instead of silently reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def digest(*parts: str) -> str:
    """A 16-hex-digit SHA-256 prefix of the strings (unambiguous: parts are separated)."""
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


def digest_json(value: Any) -> str:
    """The digest of a JSON-serialisable value, independent of dict key order."""
    return digest(json.dumps(value, sort_keys=True, separators=(",", ":")))
