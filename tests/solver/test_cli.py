"""``lorafleet plan`` end to end on small files, through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import AdapterId
from placement.inputs import read_plan
from tests.fleets import fleet_yaml

CATALOG = """
adapters:
{entries}
"""
FLEET = fleet_yaml(pool="llama-8b", capacity_rps=50)
NAMES = [AdapterId(f"tenant-{i}") for i in range(6)]


def _entry(name: str, *, pinned: bool = False) -> str:
    return (
        f"  - {{name: {name}, base_model: llama-3.1-8b, rank: 16, target_modules: [q_proj, v_proj],"
        f" source: /adapters/{name}, size_bytes: 50MB, pinned: {str(pinned).lower()}}}"
    )


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG.format(entries="\n".join(_entry(n) for n in NAMES)))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    stamps = pd.date_range("2026-03-02T09:00Z", periods=6, freq="10min")
    rows = [
        {
            "ts": ts,
            "adapter": name,
            "mean": 600.0 / (i + 1),
            "q50": 1.0,
            "q90": 900.0 / (i + 1),
            "q99": 1200.0 / (i + 1),
            "p_nonzero": 1.0,
        }
        for ts in stamps
        for i, name in enumerate(NAMES)
    ]
    forecast = tmp_path / "forecast.parquet"
    pd.DataFrame(rows).to_parquet(forecast)
    day_before = pd.date_range("2026-03-01T09:00Z", periods=3600, freq="1s")
    log = tmp_path / "requests.parquet"
    adapters = [NAMES[i % 3] for i in range(len(day_before))]
    pd.DataFrame({"ts": day_before, "adapter": adapters}).to_parquet(log)
    return {"catalog": catalog, "fleet": fleet, "forecast": forecast, "log": log}


def _run(files: dict[str, Path], out: Path, *extra: str) -> tuple[int, str]:
    args = [
        "plan",
        "--catalog",
        str(files["catalog"]),
        "--fleet",
        str(files["fleet"]),
        "--at",
        "2026-03-02T09:00:00Z",
        "-o",
        str(out),
        "--time-limit",
        "2",
        *extra,
    ]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


def test_plan_from_a_forecast_writes_the_plan_and_prints_the_review(
    files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "plan.json"
    code, output = _run(files, out, "--forecast", str(files["forecast"]))
    assert code == 0, output
    plan = read_plan(out)
    assert plan.hot_pods(NAMES[0])
    assert "solver: OPTIMAL" in output
    assert "pod-0" in output and "2/2" in output
    assert "hot" in output and "traffic share" in output


def test_plan_from_a_log_forecasts_it_first(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, output = _run(files, out, "--log", str(files["log"]))
    assert code == 0, output
    plan = read_plan(out)
    assert {a for a in NAMES[:3]} <= {a for a, e in plan.adapters.items() if e.tier.value != "cold"}
    assert plan.why[NAMES[5]].startswith("cold: no forecast traffic")


def test_replanning_against_the_plan_in_force_loads_nothing(
    files: dict[str, Path], tmp_path: Path
) -> None:
    first, second = tmp_path / "one.json", tmp_path / "two.json"
    assert _run(files, first, "--forecast", str(files["forecast"]))[0] == 0
    code, output = _run(
        files, second, "--forecast", str(files["forecast"]), "--current", str(first)
    )
    assert code == 0, output
    assert read_plan(second).preloads == ()
    assert read_plan(second).placement() == read_plan(first).placement()


def test_an_observed_placement_is_accepted_as_current(
    files: dict[str, Path], tmp_path: Path
) -> None:
    observed = tmp_path / "observed.json"
    observed.write_text(json.dumps({"pods": {"pod-0": {"hot": [NAMES[0]], "warm": []}}}))
    out = tmp_path / "plan.json"
    code, output = _run(
        files, out, "--forecast", str(files["forecast"]), "--current", str(observed)
    )
    assert code == 0, output
    assert "pod-0" in read_plan(out).hot_pods(NAMES[0])


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        pytest.param([], "give exactly one of --log or --forecast", id="no-demand"),
        pytest.param(
            ["--forecast", "missing.parquet"], "missing.parquet: cannot read", id="no-file"
        ),
        pytest.param(
            ["--forecast", "F", "--current", "C"],
            "pods.pod-9: not a pod of the fleet",
            id="unknown-pod-in-current",
        ),
    ],
)
def test_bad_input_exits_2_with_one_line_per_problem(
    files: dict[str, Path], tmp_path: Path, extra: list[str], expected: str
) -> None:
    current = tmp_path / "current.json"
    current.write_text(json.dumps({"pods": {"pod-9": {"hot": [], "warm": []}}}))
    swap = {"F": str(files["forecast"]), "C": str(current)}
    code, output = _run(files, tmp_path / "plan.json", *[swap.get(a, a) for a in extra])
    assert code == 2
    assert expected in output
    assert "Traceback" not in output


def test_infeasible_pins_exit_1_with_the_explanation(
    files: dict[str, Path], tmp_path: Path
) -> None:
    files["catalog"].write_text(
        CATALOG.format(entries="\n".join(_entry(n, pinned=True) for n in NAMES))
    )
    code, output = _run(files, tmp_path / "plan.json", "--forecast", str(files["forecast"]))
    assert code == 1
    assert (
        "pins need 12 GPU slots in pool llama-8b; its pods have 2 each and 2 pods are ready"
        " (6 pinned adapters, 12 replicas in all)" in output
    )
