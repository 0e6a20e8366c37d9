"""Request logs in every accepted format, per request or aggregated, and their repairs."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pandas as pd
import pytest

from placement.errors import InputError
from placement.inputs import parse_bytes
from placement.inputs.request_log import (
    check_request_log,
    load_request_log,
    request_log_from_frame,
    write_request_log,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2GiB", 2 * 2**30, id="gib"),
        pytest.param("512MiB", 512 * 2**20, id="mib"),
        pytest.param("65.6MB", 65_600_000, id="decimal-mb"),
        pytest.param(1024, 1024, id="int"),
        pytest.param("7 B", 7, id="bytes"),
    ],
)
def test_parse_bytes(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "-1GiB", "2 GigaBytes", True, -5])
def test_parse_bytes_refuses(text: object) -> None:
    with pytest.raises(ValueError, match=r"byte size|negative"):
        parse_bytes(text)


def sample() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "ts": pd.to_datetime(
                ["2026-03-10T09:00:00Z", "2026-03-10T09:04:00Z", "2026-03-10T09:12:00Z"], utc=True
            ),
            "adapter": ["a", "b", "a"],
            "tenant": ["t", "t", "t"],
            "prompt_tokens": [10, 20, 30],
            "output_tokens": [1, 2, 3],
        }
    )


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_round_trip_in_every_format(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"log{suffix}"
    write_request_log(sample(), path)
    log = load_request_log(path)
    assert not log.aggregated
    assert list(log.frame["adapter"]) == ["a", "b", "a"]
    assert str(log.frame["ts"].dt.tz) == "UTC"
    counts = log.counts(600)
    assert counts.to_dict("records") == [
        {"ts": pd.Timestamp("2026-03-10T09:00:00Z"), "adapter": "a", "requests": 1},
        {"ts": pd.Timestamp("2026-03-10T09:00:00Z"), "adapter": "b", "requests": 1},
        {"ts": pd.Timestamp("2026-03-10T09:10:00Z"), "adapter": "a", "requests": 1},
    ]


def test_other_time_zones_become_utc() -> None:
    frame = pd.DataFrame({"ts": ["2026-03-10T04:00:00-05:00"], "adapter": ["a"]})
    log = request_log_from_frame(frame)
    assert log.frame["ts"].iloc[0] == pd.Timestamp("2026-03-10T09:00:00Z")


def test_out_of_order_and_duplicates_are_repaired_with_notes() -> None:
    frame = sample().iloc[[2, 0, 1, 1]]
    log = request_log_from_frame(frame)
    assert log.frame["ts"].is_monotonic_increasing
    assert len(log.frame) == 3
    assert any("sorted" in note for note in log.notes)
    assert any("duplicate" in note for note in log.notes)


def test_aggregated_counts_are_summed_per_bucket() -> None:
    stamps = ["2026-03-10T09:00:00Z", "2026-03-10T09:05:00Z", "2026-03-10T09:05:00Z"]
    frame = pd.DataFrame({"ts": stamps, "adapter": ["a", "a", "a"], "requests": [3, 4, 1]})
    log = request_log_from_frame(frame)
    assert log.aggregated
    assert log.counts(600)["requests"].tolist() == [8]


def test_unusable_log_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("when,what\n1,2\n")
    with pytest.raises(InputError, match="missing required column 'ts'"):
        load_request_log(path)


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "log.xlsx"
    path.write_text("")
    with pytest.raises(InputError, match="unknown format"):
        load_request_log(path)


def test_a_json_lines_file_read_whole_names_its_bad_rows_by_their_lines(tmp_path: Path) -> None:
    # As the live reader does: a blank line and a line that is not JSON come before the
    # bad row, so its place among the rows (and a CSV's header) would name another line.
    path = tmp_path / "log.jsonl"
    good = '{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}'
    path.write_text("\n".join([good, "", "{not json", good.replace('"alpha"', '""')]) + "\n")
    log = load_request_log(path, skip_bad_rows=True)
    assert [str(p) for p in log.skipped] == [
        f"{path}: line 3: 1 lines that are not JSON objects",
        f"{path}: line 4: adapter: 1 rows without an adapter",
    ]


def test_seconds_and_iso_times_mixed_in_a_json_lines_file_both_parse(tmp_path: Path) -> None:
    # Each line has its own type: a column of both read the seconds as unparsable text.
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}\n'
        '{"ts": 1773288001.5, "adapter": "alpha"}\n'
        '{"ts": true, "adapter": "alpha"}\n'
    )
    log = load_request_log(path, skip_bad_rows=True)
    assert [ts.isoformat() for ts in log.frame["ts"]] == [
        "2026-03-12T04:00:00+00:00",
        "2026-03-12T04:00:01.500000+00:00",
    ]
    assert [str(p) for p in log.skipped] == [f"{path}: line 3: ts: 1 unparsable timestamps"]


@pytest.mark.parametrize(
    "ts",
    [
        pytest.param("1e300", id="float-past-2262"),
        pytest.param("-1e300", id="float-before-1677"),
        pytest.param("100000000000000000000000", id="int-past-int64"),
        pytest.param("9300000000", id="int-past-2262"),
    ],
)
def test_seconds_past_the_times_a_frame_holds_are_a_row_out_of_range(
    tmp_path: Path, ts: str
) -> None:
    # pandas raised OverflowError even asked to coerce: the read failed whole (strictly
    # read, no InputError naming the file; read live, at every read after).
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"ts": 1773288000, "adapter": "alpha"}\n'
        f'{{"ts": {ts}, "adapter": "alpha"}}\n'
        '{"ts": "2026-03-12T04:00:01Z", "adapter": "alpha"}\n'
    )
    log = load_request_log(path, skip_bad_rows=True)
    assert len(log.frame) == 2
    assert [str(p) for p in log.skipped] == [f"{path}: line 2: ts: 1 {_BEYOND}"]
    with pytest.raises(InputError) as strictly:  # not OverflowError: the file named
        load_request_log(path)
    assert [str(p) for p in strictly.value.problems] == [f"{path}: line 2: ts: 1 {_BEYOND}"]
    numbers = pd.DataFrame({"ts": [1773288000, float(ts)], "adapter": ["alpha", "alpha"]})
    with pytest.raises(InputError, match=re.escape(f"row 2: ts: 1 {_BEYOND}")):
        request_log_from_frame(numbers)  # a frame has no header: its second row


_BEYOND = "timestamps outside the times a log can hold (1677-09-21 to 2262-04-11 UTC)"


def test_a_json_lines_time_after_2262_names_the_file_its_line_and_the_field(
    tmp_path: Path,
) -> None:
    # The strict reads (validate, replay, plan) named "row 3" (a CSV's count, after a
    # header the file does not have) and called the time "unparsable"; nothing clamped.
    path = tmp_path / "log.jsonl"
    path.write_text(
        '{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}\n'
        '{"ts": "2300-01-01T00:00:00Z", "adapter": "alpha"}\n'
        '{"ts": "not a time", "adapter": "alpha"}\n'
    )
    expected = [
        f"{path}: line 3: ts: 1 unparsable timestamps",
        f"{path}: line 2: ts: 1 {_BEYOND}",
    ]
    with pytest.raises(InputError) as strictly:
        load_request_log(path)
    assert [str(p) for p in strictly.value.problems] == expected
    assert [str(p) for p in check_request_log(path)] == expected


def test_a_line_that_is_not_json_read_strictly_is_named(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}\n{"ts": \n')
    with pytest.raises(InputError) as strictly:
        load_request_log(path)
    assert [str(p) for p in strictly.value.problems] == [
        f"{path}: line 2: 1 lines that are not JSON objects"
    ]


def test_a_gzipped_json_lines_log_names_its_lines(tmp_path: Path) -> None:
    # A .jsonl.gz went through pandas' reader: "row 4" for the third line after a blank
    # one, and a line that is not JSON failed the whole file with pandas' message.
    path = tmp_path / "log.jsonl.gz"
    text = '{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}\n\n{"ts": "x", "adapter": "a"}\n'
    path.write_bytes(gzip.compress(text.encode()))
    assert [str(p) for p in check_request_log(path)] == [
        f"{path}: line 3: ts: 1 unparsable timestamps"
    ]
    path.write_bytes(gzip.compress(b'{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}\n{"ts'))
    log = load_request_log(path, skip_bad_rows=True)
    assert [str(p) for p in log.skipped] == [f"{path}: line 2: 1 lines that are not JSON objects"]
    assert len(log.frame) == 1


def test_an_empty_json_lines_file_read_strictly_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text("\n")
    with pytest.raises(InputError) as strictly:
        load_request_log(path)
    assert [str(p) for p in strictly.value.problems] == [f"{path}: empty: no JSON lines"]
    assert len(load_request_log(path, skip_bad_rows=True).frame) == 0  # a live log, new


def test_a_parquet_directory_without_parts_says_so(tmp_path: Path) -> None:
    # It read "ts: missing required column 'ts' (columns: )", and the same for adapter.
    path = tmp_path / "requests.parquet"
    path.mkdir()
    expected = [f"{path}: a directory with no Parquet files"]
    with pytest.raises(InputError) as strictly:
        load_request_log(path)
    assert [str(p) for p in strictly.value.problems] == expected
    assert [str(p) for p in check_request_log(path)] == expected


_HEADER = "ts,adapter,prompt_tokens\n"
_GOOD = "2026-03-12T04:00:00Z,alpha,10\n"


@pytest.mark.parametrize(
    ("text", "entry"),
    [
        pytest.param(_HEADER + _GOOD + "\n" + "x,alpha,10\n", "line 4", id="blank-line"),
        pytest.param("\n \n" + _HEADER + "x,alpha,10\n", "line 4", id="blank-lines-first"),
        pytest.param(
            (_HEADER + _GOOD + "\n" + "x,alpha,10\n").replace("\n", "\r\n"), "line 4", id="crlf"
        ),
        pytest.param(
            (_HEADER + _GOOD + "\n" + "x,alpha,10\n").replace("\n", "\r"), "line 4", id="cr"
        ),
        pytest.param(
            _HEADER + _GOOD + '"x\ny",alpha,10\n' + "x,alpha,10\n",
            "lines 3, 5",
            id="a-field-across-lines",
        ),
        pytest.param(
            "\ufeff" + _HEADER + "\t\n" + "x,alpha,10\n" + _GOOD + "\n" + "y,alpha,10\n",
            "lines 3, 6",
            id="byte-order-mark-tab-line",
        ),
    ],
)
def test_a_csv_fault_names_the_files_line(tmp_path: Path, text: str, entry: str) -> None:
    """A CSV's rows were named by their place + 2 (a header, and from 1): off after a
    blank line (pandas skips them) or a quoted field across lines."""
    path = tmp_path / "log.csv"
    path.write_bytes(text.encode())
    expected = [f"{path}: {entry}: ts: {entry.count(',') + 1} unparsable timestamps"]
    assert [str(p) for p in check_request_log(path)] == expected
    with pytest.raises(InputError) as strictly:
        load_request_log(path)
    assert [str(p) for p in strictly.value.problems] == expected
    log = load_request_log(path, skip_bad_rows=True)
    assert [str(p) for p in log.skipped] == expected
    assert len(log.frame) == text.count("2026-03-12")  # the good rows all kept


def test_a_gzipped_csv_names_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.csv.gz"
    path.write_bytes(gzip.compress((_HEADER + "\n" + _GOOD + "alpha,alpha,-1\n").encode()))
    assert [str(p) for p in check_request_log(path)] == [
        f"{path}: line 4: ts: 1 unparsable timestamps",
        f"{path}: line 4: prompt_tokens: 1 negative values",
    ]


def test_a_csv_missing_a_column_names_no_line(tmp_path: Path) -> None:
    """The header lacks the column: it is no line's fault (JSON lines name each line,
    each without the key)."""
    path = tmp_path / "log.csv"
    path.write_text("ts,model\n" + "2026-03-12T04:00:00Z,alpha\n" * 3)
    message = "adapter: missing required column 'adapter' (columns: ts, model)"
    with pytest.raises(InputError) as strictly:
        load_request_log(path, skip_bad_rows=True)
    assert [str(p) for p in strictly.value.problems] == [f"{path}: {message}"]


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        pytest.param(
            "log.jsonl",
            '{"ts": "2026-03-12T04:00:05Z", "adapter": "alpha"}\n\n'
            '{"ts": "2026-03-12T04:00:00Z", "adapter": "alpha"}\n',
            "line 3: ts: 1 timestamps earlier than the line before (not in time order)",
            id="json-lines",
        ),
        pytest.param(
            "log.csv",
            "ts,adapter\n2026-03-12T04:00:05Z,alpha\n\n2026-03-12T04:00:00Z,alpha\n",
            "line 4: ts: 1 timestamps earlier than the line before (not in time order)",
            id="csv",
        ),
        pytest.param(
            "log.parquet",
            None,
            ": ts: 1 timestamps earlier than the row before (not in time order)",
            id="parquet-has-rows",
        ),
    ],
)
def test_a_time_out_of_order_is_earlier_than_the_line_before(
    tmp_path: Path, name: str, text: str | None, said: str
) -> None:
    """JSON lines and CSV said 'earlier than the row before' of a file of lines."""
    path = tmp_path / name
    if text is None:
        ts = pd.to_datetime(["2026-03-12T04:00:05Z", "2026-03-12T04:00:00Z"], utc=True)
        pd.DataFrame({"ts": ts, "adapter": ["alpha", "alpha"]}).to_parquet(path)
    else:
        path.write_text(text)
    (problem,) = check_request_log(path)
    assert str(problem).endswith(said) and str(problem).startswith(str(path))


def test_a_parquet_log_names_its_rows_from_1(tmp_path: Path) -> None:
    """A Parquet file (no header line) called its second row "row 3", as a CSV's."""
    path = tmp_path / "log.parquet"
    pd.DataFrame(
        {
            "ts": pd.to_datetime(["2026-03-12T04:00:00Z"] * 4, utc=True),
            "adapter": ["alpha", "no name!", "alpha", "alpha"],
            "prompt_tokens": [10, 10, -1, -1],
        }
    ).to_parquet(path)
    expected = [
        f"{path}: row 2: adapter: 1 adapter names that are not valid names"
        " (letters, digits and ._:/@+-)",
        f"{path}: rows 3, 4: prompt_tokens: 2 negative values",
    ]
    assert [str(p) for p in check_request_log(path)] == expected
    with pytest.raises(InputError) as strictly:
        load_request_log(path)
    assert [str(p) for p in strictly.value.problems] == expected
    log = load_request_log(path, skip_bad_rows=True)
    assert [str(p) for p in log.skipped] == expected
    assert len(log.frame) == 1


def test_a_frame_built_in_memory_names_its_rows_from_1() -> None:
    """What the Prometheus source and the replay build is named by its place from 1,
    not as a CSV's row after a header line ("row 3" for the second)."""
    frame = pd.DataFrame(
        {"ts": ["2026-03-12T04:00:00Z", "2026-03-12T04:00:01Z"], "adapter": ["alpha", None]}
    )
    with pytest.raises(InputError) as raised:
        request_log_from_frame(frame, source="prometheus http://prom:9090")
    assert [str(p) for p in raised.value.problems] == [
        "prometheus http://prom:9090: row 2: adapter: 1 rows without an adapter"
    ]
