"""The router's request log read back live, incrementally, as the controller reads it.

Both readers take the router's layout (``placement.adapters.request_log_files``): a
JSON-lines file and its rotations, a directory of Parquet parts and compacted hours, or
one file. Each call reads only what is new: files not read yet (a file is known by its
inode, so the rename of a rotation does not make it new; a Parquet file also by its
name, size and time) and the complete lines a JSON-lines file gained (from where the
last read stopped, if the 64 bytes before that point are unchanged; from the start
otherwise). A half-written last line waits for the next read, so no row is lost and
none is read half. Bad rows and lines that are not JSON objects are skipped and
reported (``skipped``: the file, and the line or row; ``skipped_rows``), never a reason
to drop the rest.

- ``RequestLogTail(path).read_new()``: the rows read since the last call, and nothing
  kept in between, so a call costs what was appended. A file read again from its start
  (a Parquet file that changed, an hour compacted from its parts, a JSON-lines file
  rewritten) gives its rows again: what folds the rows in must take a row seen twice
  as once (a latest time, a set).
- ``LiveRequestLog(path).read()``: the whole log, as the ingest wants it, kept per file
  (a file read again replaces its rows; a file gone is forgotten with them); a row
  seen twice (a compacted hour and its parts, between the rename and the deletes)
  counts once.

Must not write: the router owns the files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from placement.adapters.request_log_files import rotated_pattern
from placement.errors import InputError, Problem
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.inputs.request_log_faults import lines_entry

#: Problems kept per file (the counts stay whole).
_KEEP_PROBLEMS = 20
#: Bytes before the read offset that must be unchanged for a file to be read on from it.
_TAIL_BYTES = 64


@dataclass(kw_only=True)
class _FileRead:
    """Where the read of one file (by inode) stands."""

    name: str
    offset: int = 0
    lines: int = 0
    tail: bytes = b""
    #: A Parquet file's stamp: read once, again only if it changed.
    stamp: tuple[int, int] | None = None


@dataclass(kw_only=True)
class _Rows:
    """Rows of one file: those one read gave (a piece), or all a file gave (kept)."""

    frames: list[pd.DataFrame] = field(default_factory=list)
    aggregated: bool = False
    skipped: list[Problem] = field(default_factory=list)
    skipped_rows: int = 0

    def skip(self, problems: Iterable[Problem], rows: int) -> None:
        self.skipped = [*self.skipped, *problems][-_KEEP_PROBLEMS:]
        self.skipped_rows += rows

    def add(self, rows: _Rows) -> None:
        self.frames.extend(rows.frames)
        self.aggregated = self.aggregated or rows.aggregated
        self.skip(rows.skipped, rows.skipped_rows)


@dataclass(kw_only=True)
class _Piece(_Rows):
    """What one file of the log gave at one read."""

    inode: int
    #: Read from its start: the rows the file gave before are void.
    restarted: bool


class RequestLogTail:
    """The router's request log, read incrementally: ``read_new`` returns the rows read
    since the last call (see the module's docstring for rows given twice)."""

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

    def read_new(self) -> RequestLog:
        new = _Rows()
        for piece in self._read_pieces():
            new.add(piece)
        return _combined(new, source=str(self.path))

    def _read_pieces(self) -> list[_Piece]:
        """What each file of the log now gained since the last call, oldest file first;
        files gone are forgotten. A file that cannot be read raises, and nothing of
        this call is kept."""
        kept: dict[int, _FileRead] = {}
        pieces = []
        for path in self.files():
            try:
                stat = path.stat()
                entry, fresh = self._entry(path, stat)
                if path.suffix == ".parquet":
                    stamp = (stat.st_size, stat.st_mtime_ns)
                    piece = _read_parquet(path, entry, inode=stat.st_ino, fresh=fresh, stamp=stamp)
                else:
                    piece = _read_new_lines(path, entry, inode=stat.st_ino, fresh=fresh)
            except FileNotFoundError:  # rotated, compacted or deleted while listed
                continue
            kept[stat.st_ino] = entry
            pieces.append(piece)
        self._files = kept
        return pieces

    def _entry(self, path: Path, stat: os.stat_result) -> tuple[_FileRead, bool]:
        """A copy of the file's read so far (kept only once the whole call succeeds, so
        a read that fails part-way gives the same rows again at the next call), and
        whether the file is new (or a deleted file's inode reused under another name)."""
        entry = self._files.get(stat.st_ino)
        if entry is None or (path.suffix == ".parquet" and entry.name != path.name):
            return _FileRead(name=path.name), True
        return replace(entry, name=path.name), False


class LiveRequestLog:
    """The router's request log read incrementally: ``read`` returns all of it, having
    read only what is new since the last call."""

    def __init__(self, path: str | Path) -> None:
        self._tail = RequestLogTail(path)
        self._kept: dict[int, _Rows] = {}

    @property
    def path(self) -> Path:
        return self._tail.path

    def files(self) -> list[Path]:
        return self._tail.files()

    def read(self) -> RequestLog:
        kept: dict[int, _Rows] = {}
        for piece in self._tail._read_pieces():
            rows = _Rows() if piece.restarted else self._kept.get(piece.inode, _Rows())
            rows.add(piece)
            kept[piece.inode] = rows
        self._kept = kept  # files gone are forgotten, with their rows
        whole = _Rows()
        for rows in kept.values():
            whole.add(rows)
        return _combined(whole, source=str(self.path))


def _read_parquet(
    path: Path, entry: _FileRead, *, inode: int, fresh: bool, stamp: tuple[int, int]
) -> _Piece:
    if entry.stamp == stamp:
        return _Piece(inode=inode, restarted=fresh)
    entry.stamp = stamp
    piece = _Piece(inode=inode, restarted=True)
    try:
        frame = pd.read_parquet(path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # pyarrow raises its own types for a file that is not Parquet
        piece.skip([Problem(source=str(path), message=f"cannot read: {exc}")], 0)
        return piece
    _add_frame(piece, frame, source=str(path))
    return piece


def _read_new_lines(path: Path, entry: _FileRead, *, inode: int, fresh: bool) -> _Piece:
    """Parse the complete lines after ``entry.offset`` (from the start if the file is
    not the one read before: shorter, or the bytes before the offset changed)."""
    data, restarted = _new_bytes(path, entry)
    piece = _Piece(inode=inode, restarted=fresh or restarted)
    end = data.rfind(b"\n") + 1  # a half-written last line waits for the next read
    if end == 0:
        return piece
    records, numbers, bad = _parse_lines(data[:end].split(b"\n")[:-1], first=entry.lines + 1)
    entry.offset += end
    entry.lines += data[:end].count(b"\n")
    entry.tail = (entry.tail + data[:end])[-_TAIL_BYTES:]
    if bad:
        message = f"{len(bad)} lines that are not JSON objects"
        piece.skip([Problem(source=str(path), entry=lines_entry(bad), message=message)], len(bad))
    if records:
        _add_frame(piece, pd.DataFrame.from_records(records), source=str(path), lines=numbers)
    return piece


def _new_bytes(path: Path, entry: _FileRead) -> tuple[bytes, bool]:
    """The file's bytes after ``entry.offset``, and whether they are from its start
    instead (``entry`` reset): the file is shorter, or its bytes before the offset are
    not the ones read."""
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        restarted = False
        if entry.offset:
            handle.seek(entry.offset - len(entry.tail))
            if size < entry.offset or handle.read(len(entry.tail)) != entry.tail:
                entry.offset, entry.lines, entry.tail, restarted = 0, 0, b"", True
        handle.seek(entry.offset)
        return handle.read(size - entry.offset), restarted


def _parse_lines(
    lines: list[bytes], *, first: int
) -> tuple[list[dict[str, object]], list[int], list[int]]:
    """The lines' JSON objects and their line numbers, and the numbers of the lines
    that are not one."""
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
    return records, numbers, bad


def _add_frame(
    rows: _Rows, frame: pd.DataFrame, *, source: str, lines: list[int] | None = None
) -> None:
    try:
        read = request_log_from_frame(frame, source=source, skip_bad_rows=True, lines=lines)
    except InputError as exc:  # a missing column: none of these rows can be used
        rows.skip(exc.problems, len(frame))
        return
    except (TypeError, ValueError) as exc:
        # Values no fault finder foresaw: these rows are lost and said so. Raised, they
        # would fail this read and, as a failed read keeps nothing, every read after.
        where = None if lines is None else lines_entry(lines)
        problem = Problem(source=source, entry=where, message=f"cannot read these rows: {exc}")
        rows.skip([problem], len(frame))
        return
    rows.skip(read.skipped, read.skipped_rows)
    rows.aggregated = rows.aggregated or read.aggregated
    if not read.frame.empty:
        rows.frames.append(read.frame)


def _combined(rows: _Rows, *, source: str) -> RequestLog:
    skipped = tuple(rows.skipped)
    if not rows.frames:
        empty = pd.DataFrame(
            {
                "ts": pd.Series([], dtype="datetime64[ns, UTC]"),
                "adapter": pd.Series([], dtype=object),
            }
        )
        return RequestLog(
            frame=empty,
            aggregated=False,
            source=source,
            skipped=skipped,
            skipped_rows=rows.skipped_rows,
        )
    frame = pd.concat(rows.frames, ignore_index=True).sort_values("ts", kind="stable")
    if not rows.aggregated:
        # A compacted hour and its parts, seen together in the moment between the
        # compacted file's rename and the parts' deletion: each row once.
        frame = frame.drop_duplicates()
    return RequestLog(
        frame=frame.reset_index(drop=True),
        aggregated=rows.aggregated,
        source=source,
        skipped=skipped,
        skipped_rows=rows.skipped_rows,
    )
