"""``lorafleet replay --class-priority``: the figures per catalog class in the JSON (new
keys beside the unchanged ones) and in the text; without the flag, none."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import placement.cli  # noqa: F401  (registers the commands)
from placement.cli.app import app

from .test_replay_cli import FLEET, JSON_KEYS


@pytest.fixture
def inputs(tmp_path: Path) -> list[str]:
    """Five adapters, the last two experiments, on two pods of two GPU slots."""
    names = [f"tenant-{i}" for i in range(5)]
    entries = "\n".join(
        f"  - {{name: {name}, base_model: llama-3.1-8b, rank: 16,"
        f" target_modules: [q_proj, v_proj], source: s3://a/{name}"
        + (", class: experiment}" if i >= 3 else "}")
        for i, name in enumerate(names)
    )
    (tmp_path / "catalog.yaml").write_text(f"adapters:\n{entries}\n")
    (tmp_path / "fleet.yaml").write_text(FLEET)
    start = pd.Timestamp("2026-03-10T09:00:00Z")
    rows = [
        {"ts": start + pd.Timedelta(seconds=2 * i), "adapter": names[(i * 7) % 5 if i % 3 else 0]}
        for i in range(600)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "requests.parquet", index=False)
    return [
        *("--catalog", str(tmp_path / "catalog.yaml"), "--fleet", str(tmp_path / "fleet.yaml")),
        *("--log", str(tmp_path / "requests.parquet")),
    ]


def _run(inputs: list[str], *extra: str) -> str:
    policies = ("--policy", "bounded", "--policy", "lorafleet", "--planner", "greedy")
    result = CliRunner().invoke(app, ["replay", *inputs, *policies, *extra])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_json_has_the_figures_per_class_with_the_flag(inputs: list[str]) -> None:
    payload = json.loads(_run(inputs, "--class-priority", "--json"))["policies"]
    for metrics in payload.values():
        assert set(metrics) >= JSON_KEYS
        assert set(metrics["by_class"]) == {"production", "experiment"}
        counted = sum(figures["requests"] for figures in metrics["by_class"].values())
        assert counted == metrics["requests"] == 600
        assert metrics["class_warmups"] >= 0
    assert payload["bounded"]["class_warmups"] == 0


def test_without_the_flag_no_class_keys(inputs: list[str]) -> None:
    payload = json.loads(_run(inputs, "--json"))["policies"]
    assert all("by_class" not in m and "class_warmups" not in m for m in payload.values())


def test_the_text_has_a_line_per_class(inputs: list[str]) -> None:
    text = _run(inputs, "--class-priority")
    assert "lorafleet: experiment:" in text
    assert "bounded: production:" in text
    assert "class warm-ups" in text
