"""Reading text files people write, and writing files so that no reader sees half of one.

``read_text`` turns a file that is not UTF-8 text (a binary dropped in by mistake) into
one ``InputError`` line naming the file and the first bad byte, never a traceback.

``write_atomically`` and ``write_through`` are how lorafleet writes a file a reader
may open at any moment and that must survive a crash (a plan, a request log, the
controller's state; the router workers' shared files, which live no longer than the
router, are renamed into place without an fsync: ``router.shared_scrapes.write_whole``,
``router.load_claims``): a temporary file with a unique name in the same directory,
written, flushed and fsynced, renamed over the target, then the directory fsynced so
that the rename itself survives a power cut. Two writers never share a temporary
file, and a crash leaves the old file or the new one, never a mix. Owns the file
system calls only.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from placement.errors import InputError, Problem


def read_text(path: Path) -> str:
    """The file as text; InputError (one line) when missing, unreadable or not UTF-8."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(
            [Problem(source=str(path), message=f"cannot read: {exc.strerror or exc}")]
        ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = raw[exc.start : exc.start + 1].hex()
        raise InputError(
            [
                Problem(
                    source=str(path),
                    message=f"not UTF-8 text (byte 0x{byte} at offset {exc.start}): "
                    "is this the right file?",
                )
            ]
        ) from None


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be
    opened, as on some network file systems)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_through(path: Path, write: Callable[[Path], None]) -> None:
    """Let ``write`` fill a fresh temporary file beside ``path``, then put it in place
    atomically and durably; on any failure the temporary file is removed and ``path``
    is left as it was. A missing directory is a ``FileNotFoundError`` that names it
    (an OSError, so writers that keep their rows for a retry still do)."""
    target = Path(path)
    if not target.parent.is_dir():
        what = "is not a directory" if target.parent.exists() else "does not exist"
        problem = f"cannot write {target}: {target.parent} {what}"
        raise FileNotFoundError(errno.ENOENT, problem, str(target.parent))
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    temporary = Path(name)
    try:
        write(temporary)
        with temporary.open("rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)


def write_atomically(path: Path, content: str | bytes) -> None:
    """Replace ``path`` with ``content`` (text is written as UTF-8), atomically."""
    data = content.encode("utf-8") if isinstance(content, str) else content

    def write(temporary: Path) -> None:
        temporary.write_bytes(data)

    write_through(path, write)
