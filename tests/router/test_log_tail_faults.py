"""The router's request log read live when its files misbehave: a file that cannot be
read, a file truncated in place (logrotate's ``copytruncate``) or rotated while it is
listed, a last line that will never end. Each is named, and none stops the reads of the
other files or loses a row another read can still get (``placement.adapters.
live_request_log``). Real files in ``tmp_path``; the log's files change between reads,
or, for a race, between the listing and the reads, as the test's own step."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from placement.adapters.live_request_log import LiveRequestLog, RequestLogTail
from placement.adapters.request_log_files import JsonLinesRequestLog, LogRow, ParquetRequestLog
from placement.inputs.request_log import RequestLog

T0 = 1_773_288_000.0  # 2026-03-12T04:00:00Z
ROTATED = "router.20260312T040000.jsonl"


def _row(index: int) -> LogRow:
    # Every row the same length, and its last 64 bytes the same: a file rewritten
    # with other rows has the same bytes before any line's end.
    return LogRow(T0 + index, "alpha", f"t{index}", 3, 4, "pod-0", "gpu_hit", 12.5, 200)


def _write(path: Path, *indices: int) -> None:
    sink = JsonLinesRequestLog(path)
    sink.write([_row(i) for i in indices])
    sink.close()


def _tenants(log: RequestLog) -> list[str]:
    return list(log.frame["tenant"]) if "tenant" in log.frame else []


def _loop(link: Path) -> None:
    """``link`` made a symbolic link to itself: opening it fails (ELOOP), even as root."""
    link.unlink(missing_ok=True)
    link.symlink_to(link.name)


# -- a file that cannot be read --------------------------------------------------------


def test_a_file_that_cannot_be_read_is_named_and_skipped_and_retried_from_where_it_was(
    tmp_path: Path,
) -> None:
    """A rotated file that fails at every read (here a link that loops) used to fail the
    whole read, every time: the active file's rows were never read either."""
    path = tmp_path / "router.jsonl"
    kept = tmp_path / "kept" / "rotated.jsonl"
    kept.parent.mkdir()
    _write(kept, 0)
    rotated = tmp_path / ROTATED
    rotated.symlink_to(kept)
    _write(path, 1)
    tail, whole = RequestLogTail(path), LiveRequestLog(path)
    assert _tenants(tail.read_new()) == ["t0", "t1"]
    assert _tenants(whole.read()) == ["t0", "t1"]
    _write(kept, 2)  # the rotated file gains a row while it cannot be read
    _loop(rotated)
    _write(path, 3)
    for log, rows in ((tail.read_new(), ["t3"]), (whole.read(), ["t0", "t1", "t3"])):
        assert _tenants(log) == rows
        [problem] = log.skipped
        assert str(problem).startswith(f"{rotated}: cannot read (retried at the next read): ")
        assert "Too many levels of symbolic links" in problem.message
        assert log.unread_files == (str(rotated),)
    rotated.unlink()
    rotated.symlink_to(kept)  # readable again: read on from where it stood
    assert _tenants(tail.read_new()) == ["t2"]
    log = whole.read()
    assert _tenants(log) == ["t0", "t1", "t2", "t3"]
    assert log.skipped == () and log.unread_files == ()


def test_the_active_file_that_cannot_be_read_keeps_the_rotations_read(tmp_path: Path) -> None:
    path = tmp_path / "router.jsonl"
    _write(tmp_path / ROTATED, 0)
    _write(path, 1)
    whole = LiveRequestLog(path)
    assert _tenants(whole.read()) == ["t0", "t1"]
    real = path.rename(tmp_path / "aside")
    _loop(path)
    log = whole.read()
    assert _tenants(log) == ["t0", "t1"]  # the active file's rows stay known
    assert log.unread_files == (str(path),)
    path.unlink()
    real.rename(path)
    _write(path, 2)
    assert _tenants(whole.read()) == ["t0", "t1", "t2"]


def test_a_log_whose_directory_cannot_be_listed_keeps_what_it_read(tmp_path: Path) -> None:
    """Its directory is a file for a moment (a listing that fails: as root, the one
    failure a test can make). The read raised, so the ingest lost the whole live log."""
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "router.jsonl"
    _write(directory / ROTATED, 0)
    _write(path, 1)
    whole = LiveRequestLog(path)
    assert _tenants(whole.read()) == ["t0", "t1"]
    directory.rename(tmp_path / "aside")
    directory.write_text("")
    log = whole.read()
    assert _tenants(log) == ["t0", "t1"] and log.unread_files == (str(path),)
    assert [str(p) for p in log.skipped] == [
        f"{path}: cannot list its files (retried at the next read): Not a directory: {directory}"
    ]
    directory.unlink()
    (tmp_path / "aside").rename(directory)
    _write(path, 2)
    assert _tenants(whole.read()) == ["t0", "t1", "t2"]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: p.mkdir(), id="a-directory"),
        pytest.param(os.mkfifo, id="a-fifo"),
    ],
)
def test_a_name_of_the_log_that_is_no_file_is_named_and_never_opened_for_reading(
    tmp_path: Path, make: Callable[[Path], None]
) -> None:
    """A FIFO opened for reading waits for a writer: the reader stood still for good."""
    path = tmp_path / "router.jsonl"
    make(tmp_path / ROTATED)
    _write(path, 0)
    log = RequestLogTail(path).read_new()
    assert _tenants(log) == ["t0"]
    [problem] = log.skipped
    assert str(problem) == (
        f"{tmp_path / ROTATED}: cannot read (retried at the next read): not a regular file"
    )


def test_a_parquet_name_that_is_a_directory_is_named_not_read_as_a_dataset(
    tmp_path: Path,
) -> None:
    for directory, index in ((tmp_path / "log", 0), (tmp_path / "other", 5)):
        sink = ParquetRequestLog(directory)
        sink.write([_row(index)])
        sink.close()
    inner = tmp_path / "log" / "requests-20260312T05.parquet"
    inner.mkdir()  # a directory of Parquet files, which pandas reads as one table
    shutil.copy(tmp_path / "other" / "requests-20260312T04.parquet", inner / "x.parquet")
    log = LiveRequestLog(tmp_path / "log").read()
    assert _tenants(log) == ["t0"]  # not t5, the directory's
    assert log.unread_files == (str(inner),)


# -- a file truncated in place, or rotated -----------------------------------------


def test_a_file_truncated_in_place_and_grown_past_the_old_offset_is_read_from_its_start(
    tmp_path: Path,
) -> None:
    """logrotate's copytruncate: the file copied aside (a name the log does not take),
    emptied, and written again past where the last read stopped before the next read.
    The 64 bytes before the old offset were the same, so the read went on from there:
    the rows before it were never read."""
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path)
    tail, whole = RequestLogTail(path), LiveRequestLog(path)
    sink.write([_row(i) for i in range(3)])
    assert _tenants(tail.read_new()) == ["t0", "t1", "t2"]
    assert _tenants(whole.read()) == ["t0", "t1", "t2"]
    shutil.copy(path, tmp_path / "router.jsonl.1")
    os.truncate(path, 0)
    sink.write([_row(i) for i in range(3, 7)])  # appended: at the new end
    sink.close()
    assert _tenants(tail.read_new()) == ["t3", "t4", "t5", "t6"]
    # The rows read before the truncation were requests all the same: kept.
    assert _tenants(whole.read()) == [f"t{i}" for i in range(7)]
    assert _tenants(tail.read_new()) == []


def test_a_copytruncate_copy_named_as_a_rotation_counts_its_rows_once(tmp_path: Path) -> None:
    """The copy (named ``<stem>.YYYYMMDDTHHMMSS.jsonl``) holds the rows read before and
    those written since the last read; the whole log has each once."""
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path)
    whole = LiveRequestLog(path)
    sink.write([_row(0), _row(1)])
    assert _tenants(whole.read()) == ["t0", "t1"]
    sink.write([_row(2)])  # not read before the copy
    shutil.copy(path, tmp_path / ROTATED)
    os.truncate(path, 0)
    sink.write([_row(3)])
    sink.close()
    assert _tenants(whole.read()) == ["t0", "t1", "t2", "t3"]


def test_truncated_to_empty_then_written_again_rows_come_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "router.jsonl"
    _write(path, 0, 1)
    tail = RequestLogTail(path)
    assert _tenants(tail.read_new()) == ["t0", "t1"]
    os.truncate(path, 0)
    log = tail.read_new()
    assert log.frame.empty and log.skipped == ()
    _write(path, 2)
    assert _tenants(tail.read_new()) == ["t2"]


def test_a_half_line_across_a_truncation_waits_and_is_read_once_whole(tmp_path: Path) -> None:
    path = tmp_path / "router.jsonl"
    _write(path, 0, 1)
    tail = RequestLogTail(path)
    assert _tenants(tail.read_new()) == ["t0", "t1"]
    os.truncate(path, 0)
    _write(path, 2)
    line = (tmp_path / "router.jsonl").read_bytes()
    with path.open("ab") as handle:  # past the old offset, the last line half-written
        handle.write(line.replace(b'"t2"', b'"t3"') + line.replace(b'"t2"', b'"t4"')[:30])
    assert _tenants(tail.read_new()) == ["t2", "t3"]
    with path.open("ab") as handle:
        handle.write(line.replace(b'"t2"', b'"t4"')[30:])
    assert _tenants(tail.read_new()) == ["t4"]


def test_rows_the_same_length_through_rename_rotations_each_once(tmp_path: Path) -> None:
    """A rotation keeps the file (its inode, its first bytes): it is read on, not again."""
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path, rotate_bytes=1)  # each write rotates
    tail, whole = RequestLogTail(path), LiveRequestLog(path)
    sink.write([_row(0)])
    assert _tenants(tail.read_new()) == ["t0"]
    for index in range(1, 4):
        sink.write([_row(index)])
    sink.close()
    assert _tenants(tail.read_new()) == ["t1", "t2", "t3"]
    assert _tenants(whole.read()) == ["t0", "t1", "t2", "t3"]


class _RotatedWhileListed(RequestLogTail):
    """The router rotates its file just after the reader listed the log's files."""

    rotate: bool = False

    def files(self) -> list[Path]:
        listed = super().files()
        if self.rotate:
            self.rotate = False
            self.path.rename(self.path.with_name(ROTATED))
            _write(self.path, 9)
        return listed


def test_a_file_rotated_between_the_listing_and_its_read_is_read_under_its_new_name(
    tmp_path: Path,
) -> None:
    """The listed name now held the new, empty file: the one read was lost to that read
    (and the whole log's rows of it forgotten until the next)."""
    path = tmp_path / "router.jsonl"
    _write(path, 0)
    whole = LiveRequestLog(path)
    listing = _RotatedWhileListed(path)
    whole._tail = listing
    assert _tenants(whole.read()) == ["t0"]
    _write(path, 1)
    listing.rotate = True
    assert _tenants(whole.read()) == ["t0", "t1", "t9"]


# -- a last line that will never end -------------------------------------------------


def test_a_rotated_file_ending_without_a_newline_names_its_last_line(tmp_path: Path) -> None:
    """Only the active file is being written: a rotation's unended last line will not
    end. It was waited for silently, for ever."""
    path = tmp_path / "router.jsonl"
    rotated = tmp_path / ROTATED
    _write(rotated, 0, 1)
    rotated.write_bytes(rotated.read_bytes()[:-1])  # the last row whole, but unended
    _write(path, 2)
    tail, whole = RequestLogTail(path), LiveRequestLog(path)
    for log in (tail.read_new(), whole.read()):
        assert _tenants(log) == ["t0", "t2"]
        assert [str(p) for p in log.skipped] == [
            f"{rotated}: line 2: a last line without its newline, left out until it ends"
        ]
        assert log.skipped_rows == 1
    with rotated.open("ab") as handle:  # ended after all: read then, once
        handle.write(b"\n")
    log = tail.read_new()
    assert _tenants(log) == ["t1"] and log.skipped == ()
    log = whole.read()
    assert _tenants(log) == ["t0", "t1", "t2"] and log.skipped == ()


# -- a row no read can take ----------------------------------------------------------


def test_a_time_past_what_a_frame_holds_is_a_bad_line_not_a_reader_stuck_for_good(
    tmp_path: Path,
) -> None:
    """``"ts": 1e300`` raised OverflowError from the read, and, as a failed read keeps
    nothing, from every read after: no row of the log was read again."""
    path = tmp_path / "router.jsonl"
    _write(path, 0)
    with path.open("a") as handle:
        handle.write('{"ts": 1e300, "adapter": "alpha"}\n')
    _write(path, 1)
    tail = RequestLogTail(path)
    log = tail.read_new()
    assert _tenants(log) == ["t0", "t1"]
    assert [str(p) for p in log.skipped] == [
        f"{path}: line 2: ts: 1 timestamps outside the times a log can hold"
        " (1677-09-21 to 2262-04-11 UTC)"
    ]
    _write(path, 2)
    assert _tenants(tail.read_new()) == ["t2"]


def test_a_line_that_is_not_utf8_is_a_bad_line_and_the_rest_are_read(tmp_path: Path) -> None:
    # Held already before these fixes (json.loads raises a ValueError); kept as a guard.
    path = tmp_path / "router.jsonl"
    _write(path, 0)
    with path.open("ab") as handle:
        handle.write(b'{"ts": "2026-03-12T04:00:01Z", "adapter": "alpha", "tenant": "\xff"}\n')
        handle.write(b"\x00" * 16 + b"\n")  # a crash's zeroed block
    _write(path, 2)
    log = RequestLogTail(path).read_new()
    assert _tenants(log) == ["t0", "t2"]
    assert [str(p) for p in log.skipped] == [
        f"{path}: lines 2, 3: 2 lines that are not JSON objects"
    ]


# -- any mix of the above ------------------------------------------------------------


class _Router:
    """The log's writer and its rotations, step by step, and the rows written whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.whole: list[str] = []
        self.pending = b""  # the rest of a half-written last line
        self.rotations = 0

    def write(self) -> None:
        _write(self.path, len(self.whole))
        self.whole.append(f"t{len(self.whole)}")

    def half(self) -> None:
        scratch = self.path.with_name("scratch")
        _write(scratch, len(self.whole))
        line = scratch.read_bytes()
        scratch.unlink()
        with self.path.open("ab") as handle:
            handle.write(line[:40])
        self.pending = line[40:]

    def end(self) -> None:
        with self.path.open("ab") as handle:
            handle.write(self.pending)
        self.pending = b""
        self.whole.append(f"t{len(self.whole)}")

    def rotation(self) -> Path:
        self.rotations += 1
        return self.path.with_name(f"router.20260312T04{self.rotations:04d}.jsonl")

    def step(self, step: str) -> None:
        if self.pending:  # the router ends its line before anything else
            self.end()
        if step == "write":
            self.write()
        elif step == "half":
            self.half()
        elif step == "rotate" and self.path.exists():
            self.path.rename(self.rotation())
        elif step == "copytruncate" and self.path.exists():
            shutil.copy(self.path, self.rotation())  # named as a rotation: nothing lost
            os.truncate(self.path, 0)


@settings(max_examples=40, deadline=None)
@example(steps=["write", "write", "read", "copytruncate", "write", "write", "write", "read"])
@example(steps=["write", "half", "read", "rotate", "write", "copytruncate", "half", "read"])
@given(
    steps=st.lists(
        st.sampled_from(["write", "half", "rotate", "copytruncate", "read"]), max_size=25
    )
)
def test_every_whole_row_is_read_through_any_rotations_and_truncations(
    steps: list[str],
) -> None:
    """Rows of one length (the 64-byte check's blind spot), rotations by rename, copies
    named as rotations and truncations in place, half-written lines, reads between any
    two: each read's whole log holds every row written whole, each once, and the tail
    has given each of them."""
    with tempfile.TemporaryDirectory() as directory:
        router = _Router(Path(directory) / "router.jsonl")
        tail, whole = RequestLogTail(router.path), LiveRequestLog(router.path)
        given: set[str] = set()
        for step in [*steps, "read"]:
            if step != "read":
                router.step(step)
                continue
            given |= set(_tenants(tail.read_new()))
            log = whole.read()
            assert sorted(_tenants(log)) == sorted(router.whole) and log.skipped == ()
            assert given == set(router.whole)
