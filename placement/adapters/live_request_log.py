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
- ``WorkersRequestLog(path).read()``: ``LiveRequestLog`` over worker 0's log and
  every further worker's (``router --workers N``), found again at each read.
- ``is_router_log_file(path)``: whether a JSON-lines file is the router's, so that
  ``forecast --log`` and ``backtest --log`` read it with its rotations.

This module lists the log's files, reads each (again under its new name if a rotation
moved it mid-read) and keeps the reads between calls; where one file's read stands and
its fingerprint are ``live_request_log_file``'s, what its bytes give
``live_request_log_rows``'s.

Must not write: the router owns the files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from placement.adapters.live_request_log_file import FileRead, NotAFileError, opened
from placement.adapters.live_request_log_rows import (
    Piece,
    Rows,
    combined,
    read_new_lines,
    read_parquet,
)
from placement.adapters.request_log_files import SCHEMA, rotated_pattern, worker_logs
from placement.errors import InputError, Problem
from placement.inputs.request_log import RequestLog

#: Listings per call at most: a file renamed or deleted while read has the log listed
#: again (a rotation or a compaction under way); past this the next call goes on.
_LISTINGS = 3


@dataclass(kw_only=True)
class _Call:
    """One call's reads: the entries to keep, and what each file gave."""

    known: dict[int, FileRead]
    #: The files read in this call.
    kept: dict[int, FileRead] = field(default_factory=dict)
    #: The reads so far of files that could not be read now (a read in this call, under
    #: another name, supersedes one).
    held: dict[int, FileRead] = field(default_factory=dict)
    pieces: list[Piece] = field(default_factory=list)
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
        why = "not a regular file" if isinstance(exc, NotAFileError) else exc.strerror or str(exc)
        if exc.filename is not None and exc.filename != str(path):
            why += f": {exc.filename}"
        problem = Problem(
            source=str(path), message=f"cannot {doing} (retried at the next read): {why}"
        )
        piece = Piece(inode=None, restarted=False)
        piece.passing.skip([problem], 0)
        piece.passing.unread.append(str(path))
        self.pieces.append(piece)

    def missing(self) -> bool:
        """Whether a file was not found, or a file read before was not met."""
        return self.vanished or not self.known.keys() <= self.kept.keys() | self.held.keys()

    def entries(self) -> dict[int, FileRead]:
        return {**self.held, **self.kept}


class RequestLogTail:
    """The router's request log, read incrementally: ``read_new`` returns the rows read
    since the last call (see the module's docstring for rows given twice)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._files: dict[int, FileRead] = {}

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
        new = Rows()
        for piece in self._read_pieces():
            new.add(piece)
            new.add(piece.passing)
        return combined(new, source=str(self.path))

    def _read_pieces(self) -> list[Piece]:
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
            with opened(path) as (handle, stat):
                inode = stat.st_ino
                if inode in call.kept:  # read already in this call, under another name
                    return
                entry, fresh = self._entry(path, stat)
                moved = inode in self._files and self._files[inode].name != path.name
                if path.suffix == ".parquet":
                    stamp = (stat.st_size, stat.st_mtime_ns)
                    piece = read_parquet(handle, path, entry, inode=inode, fresh=fresh, stamp=stamp)
                else:
                    piece = read_new_lines(
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

    def _entry(self, path: Path, stat: os.stat_result) -> tuple[FileRead, bool]:
        """A copy of the file's read so far (kept only once its read succeeds, so a read
        that fails part-way gives the same rows again at the next call), and whether
        the file is new (or a deleted file's inode reused under another name)."""
        entry = self._files.get(stat.st_ino)
        if entry is None or (path.suffix == ".parquet" and entry.name != path.name):
            return FileRead(name=path.name), True
        return replace(entry, name=path.name), False


class LiveRequestLog:
    """The router's request log read incrementally: ``read`` returns all of it, having
    read only what is new since the last call."""

    def __init__(self, path: str | Path) -> None:
        self._tail = RequestLogTail(path)
        self._kept: dict[int, Rows] = {}

    @property
    def path(self) -> Path:
        return self._tail.path

    def files(self) -> list[Path]:
        return self._tail.files()

    def read(self) -> RequestLog:
        kept: dict[int, Rows] = {}
        passing = Rows()
        for piece in self._tail._read_pieces():
            passing.add(piece.passing)
            if piece.inode is None:
                continue
            rows = Rows() if piece.restarted else self._kept.get(piece.inode, Rows())
            if piece.rewritten:
                rows.skipped, rows.skipped_rows = [], 0
            rows.add(piece)
            kept[piece.inode] = rows
        for inode in self._tail._files.keys() - kept.keys():  # held: they could not be read
            kept[inode] = self._kept.get(inode, Rows())
        self._kept = kept  # files gone are forgotten, with their rows
        whole = Rows()
        for rows in kept.values():
            whole.add(rows)
        whole.add(passing)
        return combined(whole, source=str(self.path))


class WorkersRequestLog:
    """The request logs of a router and its further workers (``lorafleet router
    --workers N``): worker 0's ``path`` and the workers' logs found beside it at each
    read (``request_log_files.worker_logs``), each read as a ``LiveRequestLog``; one
    log of all their rows. A log that is not the router's (one file of counts) is read
    alone: counts beside worker logs are an ``InputError`` naming ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._logs: dict[Path, LiveRequestLog] = {}

    def read(self) -> RequestLog:
        paths = [self.path, *worker_logs(self.path)]
        self._logs = {path: self._logs.get(path) or LiveRequestLog(path) for path in paths}
        logs = [log.read() for log in self._logs.values()]
        if len(logs) == 1:
            return logs[0]
        read = [log for log in logs if not log.frame.empty]
        if any(log.aggregated for log in read):  # never the router's: someone's counts
            raise InputError(
                [
                    Problem(
                        source=str(self.path),
                        message="pre-aggregated counts beside worker logs (w1, ...): "
                        "give one log file",
                    )
                ]
            )
        frames = [log.frame for log in read] or [logs[0].frame]
        frame = pd.concat(frames, ignore_index=True).sort_values("ts", kind="stable")
        return RequestLog(
            frame=frame.reset_index(drop=True),
            aggregated=False,
            source=f"{self.path} (and {len(logs) - 1} worker logs)",
            skipped=tuple(problem for log in logs for problem in log.skipped),
            skipped_rows=sum(log.skipped_rows for log in logs),
            unread_files=tuple(name for log in logs for name in log.unread_files),
        )


#: The suffixes the router writes a JSON-lines log under (``open_request_log``).
_ROUTER_LINES = (".jsonl", ".ndjson")
#: How far into a JSON-lines file its first line is looked for.
_FIRST_LINE_BYTES = 64 * 1024


def is_router_log_file(path: Path) -> bool:
    """Whether ``path`` is the router's JSON-lines log, to be read with its rotations
    (``WorkersRequestLog``): a rotation or a further worker's file beside it, or a first
    line with the router's fields (``SCHEMA``). Read alone, its rotations' requests
    would be lost (all but the newest ``log_rotate_bytes``)."""
    if path.suffix not in _ROUTER_LINES:
        return False
    try:
        pattern = rotated_pattern(path)
        if any(pattern.match(p.name) for p in path.parent.iterdir()) or worker_logs(path):
            return True
        with path.open("rb") as handle:
            first = handle.read(_FIRST_LINE_BYTES).split(b"\n", 1)[0]
    except OSError:  # no such file, or no directory: read as a file, whose read says why
        return False
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and set(record) == set(SCHEMA.names)
