"""``lorafleet replay --events`` at the command line: a bad event log gets the lines
``lorafleet validate --events`` prints, one per problem, and exit 2 on errors, never a
traceback; a good one adds the event figures to every policy's JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner, Result

import placement.cli  # noqa: F401  (registers the commands)
from placement.cli.app import app
from tests.fleets import fleet_yaml

runner = CliRunner()
START = pd.Timestamp("2026-03-10T09:00:00Z")

CATALOG = """
adapters:
{entries}
"""
FLEET = fleet_yaml()
PIPELINES = """
pipelines:
  - trigger: doc.uploaded
    steps:
      - {adapter: acme-a, probability: 1.0, within_s: 5}
logins:
  acme: [acme-b]
"""
ADAPTERS = {"acme-a": "acme", "acme-b": "acme", "globex-a": "globex", "shared-x": None}


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    """Twenty minutes of requests (09:00 to 09:19:58) over four adapters; a login of
    acme at 09:05 and a pipeline event at 09:10 caused one request each."""
    entries = "\n".join(
        f"  - {{name: {name}, base_model: llama-3.1-8b, rank: 16,"
        f" target_modules: [q_proj, v_proj], source: /adapters/{name}"
        + (f", tenant: {tenant}}}" if tenant else "}")
        for name, tenant in ADAPTERS.items()
    )
    (tmp_path / "catalog.yaml").write_text(CATALOG.format(entries=entries))
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "pipelines.yaml").write_text(PIPELINES)
    names = ["shared-x", "globex-a", "shared-x", "acme-a"]
    rows = [
        {"ts": START + pd.Timedelta(seconds=2 * i), "adapter": names[i % 4], "event_id": None}
        for i in range(600)
    ]
    rows[151] = {**rows[151], "adapter": "acme-b", "event_id": "login-1"}
    rows[302] = {**rows[302], "adapter": "acme-a", "event_id": "pipe-1"}
    pd.DataFrame(rows).to_parquet(tmp_path / "requests.parquet", index=False)
    return {name: tmp_path / f"{name}.{ext}" for name, ext in _FILES}


_FILES = (("catalog", "yaml"), ("fleet", "yaml"), ("pipelines", "yaml"), ("requests", "parquet"))
LOGIN = {"ts": "2026-03-10T09:05:00Z", "kind": "login", "tenant": "acme", "event_id": "login-1"}
PIPE = {
    "ts": "2026-03-10T09:10:00Z",
    "kind": "pipeline",
    "trigger": "doc.uploaded",
    "event_id": "pipe-1",
}


def write_events(inputs: dict[str, Path], *rows: dict[str, str]) -> Path:
    path = inputs["requests"].parent / "events.csv"
    columns = ["ts", "kind", "trigger", "tenant", "event_id"]
    pd.DataFrame(list(rows), columns=columns).to_csv(path, index=False)
    return path


def common(inputs: dict[str, Path]) -> list[str]:
    return [
        *("--catalog", str(inputs["catalog"]), "--fleet", str(inputs["fleet"])),
        *("--pipelines", str(inputs["pipelines"]), "--log", str(inputs["requests"])),
    ]


def replay(inputs: dict[str, Path], events: Path, *policies: str) -> Result:
    chosen = [part for name in policies or ("epp",) for part in ("--policy", name)]
    extra = ["--planner", "greedy", "--json"]
    return runner.invoke(app, ["replay", *common(inputs), "--events", str(events), *chosen, *extra])


def problem_lines(result: Result, events: Path) -> list[str]:
    return [
        line
        for line in result.stderr.splitlines()
        if line.startswith(("error:", "warning:")) and str(events) in line
    ]


def validate_lines(inputs: dict[str, Path], events: Path) -> list[str]:
    result = runner.invoke(app, ["validate", *common(inputs), "--events", str(events)])
    return problem_lines(result, events)


BAD_LOGS = {
    "unknown-trigger": (
        [LOGIN, {**PIPE, "trigger": "doc.deleted"}],
        [
            "error: {path}: trigger: trigger 'doc.deleted' is not in pipelines.yaml"
            " (1 event, line 3)"
        ],
    ),
    "unknown-tenant": (
        [{**LOGIN, "tenant": "initech"}, PIPE],
        [
            "error: {path}: tenant: tenant 'initech' is neither in the catalog nor in"
            " pipelines.yaml's logins (1 event, line 2)"
        ],
    ),
    "out-of-order": (
        [PIPE, LOGIN],
        ["error: {path}: line 3: ts: 1 events earlier than the line before (not in time order)"],
    ),
    "repeated-id": (
        [LOGIN, {**PIPE, "event_id": "login-1"}],
        ["error: {path}: event_id: 1 ids used more than once ('login-1') in lines 2, 3"],
    ),
    "bad-id": (
        [{**LOGIN, "event_id": "login 1"}, PIPE],
        [
            "error: {path}: line 2: event_id: 1 ids that are not valid (letters, digits and"
            " ._:-, at most 128)"
        ],
    ),
    "unknown-kind": (
        [{**LOGIN, "kind": "logout"}, PIPE],
        ["error: {path}: line 2: kind: 1 unknown kinds (expected pipeline or login)"],
    ),
    "two-problems": (
        [{**LOGIN, "tenant": "initech"}, {**PIPE, "ts": "2026-03-10T09:01:00Z"}],
        [
            "error: {path}: line 3: ts: 1 events earlier than the line before (not in time order)",
            "error: {path}: tenant: tenant 'initech' is neither in the catalog nor in"
            " pipelines.yaml's logins (1 event, line 2)",
        ],
    ),
}


class TestABadEventLog:
    @pytest.mark.parametrize(("rows", "expected"), BAD_LOGS.values(), ids=BAD_LOGS.keys())
    def test_one_line_per_problem_exit_2_no_traceback(
        self, inputs: dict[str, Path], rows: list[dict[str, str]], expected: list[str]
    ) -> None:
        events = write_events(inputs, *rows)
        result = replay(inputs, events)
        assert result.exit_code == 2, result.output
        assert problem_lines(result, events) == [line.format(path=events) for line in expected]
        assert "Traceback" not in result.output
        assert result.stdout == ""

    @pytest.mark.parametrize(("rows", "expected"), BAD_LOGS.values(), ids=BAD_LOGS.keys())
    def test_the_lines_are_validates(
        self, inputs: dict[str, Path], rows: list[dict[str, str]], expected: list[str]
    ) -> None:
        events = write_events(inputs, *rows)
        assert problem_lines(replay(inputs, events), events) == validate_lines(inputs, events)

    def test_a_missing_column_is_one_line(self, inputs: dict[str, Path]) -> None:
        path = inputs["requests"].parent / "events.csv"
        pd.DataFrame([{k: v for k, v in LOGIN.items() if k != "kind"}]).to_csv(path, index=False)
        result = replay(inputs, path)
        assert result.exit_code == 2
        lines = problem_lines(result, path)
        assert len(lines) == 1
        assert "missing required column 'kind'" in lines[0]
        assert "Traceback" not in result.output

    @pytest.mark.parametrize("name", ["absent.parquet", "events.txt"], ids=["absent", "format"])
    def test_a_file_that_cannot_be_read_is_one_line(
        self, inputs: dict[str, Path], name: str
    ) -> None:
        path = inputs["requests"].parent / name
        if path.suffix == ".txt":
            path.write_text("not an event log\n")
        result = replay(inputs, path)
        assert result.exit_code == 2
        assert len(problem_lines(result, path)) == 1
        assert "Traceback" not in result.output


class TestEventsOutsideTheLog:
    @pytest.mark.parametrize(
        ("ts", "where"),
        [("2026-03-10T08:59:00Z", "before"), ("2026-03-10T09:19:59Z", "after")],
        ids=["before", "after"],
    )
    def test_a_warning_line_and_the_event_is_never_delivered(
        self, inputs: dict[str, Path], ts: str, where: str
    ) -> None:
        outside = {"ts": ts, "kind": "login", "tenant": "globex", "event_id": "out-1"}
        rows = [outside, LOGIN, PIPE] if where == "before" else [LOGIN, PIPE, outside]
        events = write_events(inputs, *rows)
        result = replay(inputs, events)
        assert result.exit_code == 0, result.output
        lines = problem_lines(result, events)
        assert len(lines) == 1
        assert lines[0].startswith("warning:")
        assert f"{where} the request log's" in lines[0]
        assert lines == validate_lines(inputs, events)
        assert json.loads(result.stdout)["policies"]["epp"]["events"]["count"] == 2


class TestAGoodEventLog:
    def test_every_policy_has_the_event_figures(self, inputs: dict[str, Path]) -> None:
        events = write_events(inputs, LOGIN, PIPE)
        result = replay(inputs, events, "epp", "bounded", "lorafleet", "oracle")
        assert result.exit_code == 0, result.output
        assert problem_lines(result, events) == []
        policies = json.loads(result.stdout)["policies"]
        for metrics in policies.values():
            assert isinstance(metrics["cold_loads_on_critical_path"], int)
            figures = metrics["events"]
            assert figures["count"] == 2
            assert set(figures["by_kind"]) == {"pipeline", "login"}
            assert figures["by_kind"]["login"]["count"] == 1
            assert figures["by_kind"]["pipeline"]["count"] == 1
            # acme's one surge, 09:05 to 09:15: its adapters' requests in it.
            assert set(figures["login_surge_ttft_p95_ms"]) == {"acme"}
        for name in ("epp", "bounded", "oracle"):
            assert policies[name]["events"]["preloads"] == 0

    def test_a_pipeline_event_without_pipelines_is_a_warning(self, inputs: dict[str, Path]) -> None:
        events = write_events(inputs, LOGIN, PIPE)
        args = ["replay", "--catalog", str(inputs["catalog"]), "--fleet", str(inputs["fleet"])]
        args += ["--log", str(inputs["requests"]), "--events", str(events), "--policy", "epp"]
        result = runner.invoke(app, [*args, "--json"])
        assert result.exit_code == 0, result.output
        lines = problem_lines(result, events)
        assert lines == [
            f"warning: {events}: trigger: pipeline triggers not checked and not"
            " followed: give --pipelines"
        ]
