"""The router's request log read back live, incrementally, as the controller reads it.

Both readers take the router's layout (``placement.adapters.request_log_files``): a
JSON-lines file and its rotations, a directory of Parquet parts and compacted hours, or
one file. Each call reads only what is new: files not read yet (a file is known by its
inode, so the rename of a rotation does not make it new; a Parquet file also by its
name, size and time) and the complete lines a JSON-lines file gained, from where the
last read stopped if the file is still the one read: no shorter than that point, and
its first bytes (up to 1 KiB) and the 64 before that point the ones read. Otherwise
(truncated in place, as logrotate's ``copytruncate`` does, even if it grew past that
point again) it is read from its start. A half-written last line of the active file
waits for the next read, so no row is lost and none is read half; a rotated file's
unended last line is reported until it ends (it is not being written). Bad rows and
lines that are not JSON objects are skipped and reported (``skipped``: the file, and
the line or row; ``skipped_rows``), never a reason to drop the rest.

A file that cannot be read (no permission, a link that loops, a directory or a FIFO
under a log file's name, an I/O error) is named in ``skipped`` and ``unread_files``
and passed by: the other files are read, and it is tried again at the next call, from
where its last good read stopped. A file renamed or deleted while the call reads (a
rotation, a compaction) has the log listed again, so its rows are read under its new
name in the same call.

- ``RequestLogTail(path).read_new()``: the rows read since the last call, and nothing
  kept in between, so a call costs what was appended. A file read again from its start
  (a Parquet file that changed, an hour compacted from its parts, a JSON-lines file
  truncated or rewritten) gives its rows again: what folds the rows in must take a row
  seen twice as once (a latest time, a set).
- ``LiveRequestLog(path).read()``: the whole log, as the ingest wants it, kept per file
  (a Parquet file read again replaces its rows; a JSON-lines file truncated or
  rewritten in place keeps the rows read before, which were requests all the same,
  but not the faults it told of; a file gone is forgotten with its rows); a row seen
  twice (a compacted hour and its parts, between the rename and the deletes; a
  copytruncate copy and the rows read before it) counts once.

Must not write: the router owns the files.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat as file_mode
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import pandas as pd
import pyarrow as pa

from placement.adapters.request_log_files import rotated_pattern
from placement.errors import InputError, Problem
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.inputs.request_log_faults import lines_entry

#: Problems kept per file (the counts stay whole).
_KEEP_PROBLEMS = 20
#: The file's first bytes, kept as read: a file whose start differs is another file.
_HEAD_BYTES = 1024
#: Bytes before the read offset that must be unchanged for a file to be read on from it.
_TAIL_BYTES = 64
#: Listings per call at most: a file renamed or deleted while read has the log listed
#: again (a rotation or a compaction under way); past this the next call goes on.
_LISTINGS = 3


@dataclass(kw_only=True)
class _FileRead:
    """Where the read of one file (by inode) stands."""

    name: str
    offset: int = 0
    lines: int = 0
    head: bytes = b""
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
    #: Files this read could not read (the whole log's, for one call).
    unread: list[str] = field(default_factory=list)

    def skip(self, problems: Iterable[Problem], rows: int) -> None:
        self.skipped = [*self.skipped, *problems][-_KEEP_PROBLEMS:]
        self.skipped_rows += rows

    def add(self, rows: _Rows) -> None:
        self.frames.extend(rows.frames)
        self.aggregated = self.aggregated or rows.aggregated
        self.skip(rows.skipped, rows.skipped_rows)
        self.unread.extend(rows.unread)


@dataclass(kw_only=True)
class _Piece(_Rows):
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
    passing: _Rows = field(default_factory=_Rows)


class _NotAFileError(OSError):
    """A name of the log that is not a regular file (a directory, a FIFO)."""


@dataclass(kw_only=True)
class _Call:
    """One call's reads: the entries to keep, and what each file gave."""

    known: dict[int, _FileRead]
    #: The files read in this call.
    kept: dict[int, _FileRead] = field(default_factory=dict)
    #: The reads so far of files that could not be read now (a read in this call, under
    #: another name, supersedes one).
    held: dict[int, _FileRead] = field(default_factory=dict)
    pieces: list[_Piece] = field(default_factory=list)
    tried: set[Path] = field(default_factory=set)
    vanished: bool = False

    def unread(self, path: Path, exc: OSError, *, inode: int | None, doing: str = "read") -> None:
        """``path`` could not be read: named, and its read so far held for the next (by
        its inode, or by its name where it could not even be opened)."""
        if inode not in self.known:
            named = (i for i, e in self.known.items() if e.name == path.name)
            inode = next((i for i in named if i not in self.kept), None)
        if inode is not None:
            self.held[inode] = self.known[inode]
        why = "not a regular file" if isinstance(exc, _NotAFileError) else exc.strerror or str(exc)
        if exc.filename is not None and exc.filename != str(path):
            why += f": {exc.filename}"
        problem = Problem(
            source=str(path), message=f"cannot {doing} (retried at the next read): {why}"
        )
        piece = _Piece(inode=None, restarted=False)
        piece.passing.skip([problem], 0)
        piece.passing.unread.append(str(path))
        self.pieces.append(piece)

    def missing(self) -> bool:
        """Whether a file was not found, or a file read before was not met."""
        return self.vanished or not self.known.keys() <= self.kept.keys() | self.held.keys()

    def entries(self) -> dict[int, _FileRead]:
        return {**self.held, **self.kept}


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
            new.add(piece.passing)
        return _combined(new, source=str(self.path))

    def _read_pieces(self) -> list[_Piece]:
        """What each file of the log now gained since the last call, oldest file first
        (a file met at a second listing after the others); files gone are forgotten.
        A file that cannot be read is a piece that says so, its read kept as it was."""
        call = _Call(known=self._files)
        for _ in range(_LISTINGS):
            try:
                listed = [p for p in self.files() if p not in call.tried]
            except FileNotFoundError:  # no log yet (its directory not made)
                listed = []
            except OSError as exc:  # the directory itself: nothing read, nothing forgotten
                call.unread(self.path, exc, inode=None, doing="list its files")
                call.held = {**self._files, **call.held}
                break
            for path in listed:
                call.tried.add(path)
                self._read_file(path, call)
            if not call.missing():
                break
            call.vanished = False
        self._files = call.entries()
        return call.pieces

    def _read_file(self, path: Path, call: _Call) -> None:
        inode: int | None = None
        try:
            with _opened(path) as (handle, stat):
                inode = stat.st_ino
                if inode in call.kept:  # read already in this call, under another name
                    return
                entry, fresh = self._entry(path, stat)
                moved = inode in self._files and self._files[inode].name != path.name
                if path.suffix == ".parquet":
                    stamp = (stat.st_size, stat.st_mtime_ns)
                    piece = _read_parquet(
                        handle, path, entry, inode=inode, fresh=fresh, stamp=stamp
                    )
                else:
                    piece = _read_new_lines(
                        handle,
                        path,
                        entry,
                        inode=inode,
                        fresh=fresh,
                        moved=moved,
                        ended=path != self.path,  # a rotation: no longer written
                    )
        except FileNotFoundError:  # rotated, compacted or deleted while listed
            call.vanished = True
            return
        except OSError as exc:
            call.unread(path, exc, inode=inode)
            return
        call.kept[inode] = entry
        call.pieces.append(piece)

    def _entry(self, path: Path, stat: os.stat_result) -> tuple[_FileRead, bool]:
        """A copy of the file's read so far (kept only once its read succeeds, so a read
        that fails part-way gives the same rows again at the next call), and whether
        the file is new (or a deleted file's inode reused under another name)."""
        entry = self._files.get(stat.st_ino)
        if entry is None or (path.suffix == ".parquet" and entry.name != path.name):
            return _FileRead(name=path.name), True
        return replace(entry, name=path.name), False


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """``path`` opened without waiting (a FIFO would wait for a writer), and refused
    unless it is a regular file; the stat is the opened file's, so a rename between a
    stat and the open cannot pair one file's read with another file's bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        stat = os.fstat(fd)
        if not file_mode.S_ISREG(stat.st_mode):
            raise _NotAFileError()
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle, stat


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
        passing = _Rows()
        for piece in self._tail._read_pieces():
            passing.add(piece.passing)
            if piece.inode is None:
                continue
            rows = _Rows() if piece.restarted else self._kept.get(piece.inode, _Rows())
            if piece.rewritten:
                rows.skipped, rows.skipped_rows = [], 0
            rows.add(piece)
            kept[piece.inode] = rows
        for inode in self._tail._files.keys() - kept.keys():  # held: they could not be read
            kept[inode] = self._kept.get(inode, _Rows())
        self._kept = kept  # files gone are forgotten, with their rows
        whole = _Rows()
        for rows in kept.values():
            whole.add(rows)
        whole.add(passing)
        return _combined(whole, source=str(self.path))


def _read_parquet(
    handle: BinaryIO,
    path: Path,
    entry: _FileRead,
    *,
    inode: int,
    fresh: bool,
    stamp: tuple[int, int],
) -> _Piece:
    if entry.stamp == stamp:
        return _Piece(inode=inode, restarted=fresh)
    piece = _Piece(inode=inode, restarted=True)
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


def _read_new_lines(
    handle: BinaryIO,
    path: Path,
    entry: _FileRead,
    *,
    inode: int,
    fresh: bool,
    moved: bool,
    ended: bool,
) -> _Piece:
    """Parse the complete lines after ``entry.offset`` (from the start if the file is
    not the one read before). Read again from its start under the name it had, the file
    was truncated in place and the rows it gave stand; under another name (``moved``),
    it is another file on the inode of one deleted, and they are void."""
    data, restarted = _new_bytes(handle, entry)
    void = fresh or (restarted and moved)
    piece = _Piece(inode=inode, restarted=void, rewritten=restarted and not void)
    end = data.rfind(b"\n") + 1  # a half-written last line waits for the next read
    if ended and end < len(data) and data[end:].strip():
        number = entry.lines + data[:end].count(b"\n") + 1
        message = "a last line without its newline, left out until it ends"
        piece.passing.skip([Problem(source=str(path), entry=f"line {number}", message=message)], 1)
    if end == 0:
        return piece
    records, numbers, bad = _parse_lines(data[:end].split(b"\n")[:-1], first=entry.lines + 1)
    if len(entry.head) < _HEAD_BYTES:  # the head is all the file read so far
        entry.head = (entry.head + data[:end])[:_HEAD_BYTES]
    entry.offset += end
    entry.lines += data[:end].count(b"\n")
    entry.tail = (entry.tail + data[:end])[-_TAIL_BYTES:]
    if bad:
        message = f"{len(bad)} lines that are not JSON objects"
        piece.skip([Problem(source=str(path), entry=lines_entry(bad), message=message)], len(bad))
    if records:
        _add_records(piece, records, source=str(path), lines=numbers)
    return piece


def _add_records(
    rows: _Rows, records: list[dict[str, object]], *, source: str, lines: list[int]
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


def _new_bytes(handle: BinaryIO, entry: _FileRead) -> tuple[bytes, bool]:
    """The file's bytes after ``entry.offset``, and whether they are from its start
    instead (``entry`` reset): the file is shorter, or its first bytes or those before
    the offset are not the ones read."""
    size = handle.seek(0, os.SEEK_END)
    restarted = False
    if entry.offset and not _continues(handle, entry, size=size):
        entry.offset, entry.lines, entry.head, entry.tail = 0, 0, b"", b""
        restarted = True
    handle.seek(entry.offset)
    return handle.read(size - entry.offset), restarted


def _continues(handle: BinaryIO, entry: _FileRead, *, size: int) -> bool:
    """Whether the file is still the one read up to ``entry.offset``. Truncated and
    written again past the offset (copytruncate), the bytes before the offset may be
    the same (rows of one length end alike); its first row is another."""
    if size < entry.offset:
        return False
    handle.seek(0)
    if handle.read(len(entry.head)) != entry.head:
        return False
    handle.seek(entry.offset - len(entry.tail))
    return handle.read(len(entry.tail)) == entry.tail


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
