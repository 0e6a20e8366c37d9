"""``lorafleet review`` and ``lorafleet diff`` end to end: files in, tables and HTML out."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.plan import Plan, plan_to_json
from tests.factories import T0, make_plan
from tests.fleets import fleet_yaml

runner = CliRunner()

FLEET = fleet_yaml(max_lora_rank=16)
ADAPTERS = ("alpha", "beta", "gamma", "delta")
IMAGE = "data:image/png;base64,"


def write_plan(path: Path, plan: Plan) -> Path:
    path.write_text(plan_to_json(plan))
    return path


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "fleet.yaml").write_text(FLEET)
    catalog = "adapters:\n" + "".join(
        f"  - {{name: {n}, base_model: llama-3.1-8b, rank: 8, target_modules: [q_proj, v_proj],"
        f" source: /adapters/{n}}}\n"
        for n in ADAPTERS
    )
    (tmp_path / "catalog.yaml").write_text(catalog)
    rng = np.random.default_rng(7)
    offsets = np.sort(rng.uniform(0, 7200, size=400))
    log = pd.DataFrame(
        {
            "ts": [T0 - timedelta(hours=2) + timedelta(seconds=float(s)) for s in offsets],
            "adapter": rng.choice(["alpha", "alpha", "beta", "gamma", "delta"], size=400),
        }
    )
    log.to_csv(tmp_path / "requests.csv", index=False)
    forecast = pd.DataFrame(
        {
            "ts": [T0 + timedelta(minutes=10 * i) for i in range(12) for _ in ADAPTERS],
            "adapter": list(ADAPTERS) * 12,
            "mean": rng.uniform(1, 20, size=48),
        }
    )
    forecast["q90"] = forecast["mean"] * 1.5
    forecast.to_parquet(tmp_path / "forecast.parquet")
    before = make_plan({"pod-0": ["alpha", "gamma"], "pod-1": ["beta"]}, plan_id="plan-a")
    after = make_plan(
        {"pod-0": ["alpha", "beta"], "pod-1": ["alpha"]},
        {"pod-1": ["gamma"]},
        plan_id="plan-b",
        hit_rate=0.95,
        preloads=[("pod-0", "beta")],
    )
    return {
        "fleet": tmp_path / "fleet.yaml",
        "catalog": tmp_path / "catalog.yaml",
        "log": tmp_path / "requests.csv",
        "forecast": tmp_path / "forecast.parquet",
        "before": write_plan(tmp_path / "a.json", before),
        "after": write_plan(tmp_path / "b.json", after),
        "dir": tmp_path,
    }


def test_review_prints_changes_budgets_and_quality(inputs: dict[str, Path]) -> None:
    result = runner.invoke(
        app,
        [
            "review",
            str(inputs["after"]),
            "--against",
            str(inputs["before"]),
            "--fleet",
            str(inputs["fleet"]),
            "--catalog",
            str(inputs["catalog"]),
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    text = result.output
    assert "plan-b against plan-a" in text
    assert "predicted GPU hit rate 90.0% -> 95.0%" in text
    assert "solver OPTIMAL" in text
    assert "pod-0: load beta; unload gamma" in text
    assert "pod-1: load alpha, gamma; unload beta" in text
    assert "2/2" in text  # GPU slots used of the budget
    assert "hot: alpha is busy" in text


def test_review_against_current_reads_the_state_directory(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    args = ["review", str(inputs["after"]), "--against", "current", "--state-dir", str(state)]
    missing = runner.invoke(app, args)
    assert missing.exit_code == 2
    assert "no published plan here (looked for plan.json or last-plan.json)" in missing.output
    (state / "last-plan.json").write_text(inputs["before"].read_text())
    found = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert found.exit_code == 0, found.output
    assert "plan-b against plan-a" in found.output
    no_dir = runner.invoke(app, ["review", str(inputs["after"]), "--against", "current"])
    assert no_dir.exit_code == 2
    assert "'current' needs --state-dir" in no_dir.output


def test_html_report_with_every_input_is_self_contained(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    report = tmp_path / "report.html"
    result = runner.invoke(
        app,
        [
            "review",
            str(inputs["after"]),
            "--against",
            str(inputs["before"]),
            "--fleet",
            str(inputs["fleet"]),
            "--catalog",
            str(inputs["catalog"]),
            "--forecast",
            str(inputs["forecast"]),
            "--log",
            str(inputs["log"]),
            "--html",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    page = report.read_text()
    assert page.count(IMAGE) == 4  # heatmap, budgets, curves, replay
    assert 'class="note"' not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<style>" in page
    assert "before is plan plan-a, after is plan plan-b" in page
    assert "Replay of 400 requests" in page


def test_html_report_without_inputs_says_what_is_missing(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    report = tmp_path / "report.html"
    result = runner.invoke(app, ["review", str(inputs["after"]), "--html", str(report)])
    assert result.exit_code == 0, result.output
    page = report.read_text()
    assert page.count(IMAGE) == 2  # heatmap and bytes; no budgets to draw against
    assert "No --forecast or --log given" in page
    assert "No replay: it needs --log, --catalog and --fleet." in page
    assert "No --fleet given: budgets not drawn." in page


def test_diff_shows_only_what_moves(inputs: dict[str, Path], tmp_path: Path) -> None:
    same = runner.invoke(app, ["diff", str(inputs["after"]), str(inputs["after"])])
    assert same.exit_code == 0, same.output
    assert "no placement changes" in same.output
    third = make_plan(
        {"pod-0": ["alpha", "beta"], "pod-1": ["delta"]}, {"pod-1": ["gamma"]}, plan_id="plan-c"
    )
    moved = runner.invoke(
        app,
        ["diff", str(inputs["after"]), str(write_plan(tmp_path / "c.json", third))],
        env={"COLUMNS": "200"},
    )
    assert moved.exit_code == 0, moved.output
    assert "pod-1: load delta; unload alpha" in moved.output
    assert "pod-0:" not in moved.output
    assert "hot -> cold" not in moved.output and "alpha" in moved.output


@pytest.mark.parametrize(
    ("content", "code", "words"),
    [
        ("{not json", 2, "not valid JSON"),  # a bad input (2), not a pod's failure (1)
        ('{"schema_version": 99}', 2, "unsupported version 99"),
    ],
    ids=["not-json", "wrong-schema"],
)
def test_bad_plan_files_are_one_clear_line(
    tmp_path: Path, content: str, code: int, words: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = runner.invoke(app, ["review", str(bad)])
    assert result.exit_code == code
    assert words in result.output
    assert "Traceback" not in result.output


def test_a_forecast_without_its_columns_is_refused(inputs: dict[str, Path], tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.parquet"
    pd.DataFrame({"ts": [T0], "adapter": ["alpha"]}).to_parquet(wrong)
    result = runner.invoke(
        app,
        [
            "review",
            str(inputs["after"]),
            "--forecast",
            str(wrong),
            "--html",
            str(tmp_path / "r.html"),
        ],
    )
    assert result.exit_code == 2
    assert f"{wrong}: missing columns mean, q90" in result.output


def test_a_forecast_with_a_bad_rate_or_time_is_refused_as_plan_refuses_it(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    """review read a forecast with its own reader, which checked no rates and no times
    (a negative rate was drawn, a time that is no time a traceback), and only after
    printing the review's tables."""
    bad = tmp_path / "bad.parquet"
    frame = pd.read_parquet(inputs["forecast"])
    frame.loc[1, "mean"] = -1.0
    frame["ts"] = frame["ts"].astype(str)
    frame.loc[2, "ts"] = "soon"
    frame.to_parquet(bad)
    report = tmp_path / "r.html"
    result = runner.invoke(
        app,
        ["review", str(inputs["after"]), "--forecast", str(bad), "--html", str(report)],
        env={"COLUMNS": "300"},
    )
    assert result.exit_code == 2, result.output
    assert f"{bad}: row 3 (gamma): ts: 1 values that are not times ('soon')" in result.output
    assert f"{bad}: bucket beta at {T0.isoformat()}: mean: 1 negative rates" in result.output
    assert not report.exists()
    assert "per pod" not in result.output  # refused before any table is printed


def test_a_forecast_without_html_is_refused_not_ignored(
    inputs: dict[str, Path], tmp_path: Path
) -> None:
    """The forecast is drawn only in the HTML report: without --html, review neither read
    nor used it, and printed its tables as if the flag had counted."""
    missing = tmp_path / "no-such.parquet"
    for forecast in (inputs["forecast"], missing):
        result = runner.invoke(app, ["review", str(inputs["after"]), "--forecast", str(forecast)])
        assert result.exit_code == 2, result.output
        assert "review: --forecast is used only with --html" in result.output
        assert "per pod" not in result.output  # refused before any table is printed
