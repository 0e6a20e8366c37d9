"""Golden files: the artefacts people read must not drift unnoticed.

Each test runs the command in process and compares its output with a file here:

- ``plan-<scenario>.json``: ``lorafleet forecast --model profile-7d`` then ``lorafleet
  plan --forecast`` for every scenario in data/, for the hour after its log ends. The
  forecast is a mean daily profile, not the default model search (a
  gradient-boosted fit of 8 s). Pools this small are solved on one CP-SAT worker in
  milliseconds: the plans come out the same under a 0.5 s or a 60 s time limit.
- ``review.txt``: ``lorafleet review`` of legal-research's plan at 15:00 against its
  plan at 12:00 (made with ``--current`` of the first), 160 columns.
- ``replay.json``: ``lorafleet replay --json`` on 3,000 requests of the war story from
  Thursday 08:30 under round-robin, epp and bounded.

Volatile fields are normalised before comparing: the plan's creation time, solver wall
time and input digest (also in its id), and every float to 6 significant digits.
When a change moves an artefact on purpose, rewrite the files and review their diff
with the change:

    .venv/bin/pytest tests/golden --regen-golden
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app

GOLDEN = Path(__file__).parent
DATA = GOLDEN.parents[1] / "data"
REGENERATE = "if the change is meant, rewrite with `.venv/bin/pytest tests/golden --regen-golden`"
#: Per scenario, the plan's start: the hour its log ends, so the forecast has it all.
PLAN_AT = {
    "code-assistant": "2026-03-12T07:00:00Z",
    "legal-research": "2026-03-12T05:00:00Z",
    "saas-50": "2026-03-10T04:00:00Z",
    "war-story": "2026-03-13T04:00:00Z",
}
VOLATILE = {"created_at": "<created_at>", "inputs_digest": "<digest>", "wall_s": "<wall_s>"}
#: A plan id: its start, then the first 10 hex digits of its input digest.
PLAN_ID = re.compile(r"(plan-\d{8}T\d{6}Z)-[0-9a-f]{10}\b")

runner = CliRunner()


@pytest.fixture
def regen(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regen-golden"))


def assert_golden(name: str, actual: str, *, regen: bool) -> None:
    path = GOLDEN / name
    if regen:
        path.write_text(actual)
        return
    if not path.exists():
        pytest.fail(f"tests/golden/{name} is missing; {REGENERATE}", pytrace=False)
    expected = path.read_text()
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile=f"tests/golden/{name}",
            tofile="this run",
        )
        pytest.fail(f"{name} changed; {REGENERATE}\n{''.join(diff)}", pytrace=False)


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    return result.stdout


def plan_for(scenario: str, at: str, out: Path, *current: str) -> Path:
    """Forecast with the daily profile, then plan; ``current``: ``--current`` and a file."""
    source = DATA / scenario
    forecast = out.with_suffix(".parquet")
    log = str(source / "requests.parquet")
    invoke("forecast", "--log", log, "--at", at, "--model", "profile-7d", "-o", str(forecast))
    invoke(
        "plan",
        *("--catalog", str(source / "catalog.yaml"), "--fleet", str(source / "fleet.yaml")),
        *("--forecast", str(forecast), "--at", at, "-o", str(out), *current),
    )
    return out


def normalised(value: Any) -> Any:
    """``value`` with VOLATILE keys replaced and floats cut to 6 significant digits."""
    if isinstance(value, dict):
        return {k: VOLATILE.get(k, normalised(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [normalised(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.6g}")
    return value


def plan_text(path: Path) -> str:
    plan = normalised(json.loads(path.read_text()))
    return PLAN_ID.sub(r"\1-<digest>", json.dumps(plan, indent=2) + "\n")


def test_every_scenario_has_a_golden_plan() -> None:
    scenarios = sorted(p.name for p in DATA.iterdir() if (p / "catalog.yaml").exists())
    assert scenarios == sorted(PLAN_AT)


@pytest.mark.parametrize("scenario", sorted(PLAN_AT), ids=sorted(PLAN_AT))
def test_plan_of_each_scenario(scenario: str, tmp_path: Path, regen: bool) -> None:
    plan = plan_for(scenario, PLAN_AT[scenario], tmp_path / "plan.json")
    assert_golden(f"plan-{scenario}.json", plan_text(plan), regen=regen)


def test_review_of_a_replan(tmp_path: Path, regen: bool) -> None:
    before = plan_for("legal-research", "2026-03-11T12:00:00Z", tmp_path / "before.json")
    current = ("--current", str(before))
    after = plan_for("legal-research", "2026-03-11T15:00:00Z", tmp_path / "after.json", *current)
    source = DATA / "legal-research"
    text = invoke(
        *("review", str(after), "--against", str(before)),
        *("--fleet", str(source / "fleet.yaml"), "--catalog", str(source / "catalog.yaml")),
    )
    text = PLAN_ID.sub(r"\1-<digest>", text)
    text = re.sub(r"(solver \w+, gap [\d.]+%), [\d.]+ s", r"\1, <wall_s> s", text)
    assert_golden("review.txt", text, regen=regen)


def test_replay_of_a_small_log(tmp_path: Path, regen: bool) -> None:
    source = DATA / "war-story"
    requests = pd.read_parquet(source / "requests.parquet")
    start = pd.Timestamp("2026-03-12T08:30:00Z")
    log = tmp_path / "requests.parquet"
    requests[requests["ts"] >= start].head(3000).to_parquet(log, index=False)
    text = invoke(
        *("replay", "--log", str(log), "--json"),
        *("--catalog", str(source / "catalog.yaml"), "--fleet", str(source / "fleet.yaml")),
        *("--policy", "round-robin", "--policy", "epp", "--policy", "bounded"),
    )
    replay = normalised(json.loads(text))
    assert_golden("replay.json", json.dumps(replay, indent=2) + "\n", regen=regen)
