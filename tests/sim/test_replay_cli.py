"""``lorafleet replay`` end to end on small files: JSON keys, table, replayed log, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import placement.cli  # noqa: F401  (registers the commands)
from placement.cli.app import app
from tests.fleets import fleet_yaml

JSON_KEYS = {
    "requests",
    "gpu_hit_rate",
    "cpu_hit_rate",
    "cold_loads",
    "loads",
    "loads_per_pod_s",
    "residency_p50_s",
    "residency_p95_s",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_p99_ms",
    "load_wait_share",
    "throughput_rps",
    "convoy",
}

CATALOG = """
adapters:
{entries}
"""
FLEET = fleet_yaml()


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    names = [f"tenant-{i}" for i in range(5)]
    entries = "\n".join(
        f"  - {{name: {name}, base_model: llama-3.1-8b, rank: 16,"
        f" target_modules: [q_proj, v_proj], source: s3://a/{name}}}"
        for name in names
    )
    (tmp_path / "catalog.yaml").write_text(CATALOG.format(entries=entries))
    (tmp_path / "fleet.yaml").write_text(FLEET)
    start = pd.Timestamp("2026-03-10T09:00:00Z")
    rows = [
        {"ts": start + pd.Timedelta(seconds=2 * i), "adapter": names[(i * 7) % 5 if i % 3 else 0]}
        for i in range(600)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "requests.parquet", index=False)
    return {
        "catalog": tmp_path / "catalog.yaml",
        "fleet": tmp_path / "fleet.yaml",
        "log": tmp_path / "requests.parquet",
    }


def args(inputs: dict[str, Path], *extra: str) -> list[str]:
    base = ["replay", "--catalog", str(inputs["catalog"]), "--fleet", str(inputs["fleet"])]
    return [*base, "--log", str(inputs["log"]), *extra]


def test_json_has_one_entry_per_policy_with_every_key(inputs: dict[str, Path]) -> None:
    policies = ["round-robin", "epp", "hash", "lorafleet", "oracle"]
    extra = [part for name in policies for part in ("--policy", name)]
    result = CliRunner().invoke(app, args(inputs, *extra, "--planner", "greedy", "--json"))
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert list(payload["policies"]) == policies
    for metrics in payload["policies"].values():
        assert set(metrics) >= JSON_KEYS
        assert metrics["requests"] == 600
        assert 0.0 <= metrics["gpu_hit_rate"] <= 1.0
        assert 0.0 <= metrics["cpu_hit_rate"] <= 1.0


def test_table_and_replayed_log(inputs: dict[str, Path], tmp_path: Path) -> None:
    out_log = tmp_path / "replayed.parquet"
    extra = ["--policy", "epp", "--policy", "llm-d", "--eviction", "chameleon"]
    result = CliRunner().invoke(app, args(inputs, *extra, "--out-log", str(out_log)))
    assert result.exit_code == 0, result.output
    assert "epp (chameleon)" in result.stdout
    assert "llm-d" in result.stdout
    replayed = pd.read_parquet(out_log)
    assert len(replayed) == 1200
    assert set(replayed["outcome"]) <= {"gpu_hit", "cpu_hit", "cold_load"}
    assert set(replayed["pod"]) <= {"pod-0", "pod-1"}
    assert {"ts", "adapter", "ttft_ms", "policy"} <= set(replayed.columns)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--policy", "fastest"], "unknown policy 'fastest'"),
        (["--policy", "epp", "--eviction", "random"], "unknown policy 'random'"),
        (["--policy", "epp", "--load-admission", "fifo"], "unknown admission 'fifo'"),
    ],
    ids=["bad-policy", "bad-eviction", "bad-admission"],
)
def test_bad_options_are_one_line_errors(
    inputs: dict[str, Path], extra: list[str], message: str
) -> None:
    result = CliRunner().invoke(app, args(inputs, *extra))
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_load_admission_reaches_the_replay(inputs: dict[str, Path]) -> None:
    """--load-admission vllm replays under vLLM's admission; drain is the default."""
    default = _policies(inputs)["epp"]
    assert _policies(inputs, "--load-admission", "drain")["epp"] == default
    vllm = _policies(inputs, "--load-admission", "vllm")["epp"]
    assert vllm["requests"] == default["requests"]
    assert vllm != default


def test_solver_planner_replays(inputs: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, args(inputs, "--policy", "lorafleet", "--json"))
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)["policies"]["lorafleet"]
    assert metrics["plans"] >= 1


def _policies(inputs: dict[str, Path], *extra: str) -> dict[str, dict[str, float]]:
    result = CliRunner().invoke(app, args(inputs, "--policy", "epp", "--json", *extra))
    assert result.exit_code == 0, result.output
    policies: dict[str, dict[str, float]] = json.loads(result.stdout)["policies"]
    return policies


class TestWindow:
    """--from/--to: figures of the requests arriving in the window, the whole log replayed."""

    def test_window_counts_only_its_requests_and_keeps_the_keys(
        self, inputs: dict[str, Path]
    ) -> None:
        # 300 s to 599 s after the first request, given in two offsets: requests 150..299.
        window = ["--from", "2026-03-10T10:05:00+01:00", "--to", "2026-03-10T09:09:59Z"]
        whole = _policies(inputs)["epp"]
        part = _policies(inputs, *window)["epp"]
        assert set(part) == set(whole)
        assert part["requests"] == 150
        assert part["loads"] < whole["loads"]

    def test_a_window_around_the_log_changes_nothing(self, inputs: dict[str, Path]) -> None:
        window = ["--from", "2026-03-10T09:00:00Z", "--to", "2026-03-11T00:00:00Z"]
        assert _policies(inputs, *window) == _policies(inputs)

    @pytest.mark.parametrize(
        ("window", "message"),
        [
            (["--from", "2026-03-10T09:05:00"], "not an ISO time with an offset"),
            (["--to", "soon"], "not an ISO time with an offset"),
            (["--from", "2026-03-10T09:05:00Z", "--to", "2026-03-10T09:00:00Z"], "after --from"),
            (["--from", "2026-03-11T09:00:00Z"], "the window holds no request"),
        ],
        ids=["no-offset", "not-a-time", "reversed", "outside"],
    )
    def test_bad_windows_are_one_line_errors(
        self, inputs: dict[str, Path], window: list[str], message: str
    ) -> None:
        result = CliRunner().invoke(app, args(inputs, "--policy", "epp", *window))
        assert result.exit_code == 2, result.output
        assert message in result.output
        assert "Traceback" not in result.output


class TestEvents:
    """Bad and good event logs at the command line: tests/cli/test_replay_events.py."""

    def test_no_events_no_event_figures(self, inputs: dict[str, Path]) -> None:
        assert "events" not in _policies(inputs)["epp"]
