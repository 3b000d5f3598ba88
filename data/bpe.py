"""A byte-level BPE tokenizer trained locally on the training documents.

Byte-level means every UTF-8 string is representable (no unknown token) and decoding
gives back the exact text. Training is deterministic for a given corpus and settings,
so the trained `tokenizer.json` is cached under a key of both and trained only once.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from itertools import islice
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
log = logging.getLogger(__name__)


def load_or_train_bpe(
    path: Path, documents: Callable[[], Iterator[str]], vocab_size: int, max_train_documents: int
) -> Tokenizer:
    """Load the tokenizer cached at `path`, or train it on the first documents and cache it there.

    Training is the one slow step before tokenization starts (minutes on a large corpus),
    so it is logged with its size, document count and duration.
    """
    if not path.is_file():
        start = time.perf_counter()
        counted = _Counted(islice(documents(), max_train_documents))
        tokenizer = train_bpe(counted, vocab_size)
        _save_atomically(tokenizer, path)
        log.info(
            "Trained a %s-token BPE tokenizer on %s documents in %.1f s; cached at %s",
            f"{tokenizer.get_vocab_size():,}",
            f"{counted.count:,}",
            time.perf_counter() - start,
            path,
        )
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


class _Counted(Iterator[str]):
    """Passes documents through to the trainer, counting them for the log line."""

    def __init__(self, documents: Iterator[str]) -> None:
        self._documents = documents
        self.count = 0

    def __next__(self) -> str:
        document = next(self._documents)
        self.count += 1
        return document


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
