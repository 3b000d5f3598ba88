"""Tokenizers behind one small interface, chosen by `data.tokenizer.kind`.

The rest of the data pipeline needs only `vocab_size`, `eos_id`, batch encoding and a
`fingerprint` that changes whenever the token ids would, so the token cache is keyed
by what actually produced it. Kinds:

- `byte` (default): UTF-8 bytes 0..255 plus EOS 256; nothing to train or download.
- `bpe`: byte-level BPE trained on the training documents, cached in the cache dir.
- `file`: any `tokenizer.json` of the `tokenizers` library.
- `hf`: a Hugging Face tokenizer (Hub name or local folder) via `transformers`.

Encoding never adds special tokens: the token cache appends EOS after each document.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer as LibraryTokenizer

from common.errors import ConfigError, DataError
from data.bpe import EOS_TOKEN, load_or_train_bpe
from data.config_checks import check_kind_and_keys, one_line, required_string
from data.fingerprint import digest

SETTING = "data.tokenizer"
TOKENIZER_KEYS: dict[str, tuple[str, ...]] = {
    "byte": ("kind",),
    "bpe": ("kind", "vocab_size", "max_train_documents"),
    "file": ("kind", "path", "eos_token"),
    "hf": ("kind", "name", "eos_token"),
}
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>")
BPE_DEFAULTS = {"vocab_size": 4096, "max_train_documents": 100_000}
MIN_BPE_VOCAB = 258  # 256 byte symbols + EOS + at least one merge


class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer."""

    vocab_size: int
    eos_id: int
    fingerprint: str

    def encode(self, text: str) -> np.ndarray:
        """Token ids of one text, without special tokens."""

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text (batched for speed where the library can)."""

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of token ids (the end-of-document token is not text)."""


class ByteTokenizer:
    """UTF-8 bytes as tokens: lossless, language-agnostic, and encoding is a memory view."""

    vocab_size = 257
    eos_id = 256
    fingerprint = "byte-utf8-eos256"

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Bytes back to text; EOS is not text and is dropped, invalid UTF-8 becomes U+FFFD."""
        data = np.asarray(ids, dtype=np.int64)
        return data[data < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class JsonTokenizer:
    """A `tokenizers` library tokenizer (a trained BPE or any `tokenizer.json`)."""

    def __init__(self, tokenizer: LibraryTokenizer, eos_id: int) -> None:
        self._tokenizer = tokenizer
        self.eos_id = eos_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.fingerprint = "json-" + digest(tokenizer.to_str(), str(eos_id))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Batch encoding runs in parallel in Rust and skips computing character offsets."""
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(encoding.ids, dtype=np.int64) for encoding in encodings]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode([int(i) for i in ids])


class HFTokenizer:
    """A `transformers` tokenizer; imported lazily because `transformers` is slow to import."""

    def __init__(self, tokenizer: Any, eos_id: int) -> None:
        self._tokenizer = tokenizer
        # Documents are tokenized whole and packed later, so the model's length limit does
        # not apply here; raising it silences a misleading "sequence too long" warning.
        self._tokenizer.model_max_length = sys.maxsize
        self.eos_id = eos_id
        self.vocab_size = len(tokenizer)
        identity = (
            tokenizer.backend_tokenizer.to_str()
            if tokenizer.is_fast
            else json.dumps(tokenizer.get_vocab(), sort_keys=True)
        )
        self.fingerprint = "hf-" + digest(type(tokenizer).__name__, identity, str(eos_id))

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        ids = self._tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False)["input_ids"]
        return [np.asarray(row, dtype=np.int64) for row in ids]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def check_tokenizer_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Check a `data.tokenizer` mapping without loading anything; return its set keys with defaults filled in."""
    kind, settings = check_kind_and_keys(cfg, SETTING, TOKENIZER_KEYS, default_kind="byte")
    if kind == "bpe":
        settings = {**BPE_DEFAULTS, **settings}
        for key, minimum in (("vocab_size", MIN_BPE_VOCAB), ("max_train_documents", 1)):
            value = settings[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"{SETTING}.{key} must be an integer >= {minimum}, got {value!r}")
    if kind == "file":
        path = Path(required_string(settings, "path", SETTING)).expanduser()
        if not path.is_file():
            raise DataError(f"{SETTING}.path={str(path)!r} is not a file; point it at a tokenizer.json")
    if kind == "hf":
        required_string(settings, "name", SETTING)
    return settings


def build_tokenizer(
    cfg: Mapping[str, Any],
    cache_dir: str | os.PathLike[str],
    corpus_iter_factory: Callable[[], Iterator[str]] | None = None,
    corpus_fingerprint: str = "",
) -> Tokenizer:
    """Build the tokenizer named by `cfg`.

    `corpus_iter_factory` yields the training documents and `corpus_fingerprint`
    identifies them; only `bpe` uses them (to train, and to key its cached
    `tokenizer.json` under `cache_dir`).
    """
    settings = check_tokenizer_config(cfg)
    kind = settings["kind"]
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return _bpe(settings, Path(cache_dir), corpus_iter_factory, corpus_fingerprint)
    if kind == "file":
        return _file(str(Path(settings["path"]).expanduser()), settings.get("eos_token"))
    return _hf(settings)


def _file(path: str, eos_token: str | None) -> JsonTokenizer:
    """A `tokenizer.json`; the library's parse error (an untyped Exception) becomes a `DataError` naming the file."""
    try:
        tokenizer = LibraryTokenizer.from_file(path)
    except Exception as error:
        raise DataError(
            f"{SETTING}.path={path!r} is not a tokenizer.json the tokenizers library can load ({one_line(error)}); "
            "point it at a tokenizer.json saved by tokenizers or transformers"
        ) from error
    return JsonTokenizer(tokenizer, _eos_id(tokenizer.token_to_id, eos_token, path))


def _bpe(
    settings: Mapping[str, Any],
    cache_dir: Path,
    corpus_iter_factory: Callable[[], Iterator[str]] | None,
    corpus_fingerprint: str,
) -> JsonTokenizer:
    if corpus_iter_factory is None or not corpus_fingerprint:
        raise ValueError(f"{SETTING}.kind=bpe trains on the corpus: pass corpus_iter_factory and corpus_fingerprint")
    key = digest(corpus_fingerprint, str(settings["vocab_size"]), str(settings["max_train_documents"]))
    path = cache_dir / f"bpe-{key}" / "tokenizer.json"
    tokenizer = load_or_train_bpe(path, corpus_iter_factory, settings["vocab_size"], settings["max_train_documents"])
    return JsonTokenizer(tokenizer, tokenizer.token_to_id(EOS_TOKEN))


def _hf(settings: Mapping[str, Any]) -> HFTokenizer:
    from transformers import AutoTokenizer

    name = settings["name"]
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except OSError as error:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
        why = "HF_HUB_OFFLINE is set, so nothing is downloaded" if offline else one_line(error)
        raise DataError(
            f"{SETTING}.name={name!r} is neither a local tokenizer folder nor a cached Hub tokenizer ({why}). "
            "A Hub name needs network access once to download; offline, set it to a local folder "
            "holding the tokenizer files."
        ) from error
    eos_id = _eos_id(
        tokenizer.convert_tokens_to_ids,
        settings.get("eos_token"),
        name,
        default_id=tokenizer.eos_token_id,
        unknown_id=tokenizer.unk_token_id,
    )
    return HFTokenizer(tokenizer, eos_id)


def _eos_id(
    token_to_id: Callable[[str], int | None],
    eos_token: str | None,
    where: str,
    default_id: int | None = None,
    unknown_id: int | None = None,
) -> int:
    """The id of the configured EOS token, else the tokenizer's own, else the first common name found."""
    if eos_token is None and default_id is not None:
        return default_id
    candidates = (eos_token,) if eos_token is not None else EOS_CANDIDATES
    for candidate in candidates:
        token_id = token_to_id(candidate)
        if token_id is not None and token_id != unknown_id:
            return token_id
    raise DataError(
        f"{SETTING}.eos_token: tried {list(candidates)} and none is a token of {where}; "
        f"set {SETTING}.eos_token to that tokenizer's end-of-text token"
    )
