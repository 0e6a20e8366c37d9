"""``lorafleet apply`` against emulated pods on real sockets.

The end-to-end test drives vLLM-like pods only through the CLI and reads what each
holds from its ``/admin/stats`` (the engine model: a load activates on a GPU slot, an
unload frees nothing): after an apply, and after a re-plan that moves adapters, each
pod's GPU holds exactly its planned hot set; applying again loads nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import PodId
from placement.emulator import (
    ZERO_LATENCY,
    EmulatedFleet,
    PodConfig,
    listening_sockets,
    ports_of,
    serving_in_thread,
)
from placement.plan import Plan, plan_to_json
from tests.factories import make_plan

PLAN = make_plan({"pod-0": ["a0"], "pod-1": ["a0"]}, {"pod-0": ["a1"], "pod-1": ["a2"]})


@pytest.fixture
def pods() -> Iterator[EmulatedFleet]:
    config = PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=3, max_lora_rank=64)
    sockets = listening_sockets(2)
    fleet = EmulatedFleet.start(2, ports=ports_of(sockets), config=config)
    with serving_in_thread(fleet.handles, sockets=sockets):
        yield fleet


def _inputs(
    tmp_path: Path,
    fleet: EmulatedFleet,
    *,
    missing: str = "",
    plan: Plan = PLAN,
    adapters: int = 3,
) -> list[str]:
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
        for i in range(adapters)
    )
    (tmp_path / "catalog.yaml").write_text(f"adapters:\n{entries}")
    (tmp_path / "plan.json").write_text(plan_to_json(plan))
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
    # vLLM activates every load: the warm adapter first, the hot one last.
    assert "pod-0:\n  + load a1  (warm in plan)\n  + load a0  (hot in plan)\n" in result.stdout
    assert all(not h.pod.listed for h in pods.handles)


def test_apply_then_apply_again_changes_nothing(pods: EmulatedFleet, tmp_path: Path) -> None:
    args = _inputs(tmp_path, pods)
    first = CliRunner().invoke(app, args)
    second = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "pod-0: 2 done, 0 skipped, 0 failed" in first.stdout
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


# End to end: the GPU ends holding the plan's hot set, through the CLI only -------------

#: Two hot adapters fill each pod's two GPU slots; one more is warm.
FIRST = make_plan(
    {"pod-0": ["a0", "a1"], "pod-1": ["a0", "a3"]}, {"pod-0": ["a2"], "pod-1": ["a4"]}
)
#: a1 and a3 swap pods, a2 turns hot, a0 turns warm on both.
MOVED = make_plan(
    {"pod-0": ["a2", "a3"], "pod-1": ["a1", "a4"]}, {"pod-0": ["a0"], "pod-1": ["a0"]}
)


def _held(fleet: EmulatedFleet) -> dict[str, dict[str, Any]]:
    """Each pod's ``/admin/stats``: what its engine model holds, read over HTTP."""
    stats: dict[str, dict[str, Any]] = {}
    for handle in fleet.handles:
        answer = httpx.get(f"{handle.url}/admin/stats", timeout=5.0).json()
        stats[handle.name] = {key: answer[key] for key in ("listed", "gpu", "host", "ghosts")}
        stats[handle.name]["loads"] = answer["counters"].get("loads", 0)
    return stats


def _apply(tmp_path: Path, fleet: EmulatedFleet, plan: Plan) -> str:
    result = CliRunner().invoke(app, _inputs(tmp_path, fleet, plan=plan, adapters=5))
    assert result.exit_code == 0, result.output
    return result.stdout


def _assert_gpu_holds_the_hot_set(fleet: EmulatedFleet, plan: Plan) -> None:
    for name, held in _held(fleet).items():
        pod_plan = plan.pods[PodId(name)]
        # vLLM (these pods): a name the plan moved away stays listed, an unload frees nothing.
        assert set(pod_plan.registered) <= set(held["listed"]) <= set(plan.adapters), name
        assert sorted(held["gpu"]) == sorted(pod_plan.hot), (name, held)


def test_apply_ends_with_each_gpu_holding_the_planned_hot_set(
    pods: EmulatedFleet, tmp_path: Path
) -> None:
    _apply(tmp_path, pods, FIRST)
    _assert_gpu_holds_the_hot_set(pods, FIRST)
    _apply(tmp_path, pods, MOVED)
    _assert_gpu_holds_the_hot_set(pods, MOVED)
    before = _held(pods)
    again = _apply(tmp_path, pods, MOVED)
    assert "pod-0: no change" in again and "pod-1: no change" in again
    assert _held(pods) == before
