"""The demo's table shows each policy's GPU evictions beside its loads (issue 17's live
target compares them), as the pods counted them."""

from __future__ import annotations

from dataclasses import replace

from rich.console import Console

from placement.cli.demo_cmds import results_table
from placement.demo.measure import PolicyResult


def _result(policy: str, *, activations: int, evictions: int) -> PolicyResult:
    return PolicyResult(
        policy=policy,
        requests=1000,
        errors=0,
        gpu_hit_rate=0.9,
        activations=activations,
        evictions=evictions,
        loads_per_pod_s=0.1,
        residency_p50_s=1.0,
        residency_p95_s=2.0,
        ttft_p50_ms=50.0,
        ttft_p95_ms=200.0,
    )


def test_the_table_has_a_gpu_evictions_column_with_each_policys_count() -> None:
    table = results_table(
        [
            _result("epp", activations=611, evictions=587),
            _result("lorafleet", activations=402, evictions=371),
        ],
        title="t",
    )
    headers = [str(column.header) for column in table.columns]
    column = table.columns[headers.index("GPU evictions")]
    assert list(column.cells) == ["587", "371"]
    loads = table.columns[headers.index("GPU loads")]
    assert list(loads.cells) == ["611", "402"]
    console = Console(width=200, record=True)
    console.print(table)
    assert "GPU evictions" in console.export_text()


def test_the_controllers_loads_and_warm_ups_show_beside_its_policy_only() -> None:
    with_controller = replace(
        _result("lorafleet", activations=402, evictions=371),
        controller_actions=(("load", 57), ("unload", 9), ("warmup", 31)),
    )
    table = results_table(
        [_result("epp", activations=611, evictions=587), with_controller], title="t"
    )
    headers = [str(column.header) for column in table.columns]
    column = table.columns[headers.index("controller loads / warm-ups")]
    assert list(column.cells) == ["-", "57 / 31"]
