"""The router's request-log files: how they are laid out, written, and read back live.

Whatever kills the writer (SIGKILL included), every file it leaves under its own name
is whole and readable, and at most the batch being written is lost:

- **A directory of Parquet files.** Each batch (one flush of the router) is a part
  file ``requests-YYYYMMDDTHH.partNNNNNN.parquet``, written under a hidden temporary
  name and renamed in whole (``placement.inputs.files.write_through``). Once a batch of
  a later hour is written, or at close, an hour's parts are compacted into
  ``requests-YYYYMMDDTHH.parquet`` (renamed in whole; its metadata says up to which
  part it holds), then the parts are deleted. A start removes the hidden temporary
  files a killed writer left and the parts a compacted file already holds (a kill
  between the rename and the deletes). A row that arrives after its hour was
  compacted (a long stream) is a new part, compacted into the hour with the next batch.
- **A JSON-lines file**, appended and flushed per batch. Past ``rotate_bytes`` it is
  renamed ``<stem>.YYYYMMDDTHHMMSS<suffix>`` (its last row's time) and a new file
  begun. A start cuts the half-written last line a killed writer left.

``row_problem`` says why a row cannot be written (text that is not Unicode, a number
out of range); the router's logger drops such rows and counts them.

``placement.adapters.live_request_log`` reads either layout back as the controller's
ingest does, incrementally. ``PARQUET_NAME`` and ``rotated_pattern`` are the names
both sides agree on.

Must not decide what goes in a row: ``placement.router`` fills them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from placement.inputs.files import fsync_directory, write_through

log = logging.getLogger("lorafleet.request_log")


class LogRow(NamedTuple):
    """One request's row. A named tuple, not a frozen dataclass: the proxy builds one
    per request on the event loop, and a tuple is built in a quarter of the time (some
    0.3 us against 1.1 us); it is as immutable, and its fields are named alike."""

    ts_s: float
    adapter: str
    tenant: str | None
    prompt_tokens: int | None
    output_tokens: int | None
    pod: str | None
    outcome: str | None
    ttft_ms: float | None
    status: int


SCHEMA = pa.schema(
    [
        ("ts", pa.timestamp("us", tz="UTC")),
        ("adapter", pa.string()),
        ("tenant", pa.string()),
        ("prompt_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("pod", pa.string()),
        ("outcome", pa.string()),
        ("ttft_ms", pa.float64()),
        ("status", pa.int32()),
    ]
)

_INT64 = 2**63 - 1
#: Timestamps a row may carry: 1970 to 9999, as Parquet and ``datetime`` take them.
_TS_RANGE_S = (0.0, 253_402_300_799.0)


def row_problem(row: LogRow) -> str | None:
    """Why ``row`` cannot be written, or None."""
    for name in ("adapter", "tenant", "pod", "outcome"):
        text = getattr(row, name)
        if text is None:
            continue
        if not isinstance(text, str):
            return f"{name} is not text"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return f"{name} is not valid Unicode"
    if not (math.isfinite(row.ts_s) and _TS_RANGE_S[0] <= row.ts_s <= _TS_RANGE_S[1]):
        return "ts is out of range"
    for name in ("prompt_tokens", "output_tokens"):
        count = getattr(row, name)
        if count is not None and not (isinstance(count, int) and 0 <= count <= _INT64):
            return f"{name} is out of range"
    if row.ttft_ms is not None and not math.isfinite(row.ttft_ms):
        return "ttft_ms is not finite"
    if not (isinstance(row.status, int) and 0 <= row.status < 1000):
        return "status is out of range"
    return None


def _iso(ts_s: float) -> str:
    return datetime.fromtimestamp(ts_s, tz=UTC).isoformat().replace("+00:00", "Z")


def _hour(ts_s: float) -> str:
    return datetime.fromtimestamp(ts_s, tz=UTC).strftime("%Y%m%dT%H")


def _table(rows: Sequence[LogRow]) -> pa.Table:
    ordered = sorted(rows, key=lambda row: row.ts_s)
    return pa.table(
        {
            "ts": pa.array([int(r.ts_s * 1_000_000) for r in ordered], pa.timestamp("us", "UTC")),
            "adapter": [r.adapter for r in ordered],
            "tenant": [r.tenant for r in ordered],
            "prompt_tokens": pa.array([r.prompt_tokens for r in ordered], pa.int64()),
            "output_tokens": pa.array([r.output_tokens for r in ordered], pa.int64()),
            "pod": [r.pod for r in ordered],
            "outcome": [r.outcome for r in ordered],
            "ttft_ms": pa.array([r.ttft_ms for r in ordered], pa.float64()),
            "status": pa.array([r.status for r in ordered], pa.int32()),
        },
        schema=SCHEMA,
    )


# -- Parquet ---------------------------------------------------------------------------

PARQUET_NAME = re.compile(r"^requests-(?P<hour>\d{8}T\d{2})(?:\.part(?P<seq>\d{6,}))?\.parquet$")
#: The compacted file's metadata key: the last part number it holds.
_THROUGH = b"lorafleet.parts_through"


def _is_debris(path: Path) -> bool:
    """A temporary file a killed writer left (``write_through``'s hidden names)."""
    return path.name.startswith(".requests-") and path.name.endswith(".tmp")


class ParquetRequestLog:
    """Hourly Parquet files in ``directory``: a part per batch, compacted per hour."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        #: Part files not yet compacted, per hour.
        self._parts: dict[str, list[Path]] = defaultdict(list)
        self._next_seq: dict[str, int] = defaultdict(lambda: 1)
        self._newest_hour = ""
        self._recover()

    def hour_path(self, hour: str) -> Path:
        return self.directory / f"requests-{hour}.parquet"

    def _recover(self) -> None:
        """Remove a killed writer's debris; note the parts and the next part numbers."""
        through: dict[str, int] = {}
        for path in sorted(self.directory.iterdir()):
            if _is_debris(path):
                path.unlink(missing_ok=True)
                log.warning(
                    "removed %s, a request-log file a stopped writer left half-written", path
                )
                continue
            found = PARQUET_NAME.match(path.name)
            if found is None:
                continue
            hour, seq = found["hour"], found["seq"]
            if seq is None:
                through[hour] = _parts_through(path)
            else:
                self._parts[hour].append(path)
                self._next_seq[hour] = max(self._next_seq[hour], int(seq) + 1)
        for hour, last in through.items():
            self._next_seq[hour] = max(self._next_seq[hour], last + 1)
            held = [p for p in self._parts.get(hour, []) if _seq(p) <= last]
            for part in held:  # compacted already: a kill came between rename and deletes
                part.unlink(missing_ok=True)
            self._parts[hour] = [p for p in self._parts.get(hour, []) if _seq(p) > last]

    def write(self, rows: Sequence[LogRow]) -> None:
        by_hour: dict[str, list[LogRow]] = defaultdict(list)
        for row in rows:
            by_hour[_hour(row.ts_s)].append(row)
        for hour, batch in sorted(by_hour.items()):
            self._write_part(hour, batch)
        if by_hour:
            self._newest_hour = max(self._newest_hour, *by_hour)
        for hour in sorted(self._parts):
            if hour < self._newest_hour:
                self.compact(hour)

    def _write_part(self, hour: str, rows: Sequence[LogRow]) -> None:
        seq = self._next_seq[hour]
        path = self.directory / f"requests-{hour}.part{seq:06d}.parquet"
        table = _table(rows)
        write_through(path, lambda temporary: pq.write_table(table, temporary))
        self._next_seq[hour] = seq + 1
        self._parts[hour].append(path)

    def compact(self, hour: str) -> None:
        """The hour's parts (and its compacted file, if any) as one compacted file."""
        parts = sorted(self._parts.pop(hour, []), key=_seq)
        if not parts:
            return
        target = self.hour_path(hour)
        tables = [table for table in (_readable(target),) if table is not None]
        held: list[Path] = []
        for part in parts:
            table = _readable(part)
            if table is not None:
                tables.append(table)
                held.append(part)
        if tables:
            merged = pa.concat_tables(tables).sort_by("ts")
            merged = merged.replace_schema_metadata({_THROUGH: str(_seq(parts[-1])).encode()})
            write_through(target, lambda temporary: pq.write_table(merged, temporary))
        for part in held:
            part.unlink(missing_ok=True)
        fsync_directory(self.directory)

    def close(self) -> None:
        """Compact every hour with parts: the directory is then one file per hour."""
        for hour in sorted(self._parts):
            self.compact(hour)


def _seq(path: Path) -> int:
    found = PARQUET_NAME.match(path.name)
    return int(found["seq"]) if found is not None and found["seq"] is not None else 0


def _readable(path: Path) -> pa.Table | None:
    """The file's rows; None if it does not exist, or if it cannot be read (then it is
    renamed ``<name>.unreadable`` so that readers and compactions pass it by)."""
    try:
        return pq.read_table(path).cast(SCHEMA).replace_schema_metadata(None)
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException) as exc:
        aside = path.with_name(path.name + ".unreadable")
        path.rename(aside)
        log.warning("request-log file %s is unreadable, renamed %s: %s", path, aside, exc)
        return None


def _parts_through(path: Path) -> int:
    """The last part number a compacted file holds (0: none, or unreadable)."""
    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException):
        return 0
    value = metadata.get(_THROUGH, b"0")
    return int(value) if value.isdigit() else 0


# -- JSON lines ------------------------------------------------------------------------


#: The suffixes of a JSON-lines request log.
_JSON_LINES = (".jsonl", ".ndjson")


def worker_log_path(path: Path, worker: int) -> Path:
    """Worker ``worker``'s request log under ``lorafleet router --workers N``:
    ``requests.w1.jsonl`` beside ``requests.jsonl``, or the directory ``requests/w1``
    inside a Parquet directory ``requests``; worker 0 writes ``path`` itself."""
    if worker == 0:
        return path
    if path.suffix in _JSON_LINES:
        return path.with_name(f"{path.stem}.w{worker}{path.suffix}")
    return path / f"w{worker}"


def worker_logs(path: Path) -> list[Path]:
    """The further workers' logs beside worker 0's ``path`` now (``worker_log_path``'s
    names, in worker order); none for a file that is no router log."""
    if path.suffix in _JSON_LINES:
        pattern = re.compile(rf"^{re.escape(path.stem)}\.w(\d+){re.escape(path.suffix)}$")
        listed = list(path.parent.iterdir()) if path.parent.is_dir() else []
        workers = {int(m[1]): p for p in listed if (m := pattern.match(p.name)) and p.is_file()}
    elif path.is_dir():
        pattern = re.compile(r"^w(\d+)$")
        workers = {
            int(m[1]): p for p in path.iterdir() if (m := pattern.match(p.name)) and p.is_dir()
        }
    else:
        return []
    return [workers[worker] for worker in sorted(workers) if worker > 0]


def rotated_pattern(active: Path) -> re.Pattern[str]:
    """The names the rotations of ``active`` take (``<stem>.<time>[-n]<suffix>``)."""
    stem, suffix = re.escape(active.stem), re.escape(active.suffix)
    return re.compile(rf"^{stem}\.\d{{8}}T\d{{6}}(?:-\d+)?{suffix}$")


class JsonLinesRequestLog:
    """A JSON-lines file, appended per batch, rotated past ``rotate_bytes`` (None: never;
    the router passes ``RouterSettings.log_rotate_bytes``)."""

    def __init__(self, path: str | Path, *, rotate_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.rotate_bytes = rotate_bytes
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_half_written_line(self.path)
        self._file: IO[bytes] = self.path.open("ab")

    def write(self, rows: Sequence[LogRow]) -> None:
        if not rows:
            return
        lines = []
        for row in rows:
            record = {
                "ts": _iso(row.ts_s),
                "adapter": row.adapter,
                "tenant": row.tenant,
                "prompt_tokens": row.prompt_tokens,
                "output_tokens": row.output_tokens,
                "pod": row.pod,
                "outcome": row.outcome,
                "ttft_ms": None if row.ttft_ms is None else round(row.ttft_ms, 3),
                "status": row.status,
            }
            lines.append(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.write("".join(lines).encode("utf-8"))
        self._file.flush()
        os.fsync(self._file.fileno())
        if self.rotate_bytes is not None and self._file.tell() >= self.rotate_bytes:
            self._rotate(max(row.ts_s for row in rows))

    def _rotate(self, last_ts_s: float) -> None:
        stamp = datetime.fromtimestamp(last_ts_s, tz=UTC).strftime("%Y%m%dT%H%M%S")
        target = self.path.with_name(f"{self.path.stem}.{stamp}{self.path.suffix}")
        index = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.stem}.{stamp}-{index}{self.path.suffix}")
            index += 1
        self._file.close()
        os.rename(self.path, target)
        fsync_directory(self.path.parent)
        self._file = self.path.open("ab")

    def close(self) -> None:
        self._file.close()


def _cut_half_written_line(path: Path) -> None:
    """Truncate ``path`` after its last newline: a killed writer's half line goes."""
    with contextlib.suppress(FileNotFoundError), path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        end = size
        while end > 0:
            start = max(0, end - 65536)
            handle.seek(start)
            block = handle.read(end - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        if end != size:
            handle.truncate(end)
            log.warning("cut a half-written line (%d bytes) at the end of %s", size - end, path)


def open_request_log(
    target: str | Path, *, rotate_bytes: int | None = None
) -> JsonLinesRequestLog | ParquetRequestLog:
    """A ``.jsonl`` path appends JSON lines; anything else is a directory of Parquet files."""
    path = Path(target)
    if path.suffix in (".jsonl", ".ndjson"):
        return JsonLinesRequestLog(path, rotate_bytes=rotate_bytes)
    return ParquetRequestLog(path)
