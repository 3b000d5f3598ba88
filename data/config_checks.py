"""Checks for the nested `data.*` settings, shared by sources and tokenizers.

Every data setting is checked before anything is downloaded or tokenized, and every
error names the setting as the user writes it on the Hydra command line
(`data.source.kind`, `data.tokenizer.vocab_size`, ...) together with the fix.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf


def as_plain_dict(cfg: Any, setting: str) -> dict[str, Any]:
    """Return `cfg` as a plain dict, so Hydra's DictConfig and plain dicts behave alike."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    if isinstance(cfg, Mapping):
        return dict(cfg)
    raise TypeError(f"{setting} must be a mapping such as {{kind: ...}}, got {type(cfg).__name__}: {cfg!r}")


def check_kind_and_keys(
    cfg: Mapping[str, Any], setting: str, keys_by_kind: Mapping[str, Collection[str]], default_kind: str
) -> str:
    """Return the kind named in `cfg`, after checking that it and all its keys are known.

    A key that no kind uses is an error rather than ignored, because a misspelt cap such
    as `max_document` would otherwise silently tokenize a whole corpus. Keys of another
    kind are ignored, so switching `kind` on the command line needs no other change.
    """
    kind = cfg.get("kind", default_kind)
    if kind not in keys_by_kind:
        raise ValueError(f"{setting}.kind={kind!r} is not a known kind; choose one of: {', '.join(keys_by_kind)}")
    known = set().union(*keys_by_kind.values())
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(
            f"{setting} has unknown key(s) {unknown}; keys for kind {kind!r}: {', '.join(sorted(keys_by_kind[kind]))}"
        )
    return kind


def optional_positive_int(value: Any, setting: str) -> int | None:
    """Return `value` as an int >= 1, or None when unset; `1e9` is accepted as 1_000_000_000."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{setting} must be a positive integer or null, got {value!r}")
    return value


def required_string(cfg: Mapping[str, Any], key: str, setting: str) -> str:
    """Return the non-empty string at `cfg[key]`, or raise naming `setting.key`."""
    value = cfg.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{setting}.{key} must be set to a non-empty string, got {value!r}")
    return value
