"""``lorafleet replay``: every named policy on the same requests, one row per policy."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from models.registry import forecaster_named
from placement.cli.app import app, err, print_labelled, report_errors
from placement.cli.replay_output import print_results, replayed_frame, result_json
from placement.cli.request_logs import LOG_HELP, read_log
from placement.domain import Catalog, Fleet, Pipelines
from placement.errors import InputError, Problem
from placement.inputs import load_catalog, load_fleet
from placement.inputs.events import check_events, known_names, load_events
from placement.inputs.fields import read_yaml
from placement.inputs.pipelines import load_pipelines
from placement.settings import LOAD_ADMISSIONS, Settings
from placement.sim.events import EventController, SimEvent, sim_events
from placement.sim.faults import FaultSchedule, parse_inline, parse_yaml, schedule
from placement.sim.replay import check_policies, run_replay
from placement.sim.routers import PLANNED, POLICIES, ClassedPlanning
from placement.sim.wiring import PLANNERS, replay_planning
from placement.sim.workload import SimWorkload, workload_from_log
from policies.eviction import EvictionPolicy


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
        print_labelled(err(), "bold yellow", "warning", problem)
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
        # the strict reader of every YAML file people write: not UTF-8 (a traceback with
        # yaml.safe_load(path.read_text())), a key given twice, aliases: one line each
        parsed = parse_yaml(read_yaml(path), source=spec)
    else:
        parsed = parse_inline(spec)
    return schedule(parsed, [str(pod.name) for pod in fleet.pods], workload.duration_s)


def with_load_admission(settings: Settings, load_admission: str | None) -> Settings:
    """``settings`` with ``--load-admission`` over ``sim.load_admission`` (None: as it
    is); an unknown admission is an InputError naming the choices. The replay and
    capacity commands share it."""
    if load_admission is None:
        return settings
    if load_admission not in LOAD_ADMISSIONS:
        raise InputError(
            [
                Problem(
                    source="--load-admission",
                    message=f"unknown admission {load_admission!r}; choose"
                    f" {' or '.join(LOAD_ADMISSIONS)}",
                )
            ]
        )
    admission = next(choice for choice in LOAD_ADMISSIONS if choice == load_admission)
    return replace(settings, sim=replace(settings.sim, load_admission=admission))


def _replay_settings(
    *, plan_interval_s: float | None, class_priority: bool | None, load_admission: str | None
) -> Settings:
    """The settings tree with ``--plan-interval-s``, ``--class-priority`` and
    ``--load-admission`` over it."""
    settings = with_load_admission(Settings(), load_admission)
    if plan_interval_s is not None:
        settings = replace(settings, sim=replace(settings.sim, plan_interval_s=plan_interval_s))
    if class_priority is not None:
        settings = replace(settings, router=replace(settings.router, class_priority=class_priority))
    return settings


def _delivered_events(
    events_path: Path | None,
    pipelines: Path | None,
    workload: SimWorkload,
    *,
    catalog: Catalog,
    fleet: Fleet,
    settings: Settings,
) -> tuple[list[SimEvent], EventController | None]:
    """``--events`` (with ``--pipelines``, read only then) and lorafleet's controller
    for them; none without ``--events``."""
    if events_path is None:
        return [], None
    parsed_pipelines = load_pipelines(pipelines, catalog=catalog) if pipelines else None
    return replay_events(
        events_path,
        workload,
        catalog=catalog,
        fleet=fleet,
        pipelines=parsed_pipelines,
        settings=settings,
    )


def _say_replaying(
    workload: SimWorkload,
    policies: list[str],
    *,
    planning: ClassedPlanning,
    faults: FaultSchedule | None,
) -> None:
    described = planning.description if set(policies) & set(PLANNED) else "none"
    err().print(f"replaying {len(workload):,} requests; planning: {described}")
    if faults is not None:
        err().print(f"faults: {faults.describe()}")


# Past 80 lines for its option declarations alone (each flag's name, default and help
# in one place, as ``--help`` shows them); the body is a few named calls.
@app.command()
@report_errors
def replay(
    catalog: Annotated[Path, typer.Option(help="catalog.yaml")],
    fleet: Annotated[Path, typer.Option(help="fleet.yaml (one pool)")],
    log: Annotated[Path, typer.Option(help=LOG_HELP)],
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
    load_admission: Annotated[
        str | None,
        typer.Option(
            help="how a pod admits around a load (sim.load_admission): drain (the default:"
            " the load drains the batch, nothing is admitted until it lands) or vllm"
            " (vLLM's scheduler: no drain, a request whose adapter can get no GPU slot"
            " waits while those on resident adapters run, the load stalls the batch)"
        ),
    ] = None,
) -> None:
    """Replay a request log on a simulated fleet under every named policy."""
    check_policies(policy)
    chosen_eviction = _eviction(eviction)
    _check_planning(planner, forecast_model)
    settings = _replay_settings(
        plan_interval_s=plan_interval_s,
        class_priority=class_priority,
        load_admission=load_admission,
    )
    parsed_fleet = load_fleet(fleet)
    parsed_catalog = load_catalog(catalog, fleet=parsed_fleet)
    workload = workload_from_log(read_log(log), parsed_catalog, bucket_s=settings.forecast.bucket_s)
    window_s = figures_window(workload, window_from, window_to)
    fault_plan = fault_schedule(faults, workload, parsed_fleet) if faults else None
    events, controller = _delivered_events(
        events_path,
        pipelines,
        workload,
        catalog=parsed_catalog,
        fleet=parsed_fleet,
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
        _say_replaying(workload, policy, planning=planning, faults=fault_plan)
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
        payload = {"policies": {result.policy: result_json(result) for result in results}}
        typer.echo(json.dumps(payload, indent=2))
        return
    print_results(results)
