"""`corpus_cloze`: an offline multiple-choice task cut from a run's own held-out documents.

Public benchmarks need a network and say little about a tiny model; this task needs
neither. Each item is a passage of a validation document (never trained on): its first
~2/3, cut at a space, is the context; the choices are the text that really follows it and
three continuations cut from passages of three other held-out documents. A model that
learnt the language of the corpus prefers the true continuation; chance is 25%.

No choice's length gives it away: all four, the true one included, are cut by the same
rule (at the word end nearest the shortest of the four available texts), and the true
passage and the distractor passages are drawn alike, so they are interchangeable apart
from their text. That matters because log-likelihood falls with length: an untrained
model, whose per-token log-probabilities are all about -log(vocabulary), scores chance.

The items are written as a JSONL file plus a task YAML in
`<cache_dir>/eval/corpus_cloze-<fingerprint>/` (the fingerprint covers the corpus, the
validation split, K and the seed) and run by lm-eval like any task, with `acc` and
`acc_norm` (log-likelihood divided by the choice's length in characters) computed by lm-eval.
The same settings and seed give the same items.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.errors import ConfigError, DataError
from data.config_checks import as_plain_dict
from data.fingerprint import digest_json
from data.sources import DocumentSource, build_source
from data.split import ValidationSplit
from data.token_cache import HF_DATASETS_SUBDIR
from evaluation.harness import TaskSpec

TASK_NAME = "corpus_cloze"
DEFAULT_K = 500
FORMAT_VERSION = 1
CHOICES = 4
PASSAGE_CHARS = 300  # a passage: up to this many characters of a document, ending at a word end
MIN_PASSAGE_CHARS = 60
CONTEXT_FRACTION = 2 / 3
MIN_CONTEXT_CHARS = 30
MIN_CONTINUATION_CHARS = 15
POOL_PER_ITEM = 4  # passages read per requested item, so items are drawn from more than K
ITEMS_FILE = f"{TASK_NAME}.jsonl"
TASK_FILE = f"{TASK_NAME}.yaml"


@dataclass(frozen=True)
class Passage:
    """A passage of held-out document number `document`: its context and the text after it.

    `following` starts with the space that ends the context and runs to the passage's end.
    """

    document: int
    context: str
    following: str


def build_corpus_cloze_task(
    data_settings: Mapping[str, Any],
    cache_dir: str | os.PathLike[str] | None = None,
    k: int = DEFAULT_K,
    seed: int = 0,
) -> TaskSpec:
    """The `corpus_cloze` task of a run's data settings (a checkpoint's `datamodule_hyper_parameters`).

    Up to `k` items (fewer when the held-out documents hold fewer passages), written to
    the cache on first use; `cache_dir` defaults to the settings' own. Building reads the
    corpus from its start until it has `POOL_PER_ITEM * k` passages.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{TASK_NAME}: the number of items k must be an integer >= 1, got {k!r}")
    cache_dir = Path(cache_dir if cache_dir is not None else data_settings["cache_dir"])
    if data_settings.get("source") is None:
        raise ConfigError(
            f"{TASK_NAME} cuts its items from one corpus's held-out text, and data=mixture has several: "
            "use another evaluation task (evaluation.tasks) or evaluation=none"
        )
    source = build_source(as_plain_dict(data_settings["source"], "data.source"))
    if not isinstance(source, DocumentSource):
        raise ConfigError(
            f"{TASK_NAME} cuts its items from held-out text, and data.source.kind=tokens has none: "
            "use another evaluation task (evaluation.tasks) or evaluation=none"
        )
    val_fraction = data_settings["val_fraction"]
    key = {
        "task": TASK_NAME,
        "version": FORMAT_VERSION,
        "source": source.description,
        "val_fraction": str(val_fraction),
        "k": k,
        "seed": seed,
    }
    folder = (cache_dir / "eval" / f"{TASK_NAME}-{digest_json(key)}").absolute()
    if not (folder / ITEMS_FILE).is_file():
        documents = held_out_documents(source, ValidationSplit(val_fraction), cache_dir)
        items = cloze_items(passage_pool(documents, POOL_PER_ITEM * k), k, seed)
        _write_atomically(folder / ITEMS_FILE, "".join(json.dumps(item) + "\n" for item in items))
    # Written every time: it names the items file by absolute path, which must be current.
    _write_atomically(folder / TASK_FILE, yaml.safe_dump(task_config(folder), sort_keys=False))
    return TaskSpec(TASK_NAME, folder)


def held_out_documents(source: DocumentSource, split: ValidationSplit, cache_dir: Path) -> Iterator[str]:
    """The validation-split documents of the corpus, in corpus order, as the data module splits them."""
    index = 0
    for documents in source.batches(cache_dir / HF_DATASETS_SUBDIR):
        for document in documents:
            if split.is_validation(index):
                yield document
            index += 1


def passage_pool(documents: Iterator[str], size: int) -> list[Passage]:
    """Passages of the documents, read until there are `size` of them or the documents end."""
    pool: list[Passage] = []
    for index, document in enumerate(documents):
        pool.extend(passages(document, index))
        if len(pool) >= size:
            break
    return pool


def passages(document: str, index: int) -> Iterator[Passage]:
    """Consecutive passages of up to `PASSAGE_CHARS` characters, each ending at a word end,
    split into context and following text; passages too short to split are skipped."""
    start = _next_word_start(document, 0)
    while start < len(document):
        end = _passage_end(document, start)
        text = document[start:end]
        cut = _context_cut(text)
        if len(text) >= MIN_PASSAGE_CHARS and cut is not None:
            yield Passage(index, text[:cut], text[cut:])
        start = _next_word_start(document, end)


def cloze_items(pool: Sequence[Passage], k: int, seed: int) -> list[dict[str, Any]]:
    """Up to `k` items: a context, four choices and the index of the true one.

    Each item also lists the held-out document each choice was cut from (`documents`).
    """
    if len({passage.document for passage in pool}) < CHOICES:
        raise DataError(
            f"{TASK_NAME} needs passages from at least {CHOICES} held-out documents, the corpus has "
            f"{len({passage.document for passage in pool})}: raise data.val_fraction or use a larger corpus"
        )
    rng = random.Random(seed)
    return [_item(pool[index], pool, rng) for index in rng.sample(range(len(pool)), min(k, len(pool)))]


def task_config(folder: Path) -> dict[str, Any]:
    """The lm-eval task YAML for the items in `folder`: zero-shot multiple choice, read
    offline from the local JSONL. Choices start with their own space, so no delimiter."""
    return {
        "task": TASK_NAME,
        "dataset_path": "json",
        "dataset_kwargs": {
            "data_files": {"test": str(folder / ITEMS_FILE)},
            "cache_dir": str(folder / HF_DATASETS_SUBDIR),
        },
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "context",
        "doc_to_choice": "choices",
        "doc_to_target": "target",
        "target_delimiter": "",
        "metric_list": [
            {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
        ],
        "metadata": {"version": FORMAT_VERSION},
    }


def _item(truth: Passage, pool: Sequence[Passage], rng: random.Random) -> dict[str, Any]:
    """The truth's context with its true continuation and three distractors, shuffled."""
    while True:
        passages = [truth, *_distractor_passages(truth, pool, rng)]
        length = min(len(passage.following) for passage in passages)
        choices = [_cut_near(passage.following, length) for passage in passages]
        if len(set(choices)) == CHOICES:  # a distractor identical to another choice is redrawn
            break
    order = rng.sample(range(CHOICES), CHOICES)
    return {
        "context": truth.context,
        "choices": [choices[i] for i in order],
        "target": order.index(0),
        "documents": [passages[i].document for i in order],
    }


def _distractor_passages(truth: Passage, pool: Sequence[Passage], rng: random.Random) -> list[Passage]:
    """Passages of `CHOICES - 1` distinct held-out documents other than the truth's."""
    chosen: dict[int, Passage] = {}
    while len(chosen) < CHOICES - 1:
        passage = pool[rng.randrange(len(pool))]
        if passage.document != truth.document:
            chosen.setdefault(passage.document, passage)
    return list(chosen.values())


def _cut_near(text: str, length: int) -> str:
    """The prefix of `text` (which starts with a space) ending at the word end nearest `length` characters."""
    word_ends = [len(text)] + [i for i in range(2, len(text)) if text[i].isspace() and not text[i - 1].isspace()]
    return text[: min(word_ends, key=lambda end: (abs(end - length), end))]


def _next_word_start(document: str, position: int) -> int:
    while position < len(document) and document[position].isspace():
        position += 1
    return position


def _passage_end(document: str, start: int) -> int:
    """The end of the passage starting at `start`: the document's end when it is near, else
    the last word end within `PASSAGE_CHARS` (a hard cut inside one very long word)."""
    limit = start + PASSAGE_CHARS
    if limit >= len(document):
        return len(document.rstrip())
    for end in range(limit, start, -1):
        if document[end].isspace() and not document[end - 1].isspace():
            return end
    return limit


def _context_cut(text: str) -> int | None:
    """The position of the space nearest `CONTEXT_FRACTION` of the text that leaves a long
    enough context and continuation, with a word on each side; None if there is none."""
    target = round(CONTEXT_FRACTION * len(text))
    cuts = [
        i
        for i in range(MIN_CONTEXT_CHARS, len(text) - MIN_CONTINUATION_CHARS)
        if text[i] == " " and not text[i - 1].isspace() and not text[i + 1].isspace()
    ]
    return min(cuts, key=lambda i: (abs(i - target), i), default=None)


def _write_atomically(path: Path, text: str) -> None:
    """Write through a temporary file and a rename: ranks building the task at once never
    read a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
