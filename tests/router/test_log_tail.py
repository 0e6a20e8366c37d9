"""The router's request log read as a tail: each read gives the rows appended since the
last, from the files the router's own writers leave (``placement.adapters.
live_request_log.RequestLogTail``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from placement.adapters import live_request_log_rows
from placement.adapters.live_request_log import LiveRequestLog, RequestLogTail
from placement.adapters.request_log_files import JsonLinesRequestLog, LogRow, ParquetRequestLog
from placement.inputs.json_lines import JsonLines, parse_json_lines

T0 = 1_773_288_000.0  # 2026-03-12T04:00:00Z
HOUR_S = 3600.0
parse_lines = parse_json_lines


def _row(ts_s: float, tenant: str) -> LogRow:
    return LogRow(ts_s, "alpha", tenant, 3, 4, "pod-0", "gpu_hit", 12.5, 200)


def _tenants(tail: RequestLogTail) -> list[str]:
    return list(tail.read_new().frame.get("tenant", []))


def test_each_read_gives_only_the_rows_appended_since_through_rotations(tmp_path: Path) -> None:
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path, rotate_bytes=10**9)
    tail = RequestLogTail(path)
    sink.write([_row(T0 + i, f"t{i}") for i in range(20)])
    assert _tenants(tail) == [f"t{i}" for i in range(20)]
    assert _tenants(tail) == []  # nothing appended: nothing given
    data = path.read_bytes()  # read already, overwritten but for the first 1 KiB (the
    middle = slice(1024, len(data) - 64)  # file's fingerprint) and the last 64 bytes
    path.write_bytes(data[: middle.start] + b"#" * (middle.stop - middle.start) + data[-64:])
    sink.write([_row(T0 + 20, "t20")])
    log = tail.read_new()  # never read again
    assert list(log.frame["tenant"]) == ["t20"] and log.skipped == ()
    sink.rotate_bytes = 1  # each write now rotates: same file (inode), a new name
    sink.write([_row(T0 + 21, "t21")])
    sink.write([_row(T0 + 22, "t22")])
    sink.close()
    assert _tenants(tail) == ["t21", "t22"]
    assert len(list(tmp_path.iterdir())) == 3  # two rotations, and the active file


def test_a_half_written_line_waits_and_a_bad_line_is_named_once(tmp_path: Path) -> None:
    path = tmp_path / "router.jsonl"
    line = '{{"ts": "2026-03-12T04:00:0{}Z", "adapter": "alpha", "tenant": "t{}"}}'
    half = line.format(1, 1)
    path.write_text(line.format(0, 0) + "\n" + half[:20])
    tail = RequestLogTail(path)
    first = tail.read_new()
    assert list(first.frame["tenant"]) == ["t0"] and first.skipped == ()
    with path.open("a") as handle:  # the writer finishes its line, then a bad one comes
        handle.write(half[20:] + "\n" + "{not json\n" + line.format(2, 2) + "\n")
    second = tail.read_new()
    assert list(second.frame["tenant"]) == ["t1", "t2"]  # the half line, whole now: kept
    [problem] = second.skipped
    assert str(problem) == f"{path}: line 3: 1 lines that are not JSON objects"
    assert second.skipped_rows == 1
    third = tail.read_new()
    assert third.frame.empty and third.skipped == ()  # told once, with the read that met it


def test_a_parquet_hour_compacted_from_its_parts_gives_its_rows_again(tmp_path: Path) -> None:
    """A compacted hour is a new file: its rows come again, which a latest time or a
    set takes as once; the whole-log reader counts each once."""
    sink = ParquetRequestLog(tmp_path)
    tail, whole = RequestLogTail(tmp_path), LiveRequestLog(tmp_path)
    sink.write([_row(T0 + 1, "a")])
    assert _tenants(tail) == ["a"]
    sink.write([_row(T0 + 2, "b")])
    assert _tenants(tail) == ["b"]
    sink.write([_row(T0 + HOUR_S, "c")])  # a later hour: the first one is compacted
    assert _tenants(tail) == ["a", "b", "c"]
    assert _tenants(tail) == []
    assert list(whole.read().frame["tenant"]) == ["a", "b", "c"]
    sink.close()
    assert _tenants(tail) == ["c"]
    assert list(whole.read().frame["tenant"]) == ["a", "b", "c"]


def test_the_whole_log_reader_reads_only_what_is_new_and_returns_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[int] = []

    def counted(lines: list[bytes], *, first: int) -> JsonLines:
        parsed.append(len(lines))
        return parse_lines(lines, first=first)

    monkeypatch.setattr(live_request_log_rows, "parse_json_lines", counted)
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path, rotate_bytes=400)
    whole = LiveRequestLog(path)
    seen: list[str] = []
    for index in range(6):
        sink.write([_row(T0 + index, f"t{index}")])
        seen.append(f"t{index}")
        assert list(whole.read().frame["tenant"]) == seen
    sink.close()
    assert len(whole.files()) > 1  # rotated on the way
    assert parsed == [1] * 6  # each line parsed once, by the read after its write


def test_a_file_that_fails_is_named_and_the_others_are_read(tmp_path: Path) -> None:
    """The active file cannot be read: the rotated one is read all the same (a failure
    used to fail the whole read, and every read while it lasted), and the active file
    is read on from where it stood once it can be."""
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path)
    tail = RequestLogTail(path)
    sink.write([_row(T0, "t0")])
    assert _tenants(tail) == ["t0"]
    sink.write([_row(T0 + 1, "t1")])
    sink.close()
    path.rename(tmp_path / "router.20260312T040001.jsonl")  # rotated, with a new line
    path.symlink_to(path.name)  # the active file cannot be read: a loop, ELOOP
    log = tail.read_new()
    assert list(log.frame["tenant"]) == ["t1"] and log.unread_files == (str(path),)
    path.unlink()
    assert _tenants(tail) == []


def test_a_bad_row_is_named_by_its_line_in_the_file(tmp_path: Path) -> None:
    """A line that is JSON but not a row the forecaster can take (no adapter, a count
    that is not whole) is named by its line, counted from the file's start."""
    path = tmp_path / "router.jsonl"
    good = '{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}'
    path.write_text("\n".join([good, "", "{not json", good.replace('"alpha"', '""')]) + "\n")
    tail = RequestLogTail(path)
    assert [str(p) for p in tail.read_new().skipped] == [
        f"{path}: line 3: 1 lines that are not JSON objects",
        f"{path}: line 4: adapter: 1 rows without an adapter",
    ]
    with path.open("a") as handle:
        handle.write(good.replace("}", ', "prompt_tokens": 1.5}') + "\n")
    log = tail.read_new()
    assert [str(p) for p in log.skipped] == [
        f"{path}: line 5: prompt_tokens: 1 values that are not whole numbers"
    ]
    assert log.frame.empty and log.skipped_rows == 1


def test_a_list_or_an_object_where_text_is_due_is_a_bad_row_not_a_stuck_reader(
    tmp_path: Path,
) -> None:
    """A ``pod`` or ``tenant`` (or a key of its own) holding a list makes the rows
    unhashable: the read failed at that line, and as a failed read keeps nothing, at
    every read after, the rows behind it never given."""
    path = tmp_path / "router.jsonl"
    good = '{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha", "tenant": "t0"}'
    bad = [good.replace('"t0"', "[1]"), good.replace("}", ', "note": {"a": 1}}')]
    path.write_text("\n".join([good, *bad, good.replace("00Z", "01Z")]) + "\n")
    tail, whole = RequestLogTail(path), LiveRequestLog(path)
    for log in (tail.read_new(), whole.read()):
        assert [str(p) for p in log.skipped] == [
            f"{path}: line 2: tenant: 1 values that are lists or objects",
            f"{path}: line 3: note: 1 values that are lists or objects",
        ]
        assert len(log.frame) == 2 and log.skipped_rows == 2


def test_lines_without_a_key_the_log_needs_are_named_by_their_lines(tmp_path: Path) -> None:
    """Read alone, such lines lack a whole column: they are named as a line among good
    ones would be, not as the file."""
    path = tmp_path / "router.jsonl"
    good = '{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}'
    path.write_text(good + "\n")
    tail = RequestLogTail(path)
    assert len(tail.read_new().frame) == 1
    with path.open("a") as handle:
        handle.write('{"adapter": "alpha"}\n\n{"adapter": "beta"}\n')
    log = tail.read_new()
    assert [str(p) for p in log.skipped] == [
        f"{path}: lines 2, 4: ts: missing required column 'ts' (columns: adapter)"
    ]
    assert log.skipped_rows == 2


def test_rows_the_normaliser_cannot_take_are_lost_and_said_so_not_read_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Values no fault finder foresaw (here: any, by a stand-in that raises) cost their
    own lines; a read that raised would keep nothing and meet them at every read."""
    path = tmp_path / "router.jsonl"
    sink = JsonLinesRequestLog(path)
    tail = RequestLogTail(path)
    sink.write([_row(T0, "t0"), _row(T0 + 1, "t1")])

    def unforeseen(*args: object, **kwargs: object) -> None:
        raise TypeError("unhashable type: 'frozen'")

    with monkeypatch.context() as patch:
        patch.setattr(live_request_log_rows, "request_log_from_frame", unforeseen)
        log = tail.read_new()
    assert [str(p) for p in log.skipped] == [
        f"{path}: lines 1, 2: cannot read these rows: unhashable type: 'frozen'"
    ]
    assert log.frame.empty and log.skipped_rows == 2
    sink.write([_row(T0 + 2, "t2")])
    sink.close()
    assert _tenants(tail) == ["t2"]


def test_a_name_with_a_newline_at_its_end_is_not_an_adapter_name(tmp_path: Path) -> None:
    # A regex's "$" matches before a last "\n": "alpha\n" passed as a name of its own.
    path = tmp_path / "router.jsonl"
    path.write_text('{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha\\n"}\n')
    [problem] = RequestLogTail(path).read_new().skipped
    assert str(problem).startswith(f"{path}: line 1: adapter: 1 adapter names that are not valid")
