"""The user's file lists: globs expanded, every one required to match."""

from __future__ import annotations

import glob
import os
from typing import Any

from common.errors import ConfigError, DataError


def resolve_paths(patterns: Any, setting: str, example: str = "*.txt") -> list[str]:
    """Expand globs to absolute file paths; every pattern must match, so a typo is not silently skipped."""
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns or not all(isinstance(pattern, str) for pattern in patterns):
        raise ConfigError(f"{setting} must be a list of file paths or globs, got {patterns!r}")
    files: dict[str, None] = {}  # ordered set: a file matched by two patterns is read once
    for pattern in patterns:
        matches = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
        if not matches:
            raise DataError(_no_match_message(pattern, setting, example))
        files.update(dict.fromkeys(os.path.abspath(match) for match in matches))
    return list(files)


def _no_match_message(pattern: str, setting: str, example: str) -> str:
    where = f"{setting}: {pattern!r} matches no file (working directory {os.getcwd()})"
    if os.path.isdir(os.path.expanduser(pattern)):
        return f"{where}; it is a folder: give a glob of its files, such as {os.path.join(pattern, example)!r}"
    return f"{where}; fix the path or glob, or remove it"
