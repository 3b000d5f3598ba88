"""Checks for the nested `data.*` settings, shared by sources and tokenizers.

Every data setting is checked before anything is downloaded or tokenized, and every
error is a `ConfigError` that names the setting as the user writes it on the Hydra
command line (`data.source.kind`, `data.tokenizer.vocab_size`, ...) together with the fix.

`conf/data/embedded.yaml` lists every key of every kind, set to null, because Hydra
only accepts command-line overrides of keys the YAML declares. Null therefore means
"not set" (the kind's default) everywhere here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from common.errors import ConfigError

MIN_SEQ_LEN = 8


def check_seq_len(seq_len: Any) -> None:
    """The packed row length: rows shorter than this train nothing useful (checked before any import of note)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < MIN_SEQ_LEN:
        raise ConfigError(f"data.seq_len must be an integer >= {MIN_SEQ_LEN}, got {seq_len!r}")


def as_plain_dict(cfg: Any, setting: str) -> dict[str, Any]:
    """`cfg` as a dict of its own (the run's settings hold plain, resolved values)."""
    if isinstance(cfg, Mapping):
        return dict(cfg)
    raise ConfigError(f"{setting} must be a mapping such as {{kind: ...}}, got {type(cfg).__name__}: {cfg!r}")


def check_kind_and_keys(
    cfg: Mapping[str, Any], setting: str, keys_by_kind: Mapping[str, Collection[str]], default_kind: str
) -> tuple[str, dict[str, Any]]:
    """Return the kind named in `cfg` and its settings without the null (unset) ones.

    A key that no kind uses is an error rather than ignored, because a misspelt cap such
    as `max_document` would otherwise silently tokenize a whole corpus. A key of another
    kind that is set is an error too: `vocab_size=4096` with the byte tokenizer would
    otherwise be silently ignored, and the user would train on something else than asked.
    """
    settings = {key: value for key, value in cfg.items() if value is not None}
    kind = settings.setdefault("kind", default_kind)
    if kind not in keys_by_kind:
        raise ConfigError(f"{setting}.kind={kind!r} is not a known kind; choose one of: {', '.join(keys_by_kind)}")
    known = set().union(*keys_by_kind.values())
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ConfigError(
            f"{setting} has unknown key(s) {unknown}; keys for kind {kind!r}: {', '.join(sorted(keys_by_kind[kind]))}"
        )
    foreign = sorted(set(settings) - set(keys_by_kind[kind]))
    if foreign:
        raise _foreign_key_error(setting, foreign[0], settings[foreign[0]], kind, keys_by_kind)
    return kind, settings


def _foreign_key_error(
    setting: str, key: str, value: Any, kind: str, keys_by_kind: Mapping[str, Collection[str]]
) -> ConfigError:
    """The error for a key set under a kind that does not use it, naming the kinds that do."""
    owners = [owner for owner, keys in keys_by_kind.items() if key in keys]
    return ConfigError(
        f"{setting}.{key}={value!r} applies to {' or '.join(f'kind={owner}' for owner in owners)}, not kind={kind}; "
        f"add {' or '.join(f'{setting}.kind={owner}' for owner in owners)}, or remove it ({setting}.{key}=null)"
    )


def optional_positive_int(value: Any, setting: str) -> int | None:
    """Return `value` as an int >= 1, or None when unset; `1e9` is accepted as 1_000_000_000."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{setting} must be a positive integer or null, got {value!r}")
    return value


def required_string(cfg: Mapping[str, Any], key: str, setting: str) -> str:
    """Return the non-empty string at `cfg[key]`, or raise naming `setting.key`."""
    value = cfg.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{setting}.{key} must be set to a non-empty string, got {value!r}")
    return value


def one_line(text: Any) -> str:
    """`text` with every run of whitespace (newlines included) made one space, for one-line error messages."""
    return " ".join(str(text).split())
