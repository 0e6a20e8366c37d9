"""Which line of a CSV file each row pandas read from it is, so that a fault names it.

pandas' reader skips blank lines (empty, or of only spaces and tabs) and reads a
quoted field across lines as one, so a row's place in the frame is not its line:
``CsvLines`` gives each data row's line as the file counts them (from 1, the header's
line and blank lines counted; ``\\r\\n``, ``\\r`` and ``\\n`` each end one). It reads
the file again the first time a line is asked for, so that a file without a fault
costs nothing more than pandas' read. Reads files; writes nothing.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO, overload


class CsvLines(Sequence[int]):
    """Each data row's line in the CSV file at ``path`` (read with a header), of the
    ``rows`` rows pandas read from it. Where the file's records are not those rows (a
    file pandas reads otherwise than the csv module does), row i is line i + 2: the
    line it would be on with no blank lines and no field across lines."""

    def __init__(self, path: Path, *, rows: int) -> None:
        self._path = path
        self._rows = rows
        self._numbers: list[int] | None = None

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        return self._lines()[index]

    def __len__(self) -> int:
        return self._rows

    def _lines(self) -> list[int]:
        if self._numbers is None:
            try:
                with _open(self._path) as handle:
                    numbers = _record_lines(handle)[1:]  # the header's line is no row
            except (OSError, EOFError, UnicodeDecodeError, csv.Error):
                numbers = []
            if len(numbers) != self._rows:
                numbers = [i + 2 for i in range(self._rows)]
            self._numbers = numbers
        return self._numbers


def _record_lines(handle: TextIO) -> list[int]:
    """The line each record of a CSV text starts on (from 1), blank lines left out as
    pandas leaves them out; ``handle`` opened with ``newline=""``."""
    raw = _Lines(handle)
    reader = csv.reader(raw)
    starts: list[int] = []
    for _ in reader:
        start, end = raw.first_of_record, reader.line_num
        if start != end or raw.last.strip(" \t\r\n"):
            starts.append(start)
        raw.first_of_record = end + 1
    return starts


class _Lines:
    """The lines of a text, remembering the last one given (to tell a blank line from
    a record of one blank field: the csv module reads both as one field) and where the
    record being read started."""

    def __init__(self, handle: TextIO) -> None:
        self._handle = handle
        self.last = ""
        self.first_of_record = 1

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        self.last = next(self._handle)
        return self.last


def _open(path: Path) -> TextIO:
    """A CSV file (or a .gz of one) as text, line breaks as written (``newline=""``),
    a byte-order mark dropped as pandas drops it."""
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")
