"""The router's request log read back live, as the controller's ingest reads it each run.

``LiveRequestLog(path)`` takes the router's layout (``placement.adapters.
request_log_files``): a JSON-lines file and its rotations, a directory of Parquet parts
and compacted hours, or one file. Each ``read`` returns the whole log, having read only
what is new: files it has not read (a file is known by its inode, so the rename of a
rotation does not make it new; a Parquet file also by its name, size and time) and the
complete lines a JSON-lines file gained (from where the last read stopped, if the 64
bytes before that point are unchanged; from the start otherwise). A half-written last
line waits for the next read. Bad rows and unparsable lines are skipped and reported
(``skipped``, ``skipped_rows``), never a reason to drop the log; a row seen twice (a
compacted hour and its parts, between the rename and the deletes) counts once.

Must not write: the router owns the files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from placement.adapters.request_log_files import rotated_pattern
from placement.errors import InputError, Problem
from placement.inputs.request_log import RequestLog, request_log_from_frame

#: Problems kept per file (the counts stay whole).
_KEEP_PROBLEMS = 20
#: Bytes before the read offset that must be unchanged for a file to be read on from it.
_TAIL_BYTES = 64


@dataclass(kw_only=True)
class _FileRead:
    """What was read of one file (by inode) so far."""

    name: str
    offset: int = 0
    lines: int = 0
    tail: bytes = b""
    #: A Parquet file's stamp: read once, again only if it changed.
    stamp: tuple[int, int] | None = None
    frames: list[pd.DataFrame] = field(default_factory=list)
    aggregated: bool = False
    skipped: list[Problem] = field(default_factory=list)
    skipped_rows: int = 0

    def skip(self, problems: Iterable[Problem], rows: int) -> None:
        self.skipped = [*self.skipped, *problems][-_KEEP_PROBLEMS:]
        self.skipped_rows += rows


class LiveRequestLog:
    """The router's request log (a JSON-lines file and its rotations, a directory of
    Parquet files, or one file), read incrementally: ``read`` returns all of it, having
    read only what is new since the last call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._files: dict[int, _FileRead] = {}

    def files(self) -> list[Path]:
        """The files that make up the log now, oldest first."""
        path = self.path
        if path.is_dir():
            return sorted(
                p for p in path.iterdir() if p.suffix == ".parquet" and not p.name.startswith(".")
            )
        if path.suffix in (".jsonl", ".ndjson"):
            pattern = rotated_pattern(path)
            rotated = sorted(p for p in path.parent.iterdir() if pattern.match(p.name))
            return [*rotated, path]
        return [path]

    def read(self) -> RequestLog:
        kept: dict[int, _FileRead] = {}
        for path in self.files():
            try:
                stat = path.stat()
                entry = self._entry(path, stat)
                if path.suffix == ".parquet":
                    _read_parquet(path, entry, stamp=(stat.st_size, stat.st_mtime_ns))
                else:
                    _read_new_lines(path, entry)
            except FileNotFoundError:  # rotated, compacted or deleted while listed
                continue
            kept[stat.st_ino] = entry
        self._files = kept  # files gone are forgotten, with their rows
        return _combined(list(kept.values()), source=str(self.path))

    def _entry(self, path: Path, stat: os.stat_result) -> _FileRead:
        entry = self._files.get(stat.st_ino)
        if entry is None or (path.suffix == ".parquet" and entry.name != path.name):
            return _FileRead(name=path.name)  # new, or a deleted file's inode reused
        entry.name = path.name
        return entry


def _read_parquet(path: Path, entry: _FileRead, *, stamp: tuple[int, int]) -> None:
    if entry.stamp == stamp:
        return
    entry.frames, entry.skipped, entry.skipped_rows, entry.stamp = [], [], 0, stamp
    try:
        frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # pyarrow raises its own types for a file that is not Parquet
        entry.skip([Problem(source=str(path), message=f"cannot read: {exc}")], 0)
        return
    _add_frame(entry, frame, source=str(path))


def _read_new_lines(path: Path, entry: _FileRead) -> None:
    """Parse the complete lines after ``entry.offset`` (from the start if the file is
    not the one read before: shorter, or the bytes before the offset changed)."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        if entry.offset:
            handle.seek(entry.offset - len(entry.tail))
            if size < entry.offset or handle.read(len(entry.tail)) != entry.tail:
                entry.offset, entry.lines, entry.tail = 0, 0, b""
                entry.frames, entry.skipped, entry.skipped_rows = [], [], 0
        handle.seek(entry.offset)
        data = handle.read(size - entry.offset)
    end = data.rfind(b"\n") + 1  # a half-written last line waits for the next read
    if end == 0:
        return
    records: list[dict[str, object]] = []
    bad: list[int] = []
    for number, line in enumerate(data[:end].split(b"\n")[:-1], start=entry.lines + 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            bad.append(number)
    first, last = entry.lines + 1, entry.lines + data[:end].count(b"\n")
    entry.offset += end
    entry.lines = last
    entry.tail = (entry.tail + data[:end])[-_TAIL_BYTES:]
    if bad:
        shown = ", ".join(str(n) for n in bad[:5]) + (
            f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        )
        where = f"{'line' if len(bad) == 1 else 'lines'} {shown}"
        message = f"{len(bad)} lines that are not JSON objects"
        entry.skip([Problem(source=str(path), entry=where, message=message)], len(bad))
    if records:
        source = f"{path} (lines {first}-{last})"
        _add_frame(entry, pd.DataFrame.from_records(records), source=source)


def _add_frame(entry: _FileRead, frame: pd.DataFrame, *, source: str) -> None:
    try:
        read = request_log_from_frame(frame, source=source, skip_bad_rows=True)
    except InputError as exc:  # a missing column: none of these rows can be used
        entry.skip(exc.problems, len(frame))
        return
    entry.skip(read.skipped, read.skipped_rows)
    entry.aggregated = entry.aggregated or read.aggregated
    if not read.frame.empty:
        entry.frames.append(read.frame)


def _combined(entries: list[_FileRead], *, source: str) -> RequestLog:
    frames = [frame for entry in entries for frame in entry.frames]
    skipped = tuple(problem for entry in entries for problem in entry.skipped)[-_KEEP_PROBLEMS:]
    skipped_rows = sum(entry.skipped_rows for entry in entries)
    aggregated = any(entry.aggregated for entry in entries)
    if not frames:
        empty = pd.DataFrame(
            {
                "ts": pd.Series([], dtype="datetime64[ns, UTC]"),
                "adapter": pd.Series([], dtype=object),
            }
        )
        return RequestLog(
            frame=empty, aggregated=False, source=source, skipped=skipped, skipped_rows=skipped_rows
        )
    frame = pd.concat(frames, ignore_index=True).sort_values("ts", kind="stable")
    if not aggregated:
        # A compacted hour and its parts, seen together in the moment between the
        # compacted file's rename and the parts' deletion: each row once.
        frame = frame.drop_duplicates()
    return RequestLog(
        frame=frame.reset_index(drop=True),
        aggregated=aggregated,
        source=source,
        skipped=skipped,
        skipped_rows=skipped_rows,
    )
