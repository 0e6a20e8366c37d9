"""Every scenario against its claim: one table of policies, figures and the claims.

For each scenario in ``data/`` (code-assistant, legal-research, saas-50, war-story) and
ServeGen m-mid as ``bench/replay_servegen.py`` builds it, replays round-robin, EPP,
llm-d, bounded, lorafleet and the oracle as ``lorafleet replay`` does by default (its
settings, its CP-SAT planning, and the scenario's ``events.parquet`` with its
``pipelines.yaml`` where it has one, as ``--events``/``--pipelines`` deliver them), and
prints one row per scenario and policy: GPU hits, loads, loads/pod/s, TTFT p50/p95,
the figure the llm-d article's claim about that workload is about, the claim, and
whether it holds. A claim holds when the figure is within 30% of it ("about"), at
most 30% above it ("at most"), or at least it ("at least": a hit rate); a count of
pods must hold exactly.

Then the war story's two fixes (``war_story_windows``: 8 slots per pod; the top 10
production adapters pinned) as what-if runs of EPP and lorafleet, beside the unfixed
runs, in Thursday's windows 08:00-10:15 and 14:30-15:30 (EDT).

After the main table, issue 17's targets for lorafleet (``scenario_claims``): the share
of the gap from the best reactive policy to the oracle it closes, in loads and TTFT p95,
its GPU hits below the oracle's, and the event targets.

Runs are spread over ``--jobs`` processes; each loads a scenario once.

    .venv/bin/python bench/scenario_table.py [--scenario NAME ...] [--policy NAME ...]
        [--no-fixes] [--jobs 2] [--markdown] [--rows FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from placement.cli.replay_cmds import replay_events, with_load_admission
from placement.domain import Catalog, Fleet, Pipelines
from placement.inputs import load_catalog, load_fleet
from placement.inputs.pipelines import load_pipelines
from placement.inputs.request_log import load_request_log
from placement.settings import LOAD_ADMISSIONS, Settings
from placement.sim.engine import GPU_HIT, REJECTED, FleetReplay
from placement.sim.events import EventController, SimEvent
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.routers import PLANNED
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload, workload_from_log

if not __package__:  # run as a file (python bench/<name>.py): the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import war_story_windows as ws
from bench.scenario_claims import POLICIES, SERVEGEN, WAR_STORY, Check, Row, judge
from bench.scenario_render import BEFORE, CASCADE, FIXED_POLICIES, FIXES, SCENARIOS, table

DATA = Path("data")
#: What the tests and other scripts use through this module.
__all__ = ["Check", "Row", "judge", "main", "run_all", "table", "tasks_for"]


# --- the inputs ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """One scenario as ``lorafleet replay`` reads it."""

    directory: Path | None
    workload: SimWorkload
    catalog: Catalog
    fleet: Fleet
    events: tuple[SimEvent, ...] = ()
    controller: EventController | None = None


def read_scenario(directory: Path, settings: Settings) -> Inputs:
    """A scenario folder: fleet, catalog, request log and, where present, events."""
    fleet = load_fleet(directory / "fleet.yaml")
    catalog = load_catalog(directory / "catalog.yaml", fleet=fleet)
    log = load_request_log(directory / "requests.parquet")
    workload = workload_from_log(log, catalog, bucket_s=settings.forecast.bucket_s)
    events_path = directory / "events.parquet"
    if not events_path.exists():
        return Inputs(directory=directory, workload=workload, catalog=catalog, fleet=fleet)
    pipelines_path = directory / "pipelines.yaml"
    pipelines = (
        load_pipelines(pipelines_path, catalog=catalog) if pipelines_path.exists() else Pipelines()
    )
    events, controller = replay_events(
        events_path, workload, catalog=catalog, fleet=fleet, pipelines=pipelines, settings=settings
    )
    return Inputs(
        directory=directory,
        workload=workload,
        catalog=catalog,
        fleet=fleet,
        events=tuple(events),
        controller=controller,
    )


@functools.lru_cache(maxsize=2)
def scenario_inputs(name: str, data: Path) -> Inputs:
    """Two scenarios at most per process: the war story's log is 6.3 M requests."""
    if name == SERVEGEN:
        from bench.replay_servegen import build  # reads ../shared/traces

        workload, catalog, fleet = build(2, 4.0, 0)
        return Inputs(directory=None, workload=workload, catalog=catalog, fleet=fleet)
    return read_scenario(data / name, Settings())


# --- one run ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Task:
    scenario: str
    policy: str
    fix: str = ""
    #: ``SimSettings.load_admission``: "drain" (the default) or vLLM's "vllm".
    admission: str = "drain"


def variant(
    inputs: Inputs, fix: str, settings: Settings, workdir: Path
) -> tuple[Fleet, Catalog, Settings, type[FleetReplay]]:
    """The fleet, catalog, settings and replay of a fix ("": the scenario as it is)."""
    if fix == "":
        return inputs.fleet, inputs.catalog, settings, FleetReplay
    if fix == "8 slots":
        fleet, tuned = ws.eight_slots(inputs.fleet, settings)
        return fleet, inputs.catalog, tuned, FleetReplay
    assert fix == "top 10 pinned" and inputs.directory is not None
    top = ws.top_production(inputs.workload, before=ws.thursday("00:00"))
    pins = ws.pin_plan(top, [str(pod.name) for pod in inputs.fleet.pods])
    path = ws.pinned_catalog(inputs.directory / "catalog.yaml", pins, workdir)
    catalog = load_catalog(path, fleet=inputs.fleet)
    return inputs.fleet, catalog, settings, ws.pinned_replay(pins)


def run_task(task: Task, data: Path = DATA) -> Row:
    inputs = scenario_inputs(task.scenario, data)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        fleet, catalog, settings, replay_type = variant(
            inputs, task.fix, with_load_admission(Settings(), task.admission), Path(workdir)
        )
    planning = (
        replay_planning(catalog, fleet, settings=settings) if task.policy in PLANNED else None
    )
    result = run_policy(
        task.policy,
        inputs.workload,
        fleet,
        settings=settings,
        planning=planning,
        replay_type=replay_type,
        events=inputs.events,
        controller=inputs.controller,
    )
    figures = scenario_figures(task, inputs.workload, result, settings)
    return Row(
        scenario=task.scenario,
        policy=task.policy,
        fix=task.fix,
        admission=task.admission,
        metrics=flat(result.metrics),
        events=flat(result.event_figures or {}),
        figures=figures,
        wall_s=time.perf_counter() - began,
    )


def flat(figures: Mapping[str, object], prefix: str = "") -> dict[str, float]:
    """Numbers of a figures mapping, nested ones (per kind, per tenant) as ``a.b`` keys."""
    out: dict[str, float] = {}
    for key, value in figures.items():
        if isinstance(value, Mapping):
            out.update(flat(value, f"{prefix}{key}."))
        elif isinstance(value, int | float):
            out[f"{prefix}{key}"] = float(value)
    return out


def top_traffic(
    workload: SimWorkload, result: ReplayResult, *, count: int = 10
) -> dict[str, float]:
    """The ``count`` busiest adapters: their share of requests, of GPU hits among them,
    and how few pods carry 90% of their served requests."""
    adapters = np.asarray(workload.adapters)
    names, counts = np.unique(adapters, return_counts=True)
    top = names[np.argsort(-counts, kind="stable")[:count]]
    mine = np.isin(adapters, top)
    outcome = np.asarray(result.log.outcome)[mine]
    served = outcome != REJECTED
    pods = np.asarray(result.log.pod)[mine][served]
    per_pod = np.sort(np.bincount(pods, minlength=len(result.pod_ids)))[::-1]
    carry = int(np.searchsorted(np.cumsum(per_pod), 0.9 * per_pod.sum()) + 1)
    return {
        "top10_share": float(mine.mean()),
        "top10_hit": float(np.mean(outcome[served] == GPU_HIT)) if served.any() else 0.0,
        "top10_pods": float(carry),
    }


def scenario_figures(
    task: Task, workload: SimWorkload, result: ReplayResult, settings: Settings
) -> dict[str, float]:
    figures = {"miss_share": 1.0 - float(result.metrics["gpu_hit_rate"])}
    if task.scenario == "saas-50":
        figures.update(top_traffic(workload, result))
    if task.scenario == WAR_STORY:
        pods = len(result.pod_ids)
        figures.update(
            ws.article_figures(
                workload,
                result.log,
                pods=pods,
                prefill_ms_per_token=settings.sim.prefill_ms_per_token,
            )
        )
        for window in ws.article_windows():
            if window.name in (BEFORE, CASCADE):
                start_s, end_s = ws.window_seconds(workload, window)
                seen = ws.request_window(
                    workload, result.log, pods=pods, start_s=start_s, end_s=end_s
                )
                figures.update({f"{window.name}|{key}": value for key, value in seen.items()})
    return figures


# --- the run ------------------------------------------------------------------------


def tasks_for(
    scenarios: Sequence[str],
    policies: Sequence[str] = POLICIES,
    *,
    fixes: bool = True,
    admission: str = "drain",
) -> list[Task]:
    """Every run, in the order they are worth having when a busy machine cannot finish:
    the small scenarios, EPP on the war story with its fixes, saas-50, lorafleet on the
    war story with its fixes, ServeGen, then the war story's other policies."""
    tasks = [
        Task(scenario=name, policy=policy, admission=admission)
        for name in scenarios
        for policy in policies
    ]
    if WAR_STORY in scenarios and fixes:
        tasks += [
            Task(scenario=WAR_STORY, policy=p, fix=fix, admission=admission)
            for p in FIXED_POLICIES
            if p in policies
            for fix in FIXES
        ]

    def rank(task: Task) -> tuple[int, int]:
        if task.scenario == WAR_STORY:
            stage = 2 if task.policy == "epp" else 4 if task.policy == "lorafleet" else 6
        else:
            stage = {"legal-research": 0, "code-assistant": 1, "saas-50": 3, SERVEGEN: 5}[
                task.scenario
            ]
        return stage, POLICIES.index(task.policy)

    return sorted(tasks, key=rank)


def run_all(
    tasks: Sequence[Task], *, data: Path, jobs: int, rows_path: Path | None = None
) -> list[Row]:
    """The runs, in ``jobs`` processes (1: here); rows come back in task order. With
    ``rows_path`` each row is appended there as it comes (JSON lines), and the tasks
    already there are not run again: a long run that stops can go on."""
    done = read_rows(rows_path) if rows_path is not None and rows_path.exists() else []
    have = {(row.scenario, row.policy, row.fix, row.admission): row for row in done}
    todo = [task for task in tasks if _key(task) not in have]
    task_run: Callable[[Task], Row] = functools.partial(run_task, data=data)
    if jobs <= 1:
        fresh = [_noted(task_run(task), rows_path) for task in todo]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            fresh = [_noted(row, rows_path) for row in pool.map(task_run, todo)]
    have.update({(row.scenario, row.policy, row.fix, row.admission): row for row in fresh})
    return [have[_key(task)] for task in tasks]


def _key(task: Task) -> tuple[str, str, str, str]:
    return task.scenario, task.policy, task.fix, task.admission


def _noted(row: Row, rows_path: Path | None) -> Row:
    fix = f" ({row.fix})" if row.fix else ""
    print(f"  {row.scenario} {row.policy}{fix}: {row.wall_s:.0f} s", file=sys.stderr)
    if rows_path is not None:
        with rows_path.open("a") as rows_file:
            rows_file.write(json.dumps(asdict(row)) + "\n")
    return row


def read_rows(path: Path) -> list[Row]:
    return [Row(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, default=None)
    parser.add_argument(
        "--policy", action="append", choices=POLICIES, default=None, help="default: all six"
    )
    parser.add_argument("--no-fixes", action="store_true", help="skip the war story's fixes")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--load-admission",
        choices=LOAD_ADMISSIONS,
        default="drain",
        help="the replay's pods: drain the batch for a load (default) or admit as vLLM does",
    )
    parser.add_argument(
        "--rows", type=Path, default=None, help="JSON lines of finished runs: kept, and resumed"
    )
    args = parser.parse_args(argv)
    scenarios = args.scenario or list(SCENARIOS)
    kept = len(read_rows(args.rows)) if args.rows is not None and args.rows.exists() else 0
    began = time.perf_counter()
    tasks = tasks_for(
        scenarios, args.policy or POLICIES, fixes=not args.no_fixes, admission=args.load_admission
    )
    rows = run_all(tasks, data=args.data, jobs=args.jobs, rows_path=args.rows)
    print(table(rows, markdown=args.markdown))
    wall_s = time.perf_counter() - began
    ran = f"{len(rows)} runs" + (f" ({kept} read from {args.rows})" if kept else "")
    print(f"\n{ran} in {wall_s:.0f} s wall time ({args.jobs} jobs)")


if __name__ == "__main__":
    main()
