"""Reading a JSON-lines file line by line, so that a fault names its line.

A request log and an event log may be JSON lines (``.jsonl``, ``.ndjson``, ``.json``,
``.jsonl.gz``): one JSON object per line. ``read_json_lines`` gives each object with
the number of its line, counted as the file counts them (from 1, blank lines
included), and the numbers of the lines that are not a JSON object (a half-written
last line among them); ``read_json_lines_strictly`` refuses those and an empty file.
``parse_json_lines`` does the same for lines already read (the live request log's
tail). ``lines_entry`` is a Problem's entry for such lines ("line 3", "lines 3, 7").
Reads files; writes nothing.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from placement.errors import InputError, Problem

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json", ".jsonl.gz")
_SHOW_LINES = 5


@dataclass(frozen=True)
class JsonLines:
    """A JSON-lines file's objects, each one's line, and the lines that are not objects."""

    records: list[dict[str, object]]
    lines: list[int]
    bad_lines: list[int]


def is_json_lines(path: Path) -> bool:
    return "".join(path.suffixes[-2:]).lower().endswith(JSON_LINES_SUFFIXES)


def lines_entry(numbers: list[int]) -> str:
    """A Problem's entry for lines of a JSON-lines file (numbered from 1)."""
    shown = ", ".join(str(n) for n in numbers[:_SHOW_LINES])
    more = f" and {len(numbers) - _SHOW_LINES} more" if len(numbers) > _SHOW_LINES else ""
    return f"{'line' if len(numbers) == 1 else 'lines'} {shown}{more}"


def not_objects(path: Path, bad_lines: list[int]) -> Problem:
    """The Problem of the lines of ``path`` that are not JSON objects."""
    return Problem(
        source=str(path),
        entry=lines_entry(bad_lines),
        message=f"{len(bad_lines)} lines that are not JSON objects",
    )


def read_json_lines(path: Path) -> JsonLines:
    """Every line's JSON object; InputError (one line) when missing or unreadable."""
    try:
        with _open(path) as handle:
            return parse_json_lines(handle)
    except FileNotFoundError:
        raise InputError([Problem(source=str(path), message="no such file")]) from None
    except (OSError, EOFError) as exc:  # EOFError: a .gz cut short
        raise InputError([Problem(source=str(path), message=f"cannot read: {exc}")]) from None


def parse_json_lines(lines: Iterable[bytes], *, first: int = 1) -> JsonLines:
    """The lines' JSON objects with their numbers (``first`` for the first line, blank
    lines counted and skipped), and the numbers of the lines that are not one."""
    records: list[dict[str, object]] = []
    numbers: list[int] = []
    bad: list[int] = []
    for number, line in enumerate(lines, start=first):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if isinstance(record, dict):
            records.append(record)
            numbers.append(number)
        else:
            bad.append(number)
    return JsonLines(records=records, lines=numbers, bad_lines=bad)


def read_json_lines_strictly(path: Path) -> JsonLines:
    """``read_json_lines``, refusing a line that is not a JSON object (named by its
    number) and a file with no lines."""
    read = read_json_lines(path)
    if not read.records and not read.bad_lines:
        raise InputError([Problem(source=str(path), message="empty: no JSON lines")])
    if read.bad_lines:
        raise InputError([not_objects(path, read.bad_lines)])
    return read


def _open(path: Path) -> BinaryIO | gzip.GzipFile:
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rb")
    return path.open("rb")
