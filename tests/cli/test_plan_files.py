"""A plan file the user names (review, diff, apply, plan --current) that is not valid
JSON or not a plan is a bad input: exit 2, one line naming the file once."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import EXIT_BAD_INPUT, app

DATA = Path(__file__).resolve().parents[2] / "data" / "legal-research"
INPUTS = ["--catalog", str(DATA / "catalog.yaml"), "--fleet", str(DATA / "fleet.yaml")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("garbage{", "not valid JSON: Expecting value", id="not-json"),
        pytest.param("{}", "top level: missing required key 'schema_version'", id="not-a-plan"),
    ],
)
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["review", "{plan}", *INPUTS], id="review"),
        pytest.param(["diff", "{plan}", "{plan}"], id="diff"),
        pytest.param(["apply", "{plan}", *INPUTS, "--dry-run"], id="apply"),
    ],
)
def test_a_bad_plan_file_is_a_bad_input(
    tmp_path: Path, command: list[str], text: str, message: str
) -> None:
    # Read as a PlanError, these exited 1, an engine or Kubernetes failure's code.
    plan = tmp_path / "plan.json"
    plan.write_text(text)
    args = [str(plan) if a == "{plan}" else a for a in command]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: {plan}: {message}")


def test_a_current_plan_that_is_not_a_plan_names_its_file_once(tmp_path: Path) -> None:
    # It read "error: p.json: p.json: top level: ...".
    current = tmp_path / "current.json"
    current.write_text('{"schema_version": 1}')
    log = tmp_path / "requests.parquet"
    pd.read_parquet(DATA / "requests.parquet").head(2000).to_parquet(log)  # 2026-03-08
    args = ["plan", *INPUTS, "--log", str(log), "--at", "2026-03-08T19:00:00Z"]
    args += ["--current", str(current)]
    result = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "out" / "plan.json")])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"error: {current}: top level: missing required key 'pods'" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing written
