"""``lorafleet demo``: the whole loop on one machine, policy against policy."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from placement.cli.app import app, err, out, report_errors
from placement.demo.processes import local_processes
from placement.demo.run import (
    DEFAULT_SCENARIO,
    POLICIES,
    DemoOptions,
    PolicyResult,
    Stage,
    run_demo,
)
from placement.errors import InputError, Problem


def results_table(results: list[PolicyResult], *, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    columns = ("policy", "requests", "errors", "GPU hit", "GPU loads", "loads/pod/s",
               "residency p50", "residency p95", "TTFT p50", "TTFT p95")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for result in results:
        table.add_row(
            result.policy,
            f"{result.requests:,}",
            f"{result.errors:,}",
            f"{result.gpu_hit_rate:.1%}",
            f"{result.activations:,}",
            f"{result.loads_per_pod_s:.2f}",
            f"{result.residency_p50_s:.1f} s",
            f"{result.residency_p95_s:.1f} s",
            f"{result.ttft_p50_ms:.0f} ms",
            f"{result.ttft_p95_ms:.0f} ms",
        )
    return table


@app.command()
@report_errors
def demo(
    scenario: Annotated[
        Path, typer.Option(help="a scenario folder under data/")
    ] = DEFAULT_SCENARIO,
    requests: Annotated[int, typer.Option(min=50, help="requests replayed per policy")] = 3000,
    seconds: Annotated[float, typer.Option(min=5, help="wall seconds of replay per policy")] = 45.0,
    policy: Annotated[
        list[str] | None, typer.Option(help="policies to compare (repeat); default all three")
    ] = None,
    workdir: Annotated[Path | None, typer.Option(help="keep logs, plans and configs here")] = None,
) -> None:
    """Emulated pods, the controller and the router, live: round-robin, EPP and lorafleet."""
    policies = tuple(policy or POLICIES)
    unknown = [name for name in policies if name not in POLICIES]
    if unknown:
        raise InputError(
            [Problem(source="--policy", message=f"unknown {unknown}; one of {POLICIES}")]
        )
    options = DemoOptions(
        scenario=scenario,
        requests_per_policy=requests,
        wall_s_per_policy=seconds,
        policies=policies,
    )
    with tempfile.TemporaryDirectory(prefix="lorafleet-demo-") as scratch:
        folder = workdir or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with (
            Progress(*columns, console=err(), transient=False) as bar,
            local_processes(folder) as processes,
        ):
            tasks: dict[str, TaskID] = {}

            def show(stage: Stage) -> None:
                key = stage.policy or "setup"
                if key not in tasks:
                    tasks[key] = bar.add_task(f"{key}: {stage.message}", total=stage.total or None)
                bar.update(
                    tasks[key],
                    description=f"{key}: {stage.message}",
                    completed=stage.done,
                    total=stage.total or None,
                )

            results = run_demo(options, folder, processes, show)
    console = Console(width=max(out().width, 130))
    console.print(results_table(results, title=f"{scenario.name}: the same requests, live"))
    console.print(
        f"{options.requests_per_policy:,} requests of the scenario's day, replayed in "
        f"{options.wall_s_per_policy:.0f} s per policy. GPU hit: the adapter was on a GPU slot "
        "when the request was admitted (router ledger). GPU loads, loads/pod/s and residency: "
        "the pods' own counters, in seconds of replay. TTFT: the router's log."
    )
