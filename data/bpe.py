"""A byte-level BPE tokenizer trained locally on the training documents.

Byte-level means every UTF-8 string is representable (no unknown token) and decoding
gives back the exact text. Training is deterministic for a given corpus and settings,
so the trained `tokenizer.json` is cached under a key of both and trained only once.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"


def load_or_train_bpe(
    path: Path, documents: Callable[[], Iterator[str]], vocab_size: int, max_train_documents: int
) -> Tokenizer:
    """Load the tokenizer cached at `path`, or train it on the first documents and cache it there."""
    if not path.is_file():
        tokenizer = train_bpe(islice(documents(), max_train_documents), vocab_size)
        _save_atomically(tokenizer, path)
    return Tokenizer.from_file(str(path))


def train_bpe(documents: Iterator[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE with `EOS_TOKEN` as its only special token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    return tokenizer


def _save_atomically(tokenizer: Tokenizer, path: Path) -> None:
    """Write to a temporary file and rename it, so a reader never sees a half-written tokenizer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tokenizer-", suffix=".json.tmp", dir=path.parent)
    os.close(handle)
    try:
        tokenizer.save(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
