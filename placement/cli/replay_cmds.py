"""``lorafleet replay``: every named policy on the same requests, one row per policy."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer
import yaml
from rich.table import Table

from models.registry import forecaster_named
from placement.cli.app import app, err, out, report_errors
from placement.domain import Catalog, Fleet, Pipelines
from placement.errors import InputError, Problem
from placement.inputs import load_catalog, load_fleet
from placement.inputs.events import check_events, known_names, load_events
from placement.inputs.pipelines import load_pipelines
from placement.inputs.request_log import load_request_log
from placement.settings import Settings
from placement.sim.engine import COLD_LOAD, CPU_HIT, GPU_HIT
from placement.sim.events import EventController, SimEvent, sim_events
from placement.sim.faults import FaultSchedule, parse_inline, parse_yaml, schedule
from placement.sim.replay import AFTER_POD_LOSS_S, ReplayResult, check_policies, run_replay
from placement.sim.routers import PLANNED, POLICIES
from placement.sim.wiring import PLANNERS, replay_planning
from placement.sim.workload import SimWorkload, workload_from_log
from policies.eviction import EvictionPolicy

#: The table's columns: (metric key, header, format).
COLUMNS = (
    ("requests", "requests", "{:,}"),
    ("gpu_hit_rate", "GPU hit", "{:.1%}"),
    ("cpu_hit_rate", "CPU hit", "{:.1%}"),
    ("cold_loads", "cold loads", "{:,}"),
    ("loads", "loads", "{:,}"),
    ("loads_per_pod_s", "loads/pod/s", "{:.4f}"),
    ("loads_per_pod_s_peak", "peak", "{:.3f}"),
    ("residency_p50_s", "resid p50 s", "{:.0f}"),
    ("residency_p95_s", "resid p95 s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50", "{:.0f}"),
    ("ttft_p95_ms", "TTFT p95", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99", "{:.0f}"),
    ("ttft_hit_p95_ms", "hit p95", "{:.0f}"),
    ("ttft_miss_p95_ms", "miss p95", "{:.0f}"),
    ("load_wait_share", "load wait", "{:.1%}"),
    ("throughput_rps", "req/s", "{:.2f}"),
    ("distinct_adapters_per_pod", "adapters/pod", "{:.1f}"),
    ("convoy", "convoy", "{}"),
)
OUTCOME_NAMES = {GPU_HIT: "gpu_hit", CPU_HIT: "cpu_hit", COLD_LOAD: "cold_load"}


def _eviction(name: str) -> EvictionPolicy:
    try:
        return EvictionPolicy(name)
    except ValueError:
        choices = ", ".join(policy.value for policy in EvictionPolicy)
        raise InputError(
            [
                Problem(
                    source="--eviction", message=f"unknown policy {name!r}; choose from {choices}"
                )
            ]
        ) from None


def _check_planning(planner: str, forecast_model: str) -> None:
    problems = []
    if planner not in PLANNERS:
        problems.append(Problem(source="--planner", message=f"choose {' or '.join(PLANNERS)}"))
    try:
        forecaster_named(forecast_model)
    except KeyError as exc:
        problems.append(Problem(source="--forecast-model", message=str(exc.args[0])))
    if problems:
        raise InputError(problems)


def parse_moment(text: str, option: str) -> pd.Timestamp:
    """An option's ISO time with its offset, or one line saying what is wrong."""
    try:
        moment: pd.Timestamp | None = pd.Timestamp(text)
    except ValueError:
        moment = None
    if moment is None or pd.isna(moment) or moment.tzinfo is None:
        raise InputError(
            [
                Problem(
                    source=option,
                    message=f"{text!r} is not an ISO time with an offset"
                    " (for instance 2026-03-12T08:00:00-04:00)",
                )
            ]
        )
    return moment


def figures_window(
    workload: SimWorkload, start: str | None, end: str | None
) -> tuple[float, float] | None:
    """``--from``/``--to`` as replay seconds; None: the whole replay."""
    if start is None and end is None:
        return None
    origin = pd.Timestamp(workload.start)
    lo = (parse_moment(start, "--from") - origin).total_seconds() if start is not None else 0.0
    hi = (parse_moment(end, "--to") - origin).total_seconds() if end is not None else math.inf
    if hi <= lo:
        raise InputError([Problem(source="--to", message="--to must be after --from")])
    if hi < 0.0 or lo > workload.duration_s:
        last = origin + pd.Timedelta(seconds=workload.duration_s)
        raise InputError(
            [
                Problem(
                    source="--from/--to",
                    message=f"the window holds no request: the log runs from"
                    f" {origin.isoformat()} to {last.isoformat()}",
                )
            ]
        )
    return (lo, hi)


def replay_events(
    path: Path,
    workload: SimWorkload,
    *,
    catalog: Catalog,
    fleet: Fleet,
    pipelines: Pipelines | None,
    settings: Settings,
) -> tuple[list[SimEvent], EventController]:
    """The events to deliver and lorafleet's controller for them, the log checked as
    ``lorafleet validate --events`` checks it (``placement.inputs.events``) against the
    catalog's tenants, the pipelines' triggers and logins, and the span of the requests
    replayed: any error stops the replay with one line per problem (warnings too);
    warnings alone are printed, one line each, and the replay goes on without the
    events they name outside the span."""
    origin = pd.Timestamp(workload.start)
    span = pd.Series([origin, origin + pd.Timedelta(seconds=workload.duration_s)])
    known = known_names(catalog=catalog, pipelines=pipelines, requests_ts=span)
    problems = check_events(path, known)
    if any(problem.severity == "error" for problem in problems):
        raise InputError(problems)
    log = load_events(path, known)
    if pipelines is None and (log.frame["kind"] == "pipeline").any():
        problems.append(
            Problem(
                source=str(path),
                field="trigger",
                message="pipeline triggers not checked and not followed: give --pipelines",
                severity="warning",
            )
        )
    for problem in problems:
        err().print(f"[bold yellow]warning[/]: {problem}", highlight=False, markup=True)
    events = sim_events(log, workload, catalog=catalog, pipelines=pipelines or Pipelines())
    controller = EventController.build(
        catalog,
        fleet,
        pipelines or Pipelines(),
        max_loads=settings.controller.max_loads_per_event,
    )
    return events, controller


def fault_schedule(spec: str, workload: SimWorkload, fleet: Fleet) -> FaultSchedule:
    """``--faults``: a YAML file, or an inline spec; the same schedule for every policy."""
    path = Path(spec)
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise InputError([Problem(source=spec, message=f"cannot read: {exc}")]) from None
        parsed = parse_yaml(raw, source=spec)
    else:
        parsed = parse_inline(spec)
    return schedule(parsed, [str(pod.name) for pod in fleet.pods], workload.duration_s)


def _json(result: ReplayResult) -> dict[str, object]:
    payload: dict[str, object] = dict(result.metrics)
    if result.event_figures is not None:
        payload["events"] = {
            **result.event_figures,
            "login_surge_ttft_p95_ms": result.login_surge_ttft_p95_ms,
            "by_kind": result.event_figures_by_kind,
        }
    if result.after_pod_loss is not None:
        payload["after_pod_loss"] = result.after_pod_loss
    if result.by_class:
        payload["by_class"] = result.by_class
        payload["class_warmups"] = result.warmups
    return payload


def _class_lines(result: ReplayResult) -> list[str]:
    """With ``--class-priority``: a line per catalog class (GPU hits, TTFT p95)."""
    return [
        f"{result.policy}: {name}: {figures['requests']:,} requests,"
        f" {figures['gpu_hit_rate']:.2%} GPU hits, TTFT p95 {figures['ttft_p95_ms']:,.0f} ms"
        for name, figures in result.by_class.items()
    ] + ([f"{result.policy}: {result.warmups:,} class warm-ups"] if result.by_class else [])


def _table(results: list[ReplayResult]) -> Table:
    table = Table(title="replay")
    table.add_column("policy", no_wrap=True)
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for result in results:
        cells = [fmt.format(result.metrics.get(key, 0)) for key, _, fmt in COLUMNS]
        table.add_row(f"{result.policy} ({result.eviction.value})", *cells)
    return table


def replayed_frame(workload: SimWorkload, results: list[ReplayResult]) -> pd.DataFrame:
    """The request log of every replay, one row per request and policy."""
    start = pd.Timestamp(workload.start)
    stamps = start + pd.to_timedelta(np.asarray(workload.arrival_s), unit="s")
    frames = []
    for result in results:
        pods = np.asarray((*result.pod_ids, ""), dtype=object)
        frames.append(
            pd.DataFrame(
                {
                    "ts": stamps,
                    "adapter": workload.adapters,
                    "prompt_tokens": workload.prompt_tokens,
                    "output_tokens": workload.output_tokens,
                    "pod": pods[np.asarray(result.log.pod)],
                    "outcome": [OUTCOME_NAMES.get(code, "rejected") for code in result.log.outcome],
                    "ttft_ms": np.round(np.asarray(result.log.ttft_ms), 3),
                    "policy": result.policy,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


@app.command()
@report_errors
def replay(
    catalog: Annotated[Path, typer.Option(help="catalog.yaml")],
    fleet: Annotated[Path, typer.Option(help="fleet.yaml (one pool)")],
    log: Annotated[Path, typer.Option(help="request log (.parquet, .csv, .jsonl)")],
    policy: Annotated[
        list[str], typer.Option(help=f"policy to replay, repeatable: {', '.join(POLICIES)}")
    ],
    eviction: Annotated[
        str,
        typer.Option(
            help="GPU-slot eviction: lru (the engine's, for every policy), or an engine"
            " that would evict otherwise: lfu, tw-lru, chameleon, forecast, belady (the"
            " oracle always uses belady)"
        ),
    ] = "lru",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
    out_log: Annotated[
        Path | None, typer.Option(help="write the replayed request log (Parquet)")
    ] = None,
    plan_interval_s: Annotated[
        float | None, typer.Option(help="lorafleet/oracle replanning interval in seconds")
    ] = None,
    planner: Annotated[
        str,
        typer.Option(help="lorafleet/oracle planner: solver (CP-SAT) or greedy (the solver's)"),
    ] = "solver",
    forecast_model: Annotated[
        str, typer.Option(help="lorafleet's forecaster (a models/ name, as the controller's)")
    ] = "level-profile",
    window_from: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="figures only for requests arriving at or after this ISO time with an"
            " offset (the replay still runs the whole log)",
        ),
    ] = None,
    events_path: Annotated[
        Path | None,
        typer.Option(
            "--events",
            help="event log (ts, kind pipeline|login, trigger, tenant, event_id), delivered"
            " at its times: lorafleet preloads as its controller's webhook does",
        ),
    ] = None,
    pipelines: Annotated[
        Path | None, typer.Option(help="pipelines.yaml: what each trigger and login leads to")
    ] = None,
    faults: Annotated[
        str | None,
        typer.Option(
            help="fault schedule every policy meets: a YAML file, or inline items such as"
            " restart=pod-1@30m,outage=pod-2@1h+15,slow=3@2h+20,seed=7,restarts=2"
        ),
    ] = None,
    window_to: Annotated[
        str | None,
        typer.Option("--to", help="figures only for requests arriving until this ISO time"),
    ] = None,
    class_priority: Annotated[
        bool | None,
        typer.Option(
            "--class-priority/--no-class-priority",
            help="production before experiments (router.class_priority, off by default):"
            " lorafleet weighs a load's victim by its catalog class and sends the warm-ups"
            " that keep a higher class resident; figures per class for every policy",
        ),
    ] = None,
) -> None:
    """Replay a request log on a simulated fleet under every named policy."""
    check_policies(policy)
    chosen_eviction = _eviction(eviction)
    _check_planning(planner, forecast_model)
    settings = Settings()
    if plan_interval_s is not None:
        settings = replace(settings, sim=replace(settings.sim, plan_interval_s=plan_interval_s))
    if class_priority is not None:
        settings = replace(settings, router=replace(settings.router, class_priority=class_priority))
    parsed_fleet = load_fleet(fleet)
    parsed_catalog = load_catalog(catalog, fleet=parsed_fleet)
    workload = workload_from_log(
        load_request_log(log), parsed_catalog, bucket_s=settings.forecast.bucket_s
    )
    window_s = figures_window(workload, window_from, window_to)
    fault_plan = fault_schedule(faults, workload, parsed_fleet) if faults else None
    events: list[SimEvent] = []
    controller = None
    if events_path is not None:
        parsed_pipelines = load_pipelines(pipelines, catalog=parsed_catalog) if pipelines else None
        events, controller = replay_events(
            events_path,
            workload,
            catalog=parsed_catalog,
            fleet=parsed_fleet,
            pipelines=parsed_pipelines,
            settings=settings,
        )
    planning = replay_planning(
        parsed_catalog,
        parsed_fleet,
        settings=settings,
        planner=planner,
        forecast_model=forecast_model,
    )
    if not as_json:
        described = planning.description if set(policy) & set(PLANNED) else "none"
        err().print(f"replaying {len(workload):,} requests; planning: {described}")
        if fault_plan is not None:
            err().print(f"faults: {fault_plan.describe()}")
    results = run_replay(
        workload,
        parsed_fleet,
        policy,
        settings=settings,
        eviction=chosen_eviction,
        planning=planning,
        window_s=window_s,
        events=events,
        controller=controller,
        faults=fault_plan,
    )
    if out_log is not None:
        replayed_frame(workload, results).to_parquet(out_log, index=False)
    if as_json:
        payload = {"policies": {result.policy: _json(result) for result in results}}
        typer.echo(json.dumps(payload, indent=2))
        return
    console = out()
    # Nineteen columns: wider than a default pipe, so never squeeze them into 80.
    console.width = max(console.width, 200)
    console.print(_table(results))
    for result in results:
        for line in _class_lines(result):
            console.print(line, highlight=False, markup=False)
        if result.after_pod_loss is not None:
            lost = result.after_pod_loss
            console.print(
                f"{result.policy}: in the {AFTER_POD_LOSS_S / 60:.0f} min after each of"
                f" {lost['pod_losses']} pod losses, {lost['requests']:,} requests:"
                f" {lost['served_share']:.1%} served, {lost['gpu_hit_rate']:.1%} GPU hits,"
                f" {lost['cold_loads_on_critical_path']:,} cold loads on the critical path,"
                f" TTFT p95 {lost['ttft_p95_ms']:,.0f} ms"
            )
