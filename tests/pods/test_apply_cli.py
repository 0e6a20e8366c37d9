"""``lorafleet apply`` against emulated pods on real sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placement.cli import app
from placement.emulator import (
    ZERO_LATENCY,
    EmulatedFleet,
    PodConfig,
    free_base_port,
    serving_in_thread,
)
from placement.plan import plan_to_json
from tests.factories import make_plan

PLAN = make_plan({"pod-0": ["a0"], "pod-1": ["a0"]}, {"pod-0": ["a1"], "pod-1": ["a2"]})


@pytest.fixture
def pods() -> Iterator[EmulatedFleet]:
    config = PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=3, max_lora_rank=64)
    fleet = EmulatedFleet.start(2, base_port=free_base_port(2), config=config)
    with serving_in_thread(fleet.handles):
        yield fleet


def _inputs(tmp_path: Path, fleet: EmulatedFleet, *, missing: str = "") -> list[str]:
    pods = "\n".join(f'      - {{name: {h.name}, url: "{h.url}"}}' for h in fleet.handles)
    (tmp_path / "fleet.yaml").write_text(
        "pools:\n  - name: emulated\n    base_model: llama-3.1-8b\n"
        "    served_model_name: base-model\n    engine: vllm\n    max_lora_rank: 64\n"
        "    pod_defaults: {max_loras: 2, max_cpu_loras: 3}\n"
        f"    pods:\n{pods}\n"
    )
    entries = "".join(
        f"  - name: a{i}\n    base_model: llama-3.1-8b\n    rank: 8\n"
        f"    target_modules: [q_proj, v_proj]\n"
        f"    source: s3://adapters/{'missing-' if f'a{i}' == missing else ''}a{i}\n"
        for i in range(3)
    )
    (tmp_path / "catalog.yaml").write_text(f"adapters:\n{entries}")
    (tmp_path / "plan.json").write_text(plan_to_json(PLAN))
    return [
        "apply",
        str(tmp_path / "plan.json"),
        "--fleet",
        str(tmp_path / "fleet.yaml"),
        "--catalog",
        str(tmp_path / "catalog.yaml"),
        "--ledger",
        str(tmp_path / "ledger.json"),
    ]


def test_dry_run_shows_the_diff_and_changes_nothing(pods: EmulatedFleet, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [*_inputs(tmp_path, pods), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "+ load a0  (hot in plan)" in result.stdout
    assert "~ warmup a0" in result.stdout
    assert all(not h.pod.listed for h in pods.handles)


def test_apply_then_apply_again_changes_nothing(pods: EmulatedFleet, tmp_path: Path) -> None:
    args = _inputs(tmp_path, pods)
    first = CliRunner().invoke(app, args)
    second = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "pod-0: 3 done, 0 skipped, 0 failed" in first.stdout
    assert second.exit_code == 0
    assert "pod-0: no change" in second.stdout and "pod-1: no change" in second.stdout
    assert set(pods.pod("pod-1").listed) == {"a0", "a2"}


def test_a_permanent_failure_exits_1_with_the_reason_per_pod(
    pods: EmulatedFleet, tmp_path: Path
) -> None:
    result = CliRunner().invoke(app, _inputs(tmp_path, pods, missing="a2"))
    assert result.exit_code == 1
    assert "pod-1: load a2 failed (permanent" in result.stderr
    assert "s3://adapters/missing-a2" in result.stderr


def test_a_plan_naming_unknown_pods_or_adapters_is_bad_input(
    pods: EmulatedFleet, tmp_path: Path
) -> None:
    args = _inputs(tmp_path, pods)
    bad = make_plan({"pod-9": ["zz"]})
    (tmp_path / "plan.json").write_text(plan_to_json(bad))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "pod 'pod-9' is not in the fleet" in result.stderr
    assert "adapter 'zz' is not in the catalog" in result.stderr
