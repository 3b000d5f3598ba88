"""Find what is wrong inside a corpus file and say it in one line: the file, the place, the fix.

`datasets` reports unreadable content from deep inside pyarrow or a codec, naming neither
the file nor the line. Two checks fill that gap, each priced for large corpora:

- `check_utf8` runs before every build of a `.txt` corpus: decoding in 1 MiB chunks runs
  at C speed in constant memory, far cheaper than the tokenization it guards.
- `json_problem` runs only after `datasets` failed on a JSON stream or returned a text
  that is not a string. It parses every record in Python, several times slower than
  pyarrow, so running it up front would add a second full parse to every build for a
  rare mistake; after a failure it costs one read up to the bad record.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common.errors import DataError

UTF8_CHUNK = 1 << 20
TEXT_FIELD = "data.source.text_field"
SHOWN_FILES = 3
JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}


def describe_files(paths: Iterable[str]) -> str:
    """The first few paths and how many more, so a message stays one readable line for any corpus size."""
    paths = list(paths)
    shown = ", ".join(paths[:SHOWN_FILES])
    return shown if len(paths) <= SHOWN_FILES else f"{shown} and {len(paths) - SHOWN_FILES} more files"


def check_utf8(path: str) -> None:
    """Raise a `DataError` naming the byte offset and line of the first invalid UTF-8 in `path`."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = newlines = 0
    try:
        with open(path, "rb") as file:
            for chunk in iter(lambda: file.read(UTF8_CHUNK), b""):
                _decode(decoder, chunk, path, offset, newlines)
                offset += len(chunk)
                newlines += chunk.count(b"\n")
            _decode(decoder, b"", path, offset, newlines)
    except OSError as error:
        raise DataError(_unreadable(path, error)) from error


def _decode(decoder: codecs.IncrementalDecoder, chunk: bytes, path: str, offset: int, newlines: int) -> None:
    """Feed one chunk (an empty one ends the file); on bad bytes, raise with their place in the file.

    The decoder prepends the incomplete character it kept from the previous chunk, so
    `error.object` ends where `chunk` ends; that gives the absolute offset.
    """
    try:
        decoder.decode(chunk, final=not chunk)
    except UnicodeDecodeError as error:
        position = offset + len(chunk) - len(error.object) + error.start
        line = newlines + error.object[: error.start].count(b"\n") + 1
        converted = Path(path).with_suffix(".utf8.txt")
        raise DataError(
            f"{path}: not valid UTF-8 at byte {position} (line {line}); convert it to UTF-8, e.g. if it is "
            f"Latin-1: iconv -f latin1 -t utf-8 {path} > {converted}, and list that file in data.source.paths"
        ) from None


def json_problem(path: str, text_field: str) -> str | None:
    """The first bad record of a JSON Lines file or JSON array, as a one-line message; None if all are good."""
    try:
        with open(path, "rb") as file:
            is_array = file.read(4096).removeprefix(codecs.BOM_UTF8).lstrip().startswith(b"[")
            file.seek(0)
            return _array_problem(path, file.read(), text_field) if is_array else _lines_problem(path, file, text_field)
    except OSError as error:
        return _unreadable(path, error)


def _lines_problem(path: str, lines: Iterable[bytes], text_field: str) -> str | None:
    """Parse line by line (JSON Lines); blank lines are skipped, as `datasets` does."""
    records = 0
    for number, raw in enumerate(lines, start=1):
        if number == 1:
            raw = raw.removeprefix(codecs.BOM_UTF8)
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.rstrip(b"\r\n").decode("utf-8"))
        except UnicodeDecodeError as error:
            return _not_json(path, number, f"byte 0x{raw[error.start]:02x} at column {error.start + 1} is not UTF-8")
        except json.JSONDecodeError as error:
            return _not_json(path, number, _json_reason(error))
        problem = _record_problem(record, text_field)
        if problem:
            return f"{path}: line {number} {problem}"
        records += 1
    return None if records else f"{path} holds no JSON record; remove it from data.source.paths"


def _array_problem(path: str, data: bytes, text_field: str) -> str | None:
    """Parse a file holding one JSON array of records (which `datasets` also reads whole)."""
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        records = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        return _not_json(path, data[: error.start].count(b"\n") + 1, f"byte 0x{data[error.start]:02x} is not UTF-8")
    except json.JSONDecodeError as error:
        return _not_json(path, error.lineno, _json_reason(error))
    for index, record in enumerate(records, start=1):
        problem = _record_problem(record, text_field)
        if problem:
            return f"{path}: record {index} of the JSON array {problem}"
    return None


def _record_problem(record: Any, text_field: str) -> str | None:
    """What keeps `record` from giving a document (with the fix), or None."""
    fix = f"fix or remove it, or set {TEXT_FIELD} to the field that holds the text"
    if not isinstance(record, dict):
        return f"is {_json_type(record)}, not an object with a {text_field!r} field ({TEXT_FIELD}); {fix}"
    if text_field not in record:
        return f"has no {text_field!r} field ({TEXT_FIELD}); {fix}"
    if not isinstance(record[text_field], str):
        return f"has {_json_type(record[text_field])} in its {text_field!r} field ({TEXT_FIELD}), not a string; {fix}"
    return None


def _json_type(value: Any) -> str:
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


def _json_reason(error: json.JSONDecodeError) -> str:
    """The parser's reason with its column (some of its messages end in a dangling "at")."""
    return f"{error.msg.removesuffix(' at')} at column {error.colno}"


def _not_json(path: str, line: int, reason: str) -> str:
    return f"{path}: line {line} is not valid JSON ({reason}); fix or remove that line"


def _unreadable(path: str, error: OSError) -> str:
    return f"{path} cannot be read ({error.strerror or error}); fix its permissions or remove it from data.source.paths"
