"""What one read of the router's live request log gave: its rows and what it skipped.

``read_new_lines`` parses a JSON-lines file's complete lines past where its read
stands (``live_request_log_file``), ``read_parquet`` a Parquet file that changed; each
gives a ``Piece`` of the file's rows. A half-written last line of the active file
waits for the next read; a rotated file's unended last line is reported at each read
until it ends. Bad rows and lines that are not JSON objects are skipped and reported
(the file, and the line or row), never a reason to drop the rest. ``combined`` makes
the rows one ``RequestLog``, each row once.

Which files are read, and what is kept between reads, is ``live_request_log``'s. Must
not write: the router owns the files.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pandas as pd
import pyarrow as pa

from placement.adapters.live_request_log_file import FileRead, new_bytes
from placement.errors import InputError, Problem
from placement.inputs.json_lines import lines_entry, not_objects, parse_json_lines
from placement.inputs.request_log import RequestLog, request_log_from_frame

#: Problems kept per file (the counts stay whole).
_KEEP_PROBLEMS = 20


@dataclass(kw_only=True)
class Rows:
    """Rows of one file: those one read gave (a piece), or all a file gave (kept)."""

    frames: list[pd.DataFrame] = field(default_factory=list)
    aggregated: bool = False
    skipped: list[Problem] = field(default_factory=list)
    skipped_rows: int = 0
    #: Files this read could not read (the whole log's, for one call).
    unread: list[str] = field(default_factory=list)

    def skip(self, problems: Iterable[Problem], rows: int) -> None:
        self.skipped = [*self.skipped, *problems][-_KEEP_PROBLEMS:]
        self.skipped_rows += rows

    def add(self, rows: Rows) -> None:
        self.frames.extend(rows.frames)
        self.aggregated = self.aggregated or rows.aggregated
        self.skip(rows.skipped, rows.skipped_rows)
        self.unread.extend(rows.unread)


@dataclass(kw_only=True)
class Piece(Rows):
    """What one file of the log gave at one read."""

    #: None: a file that could not be read (its rows read before are held by inode).
    inode: int | None
    #: Read from its start: the rows the file gave before are void.
    restarted: bool
    #: Read from its start, truncated or rewritten in place: the rows it gave before
    #: stand (they were requests), the faults it told of are gone with their lines.
    rewritten: bool = False
    #: Told with this read only, not kept with the file's rows: a file that could not
    #: be read, an unended last line (each said again at every read while it lasts).
    passing: Rows = field(default_factory=Rows)


def read_parquet(
    handle: BinaryIO,
    path: Path,
    entry: FileRead,
    *,
    inode: int,
    fresh: bool,
    stamp: tuple[int, int],
) -> Piece:
    if entry.stamp == stamp:
        return Piece(inode=inode, restarted=fresh)
    piece = Piece(inode=inode, restarted=True)
    try:
        frame = pd.read_parquet(handle)
    except OSError as exc:
        if not isinstance(exc, pa.ArrowException):
            raise  # the disk, not the file: tried again at the next read
        piece.skip([Problem(source=str(path), message=f"cannot read: {exc}")], 0)
    except Exception as exc:  # pyarrow raises its own types for a file that is not Parquet
        piece.skip([Problem(source=str(path), message=f"cannot read: {exc}")], 0)
    else:
        _add_frame(piece, frame, source=str(path))
    entry.stamp = stamp  # not Parquet: read again once it changes
    return piece


def read_new_lines(
    handle: BinaryIO,
    path: Path,
    entry: FileRead,
    *,
    inode: int,
    fresh: bool,
    moved: bool,
    ended: bool,
) -> Piece:
    """Parse the complete lines after ``entry.offset`` (from the start if the file is
    not the one read before). Read again from its start under the name it had, the file
    was truncated in place and the rows it gave stand; under another name (``moved``),
    it is another file on the inode of one deleted, and they are void."""
    data, restarted = new_bytes(handle, entry)
    void = fresh or (restarted and moved)
    piece = Piece(inode=inode, restarted=void, rewritten=restarted and not void)
    end = data.rfind(b"\n") + 1  # a half-written last line waits for the next read
    if ended and end < len(data) and data[end:].strip():
        number = entry.lines + data[:end].count(b"\n") + 1
        message = "a last line without its newline, left out until it ends"
        piece.passing.skip([Problem(source=str(path), entry=f"line {number}", message=message)], 1)
    if end == 0:
        return piece
    parsed = parse_json_lines(data[:end].split(b"\n")[:-1], first=entry.lines + 1)
    entry.advance(data[:end])
    if parsed.bad_lines:
        piece.skip([not_objects(path, parsed.bad_lines)], len(parsed.bad_lines))
    if parsed.records:
        _add_records(piece, parsed.records, source=str(path), lines=parsed.lines)
    return piece


def _add_records(
    rows: Rows, records: list[dict[str, object]], *, source: str, lines: list[int]
) -> None:
    try:
        frame = pd.DataFrame.from_records(records)
    except (TypeError, ValueError, ArithmeticError) as exc:  # as in _add_frame
        problem = Problem(
            source=source, entry=lines_entry(lines), message=f"cannot read these rows: {exc}"
        )
        rows.skip([problem], len(records))
        return
    _add_frame(rows, frame, source=source, lines=lines)


def _add_frame(
    rows: Rows, frame: pd.DataFrame, *, source: str, lines: list[int] | None = None
) -> None:
    try:
        read = request_log_from_frame(frame, source=source, skip_bad_rows=True, lines=lines)
    except InputError as exc:  # a missing column: none of these rows can be used
        rows.skip(exc.problems, len(frame))
        return
    except (TypeError, ValueError, ArithmeticError) as exc:
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


def combined(rows: Rows, *, source: str) -> RequestLog:
    """The rows as one log, by time; rows not aggregated count once each, seen twice or not."""
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
            unread_files=tuple(rows.unread),
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
        unread_files=tuple(rows.unread),
    )
