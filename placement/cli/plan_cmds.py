"""``lorafleet plan``: solve the placement for a time and write the plan, with a review.

Reads catalog and fleet, takes demand from a forecast file (``--forecast``) or from a
forecast of the request log made on the spot (``--log``, by ``placement.forecast.forecaster``
over the plan's validity), optionally the placement in force (``--current``:
a plan file, or an observed ``{"pods": {pod: {"hot": [...], "warm": [...]}}}``), and
writes the plan JSON. Prints per pod the hot and warm sets with slots and bytes used
of the budget, per tier the counts and traffic share, and the solver's line.

Owns the files and the printing; the decisions are ``placement.solver.solve``'s.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from placement.cli.app import app, err, out, print_labelled, report_errors
from placement.cli.request_logs import LOG_HELP, read_log
from placement.domain import AdapterId, Catalog, Fleet, PodId, Tier
from placement.errors import ForecastError, InputError, PlanError, Problem
from placement.forecast.demand import bucket_seconds, demand_from_forecast, read_forecast
from placement.forecast.forecaster import forecast_demand, timezones_of
from placement.inputs import load_catalog, load_fleet, write_plan
from placement.inputs.files import read_text
from placement.inputs.request_log import empty_log_problem
from placement.plan import Plan, plan_from_dict, plan_input_error
from placement.review.diff import human_bytes
from placement.settings import Settings
from placement.solver import extract_plan, options_from, solve
from placement.solver.problem import Demand
from placement.solver.problem_build import build_problem
from placement.solver.timing import Deadline

Current = dict[PodId, dict[AdapterId, Tier]]


@app.command()
@report_errors
def plan(
    catalog: Annotated[Path, typer.Option(help="catalog.yaml")],
    fleet: Annotated[Path, typer.Option(help="fleet.yaml")],
    at: Annotated[str, typer.Option(help="start of the plan, ISO 8601 (UTC if no zone)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="where to write plan.json")],
    log: Annotated[Path | None, typer.Option(help=f"{LOG_HELP}; forecast on the spot")] = None,
    forecast: Annotated[
        Path | None, typer.Option(help="forecast Parquet (ts, adapter, mean, q90, ...)")
    ] = None,
    current: Annotated[
        Path | None, typer.Option(help="plan or observed placement in force")
    ] = None,
    time_limit: Annotated[
        float | None,
        typer.Option("--time-limit", help="wall seconds to solve, building included (default 10)"),
    ] = None,
) -> None:
    """Solve where every adapter lives at --at and write the plan."""
    if (log is None) == (forecast is None):
        raise InputError(
            [Problem(source="plan", message="give exactly one of --log or --forecast")]
        )
    moment = parse_at(at)
    settings = Settings()
    parsed_fleet = load_fleet(fleet)
    parsed_catalog = load_catalog(catalog, fleet=parsed_fleet)
    demand = _demand(log, forecast, at=moment, settings=settings, catalog=parsed_catalog)
    placed = read_current(current, parsed_fleet) if current is not None else None
    # --time-limit is wall time for the solve, the problem's building included (the
    # forecast before it is not counted).
    limit_s = settings.planner.time_limit_s if time_limit is None else time_limit
    deadline = Deadline.after(limit_s, clock=time.monotonic)
    problem = build_problem(
        parsed_catalog, parsed_fleet, demand, settings=settings, valid_from=moment, current=placed
    )
    options = options_from(problem, time_limit_s=time_limit)
    solution = solve(problem, options=options, deadline=deadline)
    result = extract_plan(problem, solution, created_at=datetime.now(UTC))
    write_plan(output, result)
    print_review(result, parsed_fleet)
    for note in solution.notes:
        print_labelled(err(), "bold yellow", "warning", note)
    out().print(f"wrote {output} ({result.id})", highlight=False)


def parse_at(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            [Problem(source="--at", message=f"not an ISO 8601 time: {text!r}")]
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _demand(
    log: Path | None,
    forecast: Path | None,
    *,
    at: datetime,
    settings: Settings,
    catalog: Catalog,
) -> dict[AdapterId, Demand]:
    validity_s = settings.planner.validity_s
    if forecast is not None:
        frame = read_forecast(forecast)
        bucket_s = bucket_seconds(frame, default_s=settings.forecast.bucket_s)
        try:
            return demand_from_forecast(frame, at=at, validity_s=validity_s, bucket_s=bucket_s)
        except ForecastError as exc:  # named, as backtest names its log
            raise ForecastError(f"{forecast}: {exc}") from None
    assert log is not None
    bucket_s = settings.forecast.bucket_s
    # The forecasting models (placement.forecast.forecaster), over the plan's validity only.
    request_log = read_log(log)
    if request_log.frame.empty:
        raise InputError([empty_log_problem(log)])
    predicted = forecast_demand(
        request_log.counts(bucket_s),
        at=at,
        horizon_s=validity_s,
        bucket_s=bucket_s,
        timezones=timezones_of(catalog),
        adapters=[str(a.name) for a in catalog.adapters],
    )
    for note in predicted.notes:
        err().print(f"note: {note}", highlight=False)
    return demand_from_forecast(predicted.frame, at=at, validity_s=validity_s, bucket_s=bucket_s)


def read_current(path: Path, fleet: Fleet) -> Current:
    """A plan file, or an observed placement: per pod the hot and warm adapters."""
    text = read_text(path)  # missing, a directory or not UTF-8: one line naming it
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError([Problem(source=str(path), message=f"not valid JSON: {exc}")]) from None
    except RecursionError:
        raise InputError([Problem(source=str(path), message="nested too deeply")]) from None
    if isinstance(raw, dict) and "schema_version" in raw:
        try:
            return plan_from_dict(raw, source=str(path)).placement()
        except PlanError as exc:
            raise plan_input_error(exc, path) from None
    return _observed(raw, source=str(path), known=set(fleet.pod_by_name()))


def _observed(raw: Any, *, source: str, known: set[PodId]) -> Current:
    pods = raw.get("pods") if isinstance(raw, dict) else None
    if not isinstance(pods, dict):
        raise InputError(
            [
                Problem(
                    source=source, message='expected {"pods": {pod: {"hot": [...], "warm": [...]}}}'
                )
            ]
        )
    placed: Current = {}
    problems = []
    for pod, entry in pods.items():
        if pod not in known:
            problems.append(
                Problem(source=source, entry=f"pods.{pod}", message="not a pod of the fleet")
            )
            continue
        if not isinstance(entry, dict):
            problems.append(
                Problem(source=source, entry=f"pods.{pod}", message="expected an object")
            )
            continue
        problems += [  # "wram": [...] was read as no warm adapter, without a word
            Problem(source=source, entry=f"pods.{pod}", field=str(key), message="unknown key")
            for key in entry
            if key not in ("hot", "warm")
        ]
        tiers: dict[AdapterId, Tier] = {}
        for key, tier in (("warm", Tier.WARM), ("hot", Tier.HOT)):
            names = entry.get(key, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                # a string was read letter by letter as adapter names; a number raised
                problems.append(
                    Problem(
                        source=source,
                        entry=f"pods.{pod}",
                        field=key,
                        message="expected a list of adapter names",
                    )
                )
                continue
            tiers.update({AdapterId(name): tier for name in names})
        placed[PodId(pod)] = tiers
    if problems:
        raise InputError(problems)
    return placed


def print_review(result: Plan, fleet: Fleet) -> None:
    """Per pod sets and budgets, per tier counts and traffic, and the solver's line."""
    console = out()
    console.print(_pods_table(result, fleet))
    console.print(_tiers_table(result))
    report = result.solver
    predicted = result.predicted
    console.print(
        f"solver: {report.status}, objective {report.objective:.4g} ms/s, bound "
        f"{report.bound:.4g}, gap {report.gap:.2%}, {report.wall_s:.2f} s; predicted GPU hit "
        f"{predicted.get('gpu_hit_rate', 0.0):.1%}, expected delay "
        f"{predicted.get('expected_delay_ms', 0.0):.3g} ms per request, "
        f"{int(predicted.get('loads', 0))} loads",
        highlight=False,
    )


def _names(names: tuple[AdapterId, ...], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit})" if len(names) > limit else "")


def _pods_table(result: Plan, fleet: Fleet) -> Table:
    table = Table(title=f"plan {result.id}: pods (* pinned)")
    for column in ("pod", "hot", "warm", "slots", "GPU bytes", "host bytes", "rps"):
        table.add_column(column, justify="right" if column in ("slots", "rps") else "left")
    pods = fleet.pod_by_name()
    for pod_id, pod_plan in sorted(result.pods.items()):
        pod = pods[pod_id]
        hot = tuple(AdapterId(f"{a}*") if a in pod_plan.pinned else a for a in pod_plan.hot)
        table.add_row(
            pod_id,
            _names(hot),
            f"{len(pod_plan.warm)}",
            f"{len(pod_plan.hot)}/{pod.max_loras}",
            f"{human_bytes(pod_plan.hbm_bytes_used)}/{human_bytes(pod.hbm_adapter_bytes)}",
            f"{human_bytes(pod_plan.host_bytes_used)}/{human_bytes(pod.host_adapter_bytes)}",
            f"{pod_plan.expected_rps:.3g}",
        )
    return table


def _tiers_table(result: Plan) -> Table:
    table = Table(title="tiers")
    for column in ("tier", "adapters", "traffic share"):
        table.add_column(column)
    shares = {
        Tier.HOT: result.predicted.get("gpu_hit_rate", 0.0),
        Tier.WARM: result.predicted.get("cpu_hit_rate", 0.0),
        Tier.COLD: result.predicted.get("cold_rate", 0.0),
    }
    for tier in Tier:
        count = sum(1 for entry in result.adapters.values() if entry.tier is tier)
        table.add_row(tier.value, str(count), f"{shares[tier]:.1%}")
    return table
