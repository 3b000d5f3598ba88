"""Plain config values to typed settings dataclasses, with every key and type checked.

Hydra composes overrides as they are typed (``optimizer.lr=abc`` is the string "abc"), and
the settings dataclasses hold no defaults (the YAML files are the one source), so this is
where a wrong key or a wrong type becomes a message that names the setting.
"""

import dataclasses
import importlib
import types
import typing
from typing import Any, TypeVar

from common.errors import ConfigError

T = TypeVar("T")


def settings_from_config(cls: type[T], node: dict[str, Any] | None, key: str) -> T:
    """Build ``cls`` from a config section (plain values): unknown keys, missing keys and wrong
    types are ConfigErrors.

    The dataclass's own ``__post_init__`` then checks ranges; its ``ValueError``s (or a
    ``TypeError`` from a mistake it did not anticipate) are reported under ``key`` too.
    """
    values = dict(node or {})
    values.pop("_target_", None)
    fields = {field.name: field for field in dataclasses.fields(cls) if field.init}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(f'{key}.{name}' for name in unknown)}; valid keys of"
            f" `{key}` are: {', '.join(sorted(fields))}."
        )
    missing = sorted(
        name
        for name, field in fields.items()
        if name not in values and field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ConfigError(f"`{key}` lacks {', '.join(f'{key}.{name}' for name in missing)}; add it to the config.")
    hints = typing.get_type_hints(cls)
    typed = {name: coerce(value, hints[name], f"{key}.{name}") for name, value in values.items()}
    try:
        return cls(**typed)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        raise ConfigError(f"invalid `{key}` settings: {error}") from error


def coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` as type ``hint`` (ints accepted as floats, integral floats such as 1e6 as ints)."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [arg for arg in args if arg is not type(None)]
        for option in options:
            try:
                return coerce(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}={value!r} must be {describe(hint)}.")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r} must be {describe(hint)}.")
        return [coerce(item, args[0], f"{key}[{i}]") for i, item in enumerate(value)] if args else list(value)
    if dataclasses.is_dataclass(hint):  # a nested section, e.g. technique.diloco.torchft
        return settings_from_config(hint, value, key)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} must be {describe(hint)}.")
        return value
    return _scalar(value, hint, key)


def _scalar(value: Any, hint: type, key: str) -> Any:
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif isinstance(value, hint):
        return value
    raise ConfigError(f"{key}={value!r} must be {describe(hint)}.")


def describe(hint: Any) -> str:
    """A type as a user reads it: 'an integer', 'a number or null', 'a list of integers'."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [describe(arg) for arg in args if arg is not type(None)]
        return " or ".join(options) + (" or null" if type(None) in args else "")
    if origin in (list, tuple):
        return f"a list of {describe(args[0]).split(' ', 1)[1]}s" if args else "a list"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping"}
    return names.get(hint, f"a {getattr(hint, '__name__', hint)}")


def class_named(target: Any, key: str, base: type, kind: str, hint: str) -> type:
    """The class a config node names in ``_target_`` (``package.module.Class``), which must
    derive from ``base``; anything else is a ConfigError: ``key=target is not KIND; HINT.``"""
    module_name, _, class_name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if module_name else None
    except (ImportError, AttributeError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"{key}={target!r} is not {kind}; {hint}.")
    return cls
