"""Event logs: what synth writes beside a request log, and what validate says of a bad one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.errors import InputError
from placement.inputs import load_catalog, load_fleet, load_pipelines
from placement.inputs.events import (
    EVENT_COLUMNS,
    KnownNames,
    check_events,
    load_events,
    problems_in,
    write_events,
)
from placement.synth.generate import SyntheticLog, generate
from placement.synth.scenario import load_scenario

runner = CliRunner()
DATA = Path(__file__).resolve().parents[2] / "data"


def _synth(scenario: str, **changes: Any) -> SyntheticLog:
    files = load_scenario(DATA / scenario / "scenario.yaml")
    catalog = load_catalog(files.catalog, fleet=load_fleet(files.fleet))
    pipelines = load_pipelines(files.pipelines, catalog=catalog) if files.pipelines else None
    spec = replace(files.scenario, **changes)
    return generate(spec, catalog, rng=np.random.default_rng(5), pipelines=pipelines)


@pytest.fixture(scope="module")
def war_story() -> SyntheticLog:
    """A day of the war story at a tenth of its load: pipelines and logins."""
    return _synth("war-story", requests_per_minute=140, days=1.0)


class TestTheEventLogSynthWrites:
    def test_columns_kinds_and_order(self, war_story: SyntheticLog) -> None:
        events = war_story.events
        assert tuple(events.columns) == EVENT_COLUMNS
        assert set(events["kind"]) == {"pipeline", "login"}
        assert events["ts"].is_monotonic_increasing
        assert events["event_id"].is_unique
        pipeline = events[events["kind"] == "pipeline"]
        assert set(pipeline["trigger"]) == {"document.uploaded"}
        assert set(pipeline["tenant"]) == {"tenant-05"}  # doc-classifier-v2's tenant
        logins = events[events["kind"] == "login"]
        assert logins["trigger"].isna().all()
        assert set(logins["tenant"]) == {"tenant-03"}

    def test_every_caused_request_names_an_earlier_event(self, war_story: SyntheticLog) -> None:
        requests, events = war_story.requests, war_story.events
        caused = requests[requests["event_id"].notna()]
        assert len(caused) > 0
        when = events.set_index("event_id")["ts"]
        assert set(caused["event_id"]) <= set(when.index)
        assert (caused["ts"].to_numpy() >= when.loc[caused["event_id"]].to_numpy()).all()

    def test_events_lead_to_their_adapters(self, war_story: SyntheticLog) -> None:
        requests, events = war_story.requests, war_story.events
        kind = events.set_index("event_id")["kind"]
        caused = requests[requests["event_id"].notna()]
        by_kind = {
            event_kind: set(map(str, names))
            for event_kind, names in caused.groupby(caused["event_id"].map(kind))["adapter"]
        }
        assert by_kind["pipeline"] <= {
            "doc-classifier-v2",
            "legal-extract-v3",
            "medical-extract-v1",
        }
        assert by_kind["login"] == {"code-reviewer-xl"}
        # A login brings a user's few requests; a pipeline event its steps.
        assert caused.groupby("event_id").size().max() <= 3

    def test_events_lie_within_the_requests_span(self, war_story: SyntheticLog) -> None:
        known = KnownNames(
            triggers=frozenset({"document.uploaded"}),
            tenants=frozenset({"tenant-03", "tenant-05"}),
            span=(war_story.requests["ts"].min(), war_story.requests["ts"].max()),
        )
        assert problems_in(war_story.events, "events", known) == []

    def test_a_scenario_without_events_has_no_event_column(self) -> None:
        synthetic = _synth("saas-50", days=0.05)
        assert "event_id" not in synthetic.requests.columns
        assert synthetic.events.empty

    def test_synth_writes_the_events_beside_the_log(self, tmp_path: Path) -> None:
        out = tmp_path / "requests.parquet"
        scenario = str(DATA / "legal-research" / "scenario.yaml")
        # legal-research opens on a Sunday: its first logins are Monday's
        result = runner.invoke(app, ["synth", scenario, "--days", "2", "-o", str(out)])
        assert result.exit_code == 0, result.output
        events = load_events(tmp_path / "requests.events.parquet")
        requests = pd.read_parquet(out)
        assert set(requests["event_id"].dropna()) <= set(events.frame["event_id"])
        assert "events" in result.output

    @pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
    def test_each_format_reads_back(
        self, war_story: SyntheticLog, tmp_path: Path, suffix: str
    ) -> None:
        path = tmp_path / f"events{suffix}"
        write_events(war_story.events, path)
        read = load_events(path).frame
        assert read["event_id"].tolist() == war_story.events["event_id"].tolist()
        assert (read["ts"] == war_story.events["ts"]).all()
        assert read["trigger"].isna().sum() == war_story.events["trigger"].isna().sum()


HEADER = "ts,kind,trigger,tenant,event_id\n"
GOOD = "2026-03-09T13:00:00Z,login,,firm-east,login-1\n"


def _inputs(tmp_path: Path, events: str) -> list[str]:
    folder = DATA / "legal-research"
    path = tmp_path / "events.csv"
    path.write_text(events)
    return [
        "validate",
        *("--catalog", str(folder / "catalog.yaml"), "--fleet", str(folder / "fleet.yaml")),
        *("--pipelines", str(folder / "pipelines.yaml")),
        *("--log", str(folder / "requests.parquet"), "--events", str(path)),
    ]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param(
            "2026-03-09T13:00:00Z,pipeline,invoice.scanned,firm-east,p-1\n",
            "trigger 'invoice.scanned' is not in pipelines.yaml (1 event, line 3)",
            id="unknown-trigger",
        ),
        pytest.param(
            "2026-03-09T13:01:00Z,login,,firm-north,l-2\n2026-03-09T13:02:00Z,login,,firm-north,l-3\n",
            "tenant 'firm-north' is neither in the catalog nor in pipelines.yaml's logins"
            " (2 events, lines 3, 4)",
            id="unknown-tenant",
        ),
        pytest.param(
            "2026-03-09T12:00:00Z,login,,firm-west,l-2\n",
            "line 3: ts: 1 events earlier than the line before (not in time order)",
            id="out-of-order",
        ),
        pytest.param(
            "2026-03-09T13:05:00Z,login,,firm-west,login-1\n",
            "1 ids used more than once ('login-1') in lines 2, 3",
            id="repeated-id",
        ),
        pytest.param(
            "2026-03-09T13:05:00Z,logout,,firm-west,l-2\n",
            "line 3: kind: 1 unknown kinds (expected pipeline or login)",
            id="unknown-kind",
        ),
        pytest.param(
            "2026-03-09T13:05:00Z,pipeline,,firm-west,l-2\n",
            "line 3: trigger: 1 pipeline events without a trigger",
            id="pipeline-without-trigger",
        ),
        pytest.param(
            "yesterday,login,,firm-west,l-2\n",
            "line 3: ts: 1 unparsable timestamps",
            id="bad-time",
        ),
    ],
)
def test_validate_says_each_problem_in_one_line(tmp_path: Path, rows: str, expected: str) -> None:
    result = runner.invoke(app, _inputs(tmp_path, HEADER + GOOD + rows))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    assert expected in lines[0]
    assert "Traceback" not in result.output


def test_events_outside_the_log_are_a_warning(tmp_path: Path) -> None:
    late = "2026-04-01T13:00:00Z,login,,firm-west,l-2\n"
    result = runner.invoke(app, _inputs(tmp_path, HEADER + GOOD + late))
    assert result.exit_code == 0, result.output
    assert "1 events after the request log's last request" in result.output
    assert "a replay never delivers them" in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "ts,kind\n2026-03-09T13:00:00Z,login\n",
            "missing required column 'event_id'",
            id="column",
        ),
        pytest.param("", "cannot read", id="empty-file"),
    ],
)
def test_an_unreadable_event_log_is_one_line(tmp_path: Path, text: str, expected: str) -> None:
    result = runner.invoke(app, _inputs(tmp_path, text))
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


def test_load_events_raises_every_error_and_keeps_warnings_quiet(tmp_path: Path) -> None:
    path = tmp_path / "events.csv"
    path.write_text(HEADER + GOOD + "2026-03-09T12:00:00Z,party,,x,login-1\n")
    with pytest.raises(InputError) as raised:
        load_events(path)
    messages = [problem.message for problem in raised.value.problems]
    assert len(messages) == 3  # out of order, unknown kind, repeated id
    late = KnownNames(
        span=(pd.Timestamp("2026-03-01", tz="UTC"), pd.Timestamp("2026-03-02", tz="UTC"))
    )
    path.write_text(HEADER + GOOD)
    assert len(load_events(path, late)) == 1
    assert [p.severity for p in check_events(path, late)] == ["warning"]


_OUT_OF_RANGE = "timestamps outside the times a log can hold (1677-09-21 to 2262-04-11 UTC)"


def test_a_json_lines_event_log_names_the_file_and_each_line(tmp_path: Path) -> None:
    # It named "row N+1" (a CSV's count after a header the file does not have, blank
    # lines not counted), called a time past 2262 "unparsable", read a missing id as the
    # id "nan", and 1e300 seconds raised OverflowError: a traceback.
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"ts": "2026-03-09T13:00:00Z", "kind": "login", "tenant": "firm-east", "event_id": "a"}\n'
        "\n"
        '{"ts": "2026-03-09T13:01:00Z", "kind": "party", "tenant": "firm-east", "event_id": "a"}\n'
        '{"ts": "2300-01-01T00:00:00Z", "kind": "login", "tenant": "firm-east", "event_id": "b"}\n'
        '{"ts": 1e300, "kind": "login", "tenant": "firm-east", "event_id": "c"}\n'
        '{"ts": "yesterday", "kind": "login", "tenant": "firm-x", "event_id": null}\n'
    )
    known = KnownNames(tenants=frozenset({"firm-east"}))
    assert [str(p) for p in check_events(path, known)] == [
        f"{path}: line 6: ts: 1 unparsable timestamps",
        f"{path}: lines 4, 5: ts: 2 {_OUT_OF_RANGE}",
        f"{path}: line 3: kind: 1 unknown kinds (expected pipeline or login)",
        f"{path}: line 6: event_id: 1 events without an id",
        f"{path}: event_id: 1 ids used more than once ('a') in lines 1, 3",
        f"{path}: tenant: tenant 'firm-x' is neither in the catalog nor in pipelines.yaml's"
        " logins (1 event, line 6)",
    ]


def test_a_csv_time_past_2262_is_out_of_range_not_unparsable(tmp_path: Path) -> None:
    result = runner.invoke(
        app, _inputs(tmp_path, HEADER + GOOD + "2300-01-01T00:00:00Z,login,,firm-west,l-2\n")
    )
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'events.csv'}: line 3: ts: 1 {_OUT_OF_RANGE}" in result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            '{"ts": "2026-03-09T13:00:00Z", "kind": "login", "event_id": "a"}\n\n{"ts": \n',
            "line 3: 1 lines that are not JSON objects",
            id="half-a-line",
        ),
        pytest.param("\n", "empty: no JSON lines", id="empty"),
    ],
)
def test_a_json_lines_event_log_that_does_not_read_says_where(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(text)
    assert [str(p) for p in check_events(path)] == [f"{path}: {expected}"]
    with pytest.raises(InputError) as raised:
        load_events(path)
    assert [str(p) for p in raised.value.problems] == [f"{path}: {expected}"]


_LATE = "2026-03-09T13:05:00Z,login,,firm-east,l-2\n"


def _bad_time(event_id: str) -> str:
    return f"yesterday,login,,firm-east,{event_id}\n"


@pytest.mark.parametrize(
    ("text", "entry"),
    [
        pytest.param(HEADER + GOOD + "\n" + _bad_time("b"), "line 4", id="blank-line"),
        pytest.param("\n \n" + HEADER + _bad_time("b"), "line 4", id="blank-lines-first"),
        pytest.param(
            (HEADER + GOOD + "\n" + _bad_time("b")).replace("\n", "\r\n"), "line 4", id="crlf"
        ),
        pytest.param(
            HEADER + '"x\ny",login,,firm-east,b\n' + _bad_time("c"),
            "lines 2, 4",
            id="a-field-across-lines",
        ),
        pytest.param(
            "\ufeff" + HEADER + "\t\n" + _bad_time("b") + GOOD + "\n" + _bad_time("c"),
            "lines 3, 6",
            id="byte-order-mark-tab-line",
        ),
    ],
)
def test_a_csv_event_fault_names_the_files_line(tmp_path: Path, text: str, entry: str) -> None:
    """A CSV's rows were named by their place + 2 (a header, and from 1): off after a
    blank line (pandas skips them) or a quoted field across lines."""
    path = tmp_path / "events.csv"
    path.write_bytes(text.encode())
    expected = [f"{path}: {entry}: ts: {entry.count(',') + 1} unparsable timestamps"]
    assert [str(p) for p in check_events(path)] == expected
    with pytest.raises(InputError) as raised:
        load_events(path)
    assert [str(p) for p in raised.value.problems] == expected


def test_a_csv_event_logs_names_are_lines_after_a_blank_one(tmp_path: Path) -> None:
    """The time order, the repeated ids and the unknown names name lines too, the
    blank line counted."""
    path = tmp_path / "events.csv"
    path.write_text(HEADER + "\n" + _LATE + GOOD + "2026-03-09T13:06:00Z,login,,firm-x,l-2\n")
    assert [str(p) for p in check_events(path, KnownNames(tenants=frozenset({"firm-east"})))] == [
        f"{path}: line 4: ts: 1 events earlier than the line before (not in time order)",
        f"{path}: event_id: 1 ids used more than once ('l-2') in lines 3, 5",
        f"{path}: tenant: tenant 'firm-x' is neither in the catalog nor in pipelines.yaml's"
        " logins (1 event, line 5)",
    ]


_JSON_LATE = '{"ts": "2026-03-09T13:05:00Z", "kind": "login", "tenant": "t", "event_id": "a"}\n'
_JSON_EARLY = '{"ts": "2026-03-09T13:00:00Z", "kind": "login", "tenant": "t", "event_id": "b"}\n'


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        pytest.param(
            "events.jsonl",
            _JSON_LATE + "\n" + _JSON_EARLY,
            "line 3: ts: 1 events earlier than the line before",
            id="jsonl",
        ),
        pytest.param(
            "events.csv",
            HEADER + _LATE + GOOD,
            "line 3: ts: 1 events earlier than the line before",
            id="csv",
        ),
        pytest.param(
            "events.parquet",
            None,
            "row 2: ts: 1 events earlier than the row before",
            id="parquet-rows-from-1",
        ),
    ],
)
def test_an_event_out_of_order_is_earlier_than_the_line_before(
    tmp_path: Path, name: str, text: str | None, said: str
) -> None:
    """JSON lines said 'earlier than the row before' of a file of lines; a Parquet log
    (no header line) called its second row 'row 3'."""
    path = tmp_path / name
    if text is None:
        ts = pd.to_datetime(["2026-03-09T13:05:00Z", "2026-03-09T13:00:00Z"], utc=True)
        login = {"kind": "login", "trigger": None, "tenant": "t"}
        write_events(pd.DataFrame({"ts": ts, **login, "event_id": ["a", "b"]}), path)
    else:
        path.write_text(text)
    (problem,) = check_events(path)
    assert str(problem) == f"{path}: {said} (not in time order)"
