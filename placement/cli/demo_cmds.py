"""``lorafleet demo``: the whole loop on one machine, policy against policy."""

from __future__ import annotations

import tempfile
from datetime import date, datetime
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

from placement.cli.app import app, err, out, print_labelled, report_errors
from placement.demo.measure import PolicyResult
from placement.demo.prepare import DemoOptions
from placement.demo.processes import local_processes
from placement.demo.run import Stage, run_demo
from placement.demo.setup import DEFAULT_SCENARIO, POLICIES
from placement.errors import InputError, Problem

#: The measured window: the war story's Thursday at 15:00 EDT, the cascade's densest.
DEFAULT_START = "15:00"
DEFAULT_MINUTES = 1.5


def results_table(results: list[PolicyResult], *, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    columns = ("policy", "requests", "errors", "GPU hit", "GPU loads", "GPU evictions",
               "controller loads / warm-ups", "loads/pod/s",
               "residency p50", "residency p95", "TTFT p50", "TTFT p95", "after event",
               "sent late p95")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for result in results:
        table.add_row(
            result.policy,
            f"{result.requests:,}",
            f"{result.errors:,}",
            f"{result.gpu_hit_rate:.1%}",
            f"{result.activations:,}",
            f"{result.evictions:,}",
            _controller_ran(result),
            f"{result.loads_per_pod_s:.2f}",
            f"{result.residency_p50_s:.1f} s",
            f"{result.residency_p95_s:.1f} s",
            f"{result.ttft_p50_ms:.0f} ms",
            f"{result.ttft_p95_ms:.0f} ms",
            _after_event(result),
            f"{result.late_p95_ms / 1000:.1f} s",
        )
    return table


def _local_hours(text: str) -> float:
    """Hours after midnight of a local ``HH:MM`` or ``HH:MM:SS``."""
    parts = text.split(":")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        values = []
    if (
        len(values) not in (2, 3)
        or not 0 <= values[0] < 24
        or not all(0 <= v < 60 for v in values[1:])
    ):
        raise InputError(
            [Problem(source="--start", message=f"{text!r} is not a local time HH:MM[:SS]")]
        )
    return values[0] + values[1] / 60 + (values[2] / 3600 if len(values) == 3 else 0.0)


def _options(
    *,
    scenario: Path,
    start: str,
    day: date | None,
    minutes: float,
    warmup: float,
    speed: float,
    requests: int | None,
    policies: tuple[str, ...],
    events: bool,
) -> DemoOptions:
    unknown = [name for name in policies if name not in POLICIES]
    if unknown:
        raise InputError(
            [Problem(source="--policy", message=f"unknown {unknown}; one of {POLICIES}")]
        )
    opened = _local_hours(start)
    if opened + minutes / 60 > 24:
        raise InputError(
            [Problem(source="--minutes", message=f"{start} + {minutes:g} min passes midnight")]
        )
    return DemoOptions(
        scenario=scenario,
        window_hours=(opened, opened + minutes / 60),
        day=day,
        warmup_s=warmup,
        speed=speed,
        max_requests=requests,
        policies=policies,
        events=events,
    )


def _controller_ran(result: PolicyResult) -> str:
    if not result.controller_actions:
        return "-"
    return f"{result.controller_ran('load'):,} / {result.controller_ran('warmup'):,}"


def _after_event(result: PolicyResult) -> str:
    figures = result.events
    if not figures.first_requests:
        return "-"
    return f"{figures.first_hit_rate:.0%} of {figures.first_requests}"


@app.command()
@report_errors
def demo(
    scenario: Annotated[
        Path, typer.Option(help="a scenario folder under data/")
    ] = DEFAULT_SCENARIO,
    start: Annotated[
        str, typer.Option(help="local time on the scenario's last day the measured window opens")
    ] = DEFAULT_START,
    day: Annotated[
        datetime | None,
        typer.Option(formats=["%Y-%m-%d"], help="the window's local day (default: the log's last)"),
    ] = None,
    minutes: Annotated[
        float, typer.Option(min=0.1, max=60, help="minutes of the scenario measured")
    ] = DEFAULT_MINUTES,
    warmup: Annotated[
        float, typer.Option(min=0, help="seconds before the window replayed first, not measured")
    ] = DemoOptions().warmup_s,
    speed: Annotated[
        float,
        typer.Option(min=0.1, max=100, help="scenario s per wall s (1: real time)"),
    ] = 1.0,
    requests: Annotated[
        int | None,
        typer.Option(min=50, help="thin the window to N requests (default: all)"),
    ] = None,
    policy: Annotated[
        list[str] | None, typer.Option(help="policies to compare (repeat); default all three")
    ] = None,
    events: Annotated[
        bool, typer.Option(help="send the scenario's events to the controller's webhook")
    ] = True,
    workdir: Annotated[Path | None, typer.Option(help="keep logs, plans and configs here")] = None,
) -> None:
    """Emulated pods, the controller and the router, live: round-robin, EPP and lorafleet."""
    options = _options(
        scenario=scenario,
        start=start,
        day=day.date() if day is not None else None,
        minutes=minutes,
        warmup=warmup,
        speed=speed,
        requests=requests,
        policies=tuple(policy or POLICIES),
        events=events,
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
    console = Console(width=max(out().width, 170))
    console.print(results_table(results, title=f"{scenario.name}: the same requests, live"))
    for result in results:
        if (line := result.unanswered_line()) is not None:
            print_labelled(err(), "bold yellow", "warning", line)
    console.print(_reading(options, start=start, minutes=minutes, results=results))


def _reading(
    options: DemoOptions, *, start: str, minutes: float, results: list[PolicyResult]
) -> str:
    density = (
        "every request of the log, at its real density"
        if options.max_requests is None
        else f"thinned at random to {options.max_requests:,} requests"
    )
    clock = "real time" if options.speed == 1 else f"{options.speed:g}x real time"
    events = next((r.events for r in results if r.events.delivered), None)
    delivered = (
        f" Events: {events.delivered} sent to the controller's webhook, {events.accepted} "
        f"accepted, {events.preloads} preloads decided; 'after event': the first request of "
        "each adapter after a pipeline step or login that found it on a GPU."
        if events is not None
        else ""
    )
    return (
        f"{minutes:g} min of the scenario's last day from {start} local ({density}), "
        f"after {options.warmup_s:g} s of warm-up per policy that is not measured, on "
        f"{clock}. GPU hit: the adapter was on a GPU slot when the request was admitted "
        "(router ledger). GPU loads, GPU evictions, loads/pod/s and residency: the pods' own "
        "counters (the controller's loads and warm-ups among them, counted apart from its "
        "/metrics), in wall seconds. TTFT: "
        "the router's log. Sent late p95: how far behind its schedule the client sent the "
        "95th percentile request (over a second: this machine did not keep up, and the "
        f"window's edges blur).{delivered}"
    )
