"""``lorafleet review`` and ``lorafleet diff``: read a plan before applying it.

``review PLAN`` prints what the plan does (and, with ``--against``, what it changes)
as rich tables, and with ``--html`` writes the self-contained report. ``--against
current`` means the plan the controller published last, read from ``--state-dir``
(``plan.json``, else ``last-plan.json``); any other value is a plan file. ``diff A B``
shows only what changes from A to B.

Owns reading the files and printing; the comparison is ``placement.review.diff``, the page
``placement.review.report``, the replay ``placement.review.replay``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from placement.adapters.statedir import PLAN_FILE, STATE_PLAN_FILE
from placement.cli.app import app, err, out, print_labelled, report_errors
from placement.cli.plan_files import read_plan_file
from placement.cli.request_logs import LOG_HELP, read_log
from placement.domain import Catalog, Fleet
from placement.errors import InputError, Problem
from placement.forecast.demand import read_forecast
from placement.inputs import load_catalog, load_fleet
from placement.inputs.request_log import RequestLog
from placement.plan import Plan
from placement.review.diff import PlanReview, human_bytes, review_plan
from placement.review.replay import ReplayComparison, compare_replays, last_day
from placement.review.report import render_html
from placement.review.slo import attainment_lines
from placement.settings import Settings

#: The controller's state directory (``placement.adapters.statedir``): the published
#: plan, else the last plan it saved for a restart.
STATE_PLAN_FILES = (PLAN_FILE, STATE_PLAN_FILE)

FleetOption = Annotated[Path | None, typer.Option(help="fleet.yaml: budgets per pod")]
CatalogOption = Annotated[Path | None, typer.Option(help="catalog.yaml: sizes, pins, groups")]


@dataclass(frozen=True, kw_only=True)
class Context:
    fleet: Fleet | None
    catalog: Catalog | None


def _context(fleet: Path | None, catalog: Path | None) -> Context:
    parsed = load_fleet(fleet) if fleet is not None else None
    return Context(
        fleet=parsed,
        catalog=load_catalog(catalog, fleet=parsed) if catalog is not None else None,
    )


def resolve_against(against: str | None, state_dir: Path | None) -> Plan | None:
    """The plan to compare with: a file, or ``current`` from the state directory."""
    if against is None:
        return None
    if against != "current":
        return read_plan_file(against)
    if state_dir is None:
        raise InputError(
            [Problem(source="--against", message="'current' needs --state-dir (the controller's)")]
        )
    for name in STATE_PLAN_FILES:
        if (state_dir / name).is_file():
            return read_plan_file(state_dir / name)
    names = " or ".join(STATE_PLAN_FILES)
    raise InputError(
        [Problem(source=str(state_dir), message=f"no published plan here (looked for {names})")]
    )


def _replay(
    plan: Plan, against: Plan | None, log: RequestLog | None, context: Context
) -> tuple[ReplayComparison | None, str | None]:
    if log is None or context.catalog is None or context.fleet is None:
        return None, "No replay: it needs --log, --catalog and --fleet."
    try:
        replay = compare_replays(
            plan,
            against=against,
            log=log,
            catalog=context.catalog,
            fleet=context.fleet,
            settings=Settings(),
        )
    except InputError as exc:
        return None, "No replay: " + "; ".join(str(p) for p in exc.problems)
    return replay, None


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def print_summary(console: Console, review: PlanReview) -> None:
    solver = review.solver
    before = (review.before_predicted or {}).get("gpu_hit_rate")
    tiers = ", ".join(f"{t.value} {n}" for t, n in review.tiers().items())
    console.print(
        f"[bold]{review.plan_id}[/]"
        + (f" against [bold]{review.against_id}[/]" if review.against_id else ""),
        highlight=False,
    )
    console.print(
        f"tiers: {tiers}; loads {review.loads}, unloads {review.unloads}, "
        f"bytes moved {human_bytes(review.bytes_moved)}",
        highlight=False,
    )
    console.print(
        f"predicted GPU hit rate {_percent(before)} -> "
        f"{_percent(review.predicted.get('gpu_hit_rate'))}; solver {solver.status}, "
        f"gap {solver.gap:.2%}, {solver.wall_s:.2f} s",
        highlight=False,
    )
    for warning in review.warnings:
        print_labelled(console, "bold red", "warning", warning)


def pods_table(review: PlanReview, *, changed_only: bool) -> Table:
    table = Table(title="per pod", title_justify="left")
    table.add_column("pod")
    for name in ("hot", "registered", "loads", "unloads", "to GPU", "moved", "GPU bytes"):
        table.add_column(name, justify="right")
    table.add_column("host bytes", justify="right")
    table.add_column("rps", justify="right")
    for pod in review.pods:
        if changed_only and not pod.changed:
            continue
        budget = pod.budget
        table.add_row(
            str(pod.pod),
            f"{len(pod.hot)}/{budget.slots}" if budget else str(len(pod.hot)),
            f"{len(pod.hot) + len(pod.warm)}/{budget.cpu_slots}" if budget else str(len(pod.warm)),
            str(len(pod.loads)),
            str(len(pod.unloads)),
            str(len(pod.promoted)),
            human_bytes(pod.bytes_moved),
            _of(human_bytes(pod.hbm_bytes_used), human_bytes(budget.hbm_bytes) if budget else None),
            _of(
                human_bytes(pod.host_bytes_used), human_bytes(budget.host_bytes) if budget else None
            ),
            _of(f"{pod.expected_rps:.3g}", f"{budget.capacity_rps:.3g}" if budget else None),
        )
    return table


def _of(used: str, limit: str | None) -> str:
    return used if limit is None else f"{used} / {limit}"


def print_changes(console: Console, review: PlanReview) -> None:
    """One line per changed pod naming the adapters that move (tables truncate names)."""
    for pod in review.pods:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("load", pod.loads),
                ("unload", pod.unloads),
                ("to GPU", pod.promoted),
                ("off GPU", pod.demoted),
            )
            if names
        ]
        if parts:
            print_labelled(console, "bold", str(pod.pod), "; ".join(parts))


def adapters_table(review: PlanReview, *, changed_only: bool, limit: int | None) -> Table:
    table = Table(title="per adapter", title_justify="left")
    for name in ("adapter", "tier", "replicas", "pods", "rules", "why"):
        table.add_column(name, overflow="fold")
    rows = [a for a in review.adapters if a.changed or not changed_only]
    for entry in rows[:limit] if limit is not None else rows:
        tier = entry.tier.value
        if entry.before is not None and entry.before is not entry.tier:
            tier = f"{entry.before.value} -> {tier}"
        table.add_row(
            str(entry.adapter),
            tier,
            str(entry.replicas),
            ", ".join(sorted(entry.pods)) or "-",
            "; ".join(entry.reasons) or "-",
            entry.why or "-",
        )
    if limit is not None and len(rows) > limit:
        table.caption = f"{len(rows) - limit} more (--all shows every adapter)"
    return table


@app.command()
@report_errors
def review(
    plan: Annotated[Path, typer.Argument(help="the plan to review (JSON)")],
    against: Annotated[
        str | None, typer.Option(help="'current' (from --state-dir) or another plan file")
    ] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="the controller's state directory, for 'current'")
    ] = None,
    fleet: FleetOption = None,
    catalog: CatalogOption = None,
    forecast: Annotated[
        Path | None, typer.Option(help="forecast parquet: the HTML report's curves (needs --html)")
    ] = None,
    log: Annotated[Path | None, typer.Option(help=f"{LOG_HELP}; curves and replay")] = None,
    html: Annotated[Path | None, typer.Option(help="write the HTML report here")] = None,
    top: Annotated[int, typer.Option(help="adapters in the table and the curves")] = 20,
    all_adapters: Annotated[bool, typer.Option("--all", help="every adapter")] = False,
) -> None:
    """Show what a plan does, per pod and per adapter, and what it changes."""
    if forecast is not None and html is None:
        # The forecast is drawn in the HTML report's curves and nowhere else: without
        # --html it would be silently ignored.
        raise InputError([Problem(source="review", message="--forecast is used only with --html")])
    new = read_plan_file(plan)
    base = resolve_against(against, state_dir)
    context = _context(fleet, catalog)
    # Every input read before anything is printed: a bad one is the only output.
    request_log = read_log(log) if log is not None else None
    ahead = read_forecast(forecast) if forecast is not None else None
    result = review_plan(new, against=base, fleet=context.fleet, catalog=context.catalog)
    console = out()
    print_summary(console, result)
    console.print(pods_table(result, changed_only=False))
    print_changes(console, result)
    console.print(adapters_table(result, changed_only=False, limit=None if all_adapters else top))
    replay, note = (
        _replay(new, base, request_log, context) if request_log is not None else (None, None)
    )
    if replay is not None:
        console.print("[bold]SLO attainment per tenant[/] (replay of the log's last day)")
        for line in attainment_lines(replay.before_tenants, replay.after_tenants):
            console.print(line, highlight=False)
    if html is None:
        return
    if request_log is None:
        note = "No replay: it needs --log, --catalog and --fleet."
    page = render_html(
        result,
        new,
        forecast=ahead,
        history=_history(request_log),
        replay=replay,
        replay_note=note,
        top=min(top, 8),
    )
    html.write_text(page, encoding="utf-8")
    err().print(f"wrote {html}", highlight=False)


def _history(log: RequestLog | None) -> pd.DataFrame | None:
    if log is None:
        return None
    return last_day(log).counts(Settings().forecast.bucket_s)


@app.command()
@report_errors
def diff(
    before: Annotated[Path, typer.Argument(help="the earlier plan (JSON)")],
    after: Annotated[Path, typer.Argument(help="the later plan (JSON)")],
    fleet: FleetOption = None,
    catalog: CatalogOption = None,
) -> None:
    """What changes from one plan to another: only the pods and adapters that move."""
    context = _context(fleet, catalog)
    result = review_plan(
        read_plan_file(after),
        against=read_plan_file(before),
        fleet=context.fleet,
        catalog=context.catalog,
    )
    console = out()
    print_summary(console, result)
    if not any(pod.changed for pod in result.pods) and not any(a.changed for a in result.adapters):
        console.print("no placement changes")
        return
    console.print(pods_table(result, changed_only=True))
    print_changes(console, result)
    console.print(adapters_table(result, changed_only=True, limit=None))
