"""One file of the router's live request log: where its read stands, and its new bytes.

A file is known by its inode (``placement.adapters.live_request_log`` keys the reads by
it). ``FileRead`` holds how far the file was read and its fingerprint: its first bytes
(up to 1 KiB) and the 64 before the read offset, as read. ``new_bytes`` gives the bytes
past the offset if the file still is the one read (no shorter, and both fingerprints
the same), else all of it from its start: truncated in place (logrotate's
``copytruncate``), even if it grew past the offset again. ``opened`` opens a name of
the log without waiting and refuses what is not a regular file.

What the bytes mean (lines, rows) is ``live_request_log_rows``'s; which files make the
log, ``live_request_log``'s. Must not write: the router owns the files.
"""

from __future__ import annotations

import contextlib
import os
import stat as file_mode
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

#: The file's first bytes, kept as read: a file whose start differs is another file.
HEAD_BYTES = 1024
#: Bytes before the read offset that must be unchanged for a file to be read on from it.
TAIL_BYTES = 64


@dataclass(kw_only=True)
class FileRead:
    """Where the read of one file (by inode) stands."""

    name: str
    offset: int = 0
    lines: int = 0
    head: bytes = b""
    tail: bytes = b""
    #: A Parquet file's stamp: read once, again only if it changed.
    stamp: tuple[int, int] | None = None

    def advance(self, data: bytes) -> None:
        """``data``, the complete lines read past the offset, read: the offset and the
        fingerprint move on."""
        if len(self.head) < HEAD_BYTES:  # the head is all the file read so far
            self.head = (self.head + data)[:HEAD_BYTES]
        self.offset += len(data)
        self.lines += data.count(b"\n")
        self.tail = (self.tail + data)[-TAIL_BYTES:]


class NotAFileError(OSError):
    """A name of the log that is not a regular file (a directory, a FIFO)."""


@contextlib.contextmanager
def opened(path: Path) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """``path`` opened without waiting (a FIFO would wait for a writer), and refused
    unless it is a regular file; the stat is the opened file's, so a rename between a
    stat and the open cannot pair one file's read with another file's bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        stat = os.fstat(fd)
        if not file_mode.S_ISREG(stat.st_mode):
            raise NotAFileError()
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        yield handle, stat


def new_bytes(handle: BinaryIO, entry: FileRead) -> tuple[bytes, bool]:
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


def _continues(handle: BinaryIO, entry: FileRead, *, size: int) -> bool:
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
