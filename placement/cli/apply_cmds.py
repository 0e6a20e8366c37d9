"""``lorafleet apply``: push a plan to the pods, showing the actions as a diff per pod.

Reads the inputs once (``placement.inputs``), observes the pods, reconciles, prints
the diff; without ``--dry-run`` runs the actions with a progress bar and exits 1 with
the reason per pod when any action failed or any pod could not be reached.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from placement.actuation.apply import Observation, lora_paths, make_clients, plan_actions
from placement.actuation.executor import ActionResult, ApplyReport, Executor, Ledger
from placement.actuation.reconcile import ActionSchedule
from placement.adapters.http_engine import engine_http_client
from placement.cli.app import EXIT_FAILED, app, err, out, report_errors
from placement.cli.plan_files import read_plan_file
from placement.domain import Action, ActionKind, Catalog, Fleet, PodId
from placement.errors import InputError, Problem
from placement.inputs import load_catalog, load_fleet
from placement.inputs.files import read_text, write_atomically
from placement.plan import Plan
from placement.settings import ExecutorSettings

_MARKS = {ActionKind.LOAD: "+", ActionKind.UNLOAD: "-", ActionKind.WARMUP: "~"}


def _check_refs(plan: Plan, fleet: Fleet, catalog: Catalog, *, source: str) -> None:
    pods, names = set(fleet.pod_by_name()), catalog.names()
    problems = [
        Problem(source=source, entry=f"pods.{pod}", message=f"pod {pod!r} is not in the fleet")
        for pod in sorted(set(plan.pods) - pods)
    ]
    for pod_id, pod_plan in sorted(plan.pods.items()):
        for adapter in sorted(set(pod_plan.registered + pod_plan.pinned) - names):
            problems.append(
                Problem(
                    source=source,
                    entry=f"pods.{pod_id}",
                    message=f"adapter {adapter!r} is not in the catalog",
                )
            )
    if problems:
        raise InputError(problems)


def _print_diff(console: Console, steps: ActionSchedule, observation: Observation) -> None:
    by_pod: dict[PodId, list[Action]] = {}
    for action in steps.actions:
        by_pod.setdefault(action.pod, []).append(action)
    left_out: dict[PodId, list[str]] = {}
    for pod, adapter, why in steps.left_out:
        left_out.setdefault(pod, []).append(f"  ! {adapter} left out: {why}")
    for pod in sorted(set(observation.states) | set(observation.unreachable)):
        if pod in observation.unreachable:
            console.print(f"{pod}: unreachable ({observation.unreachable[pod]})", markup=False)
            continue
        if pod not in by_pod:
            console.print(f"{pod}: no change", markup=False)
        else:
            console.print(f"{pod}:", markup=False)
        for action in by_pod.get(pod, ()):
            mark = _MARKS[action.kind]
            line = f"  {mark} {action.kind.value} {action.adapter}  ({action.reason})"
            console.print(line, markup=False, highlight=False)
        for line in left_out.get(pod, ()):
            console.print(line, markup=False, highlight=False)


def _print_outcome(report: ApplyReport, observation: Observation) -> bool:
    """Summary per pod on stdout, failures on stderr; True when all went well."""
    console, problems = out(), err()
    for pod, pod_report in report.per_pod().items():
        console.print(
            f"{pod}: {len(pod_report.done)} done, {len(pod_report.skipped)} skipped, "
            f"{len(pod_report.failed)} failed",
            markup=False,
        )
        for failure in pod_report.failed:
            kind = "permanent" if failure.permanent else "gave up"
            problems.print(
                f"error: {pod}: {failure.action.kind.value} {failure.action.adapter} "
                f"failed ({kind}, {failure.attempts} attempts): {failure.detail}",
                markup=False,
                highlight=False,
            )
    for pod, why in sorted(observation.unreachable.items()):
        problems.print(f"error: {pod}: unreachable: {why}", markup=False, highlight=False)
    return report.ok and not observation.unreachable


def _read_ledger(path: Path | None) -> Ledger | None:
    if path is None:
        return None
    if not path.exists():
        return Ledger()
    text = read_text(path)  # not UTF-8 (a traceback) or a directory: one line naming it
    try:
        return Ledger.from_dict(json.loads(text))
    except (ValueError, AttributeError, TypeError, RecursionError) as exc:
        raise InputError([Problem(source=str(path), message=f"not a ledger: {exc}")]) from None


async def _run(
    plan: Plan,
    *,
    fleet: Fleet,
    catalog: Catalog,
    settings: ExecutorSettings,
    ledger: Ledger | None,
    dry_run: bool,
    timeout_s: float,
    seed: int,
) -> bool:
    async with engine_http_client(max_connections=max(8, settings.max_concurrency * 2)) as http:
        clients = make_clients(fleet, http=http, timeout_s=timeout_s)
        rng = random.Random(seed)  # the listing's retries and the actions' share it
        observation, steps = await plan_actions(
            plan,
            fleet=fleet,
            clients=clients,
            catalog=catalog,
            ledger=ledger,
            settings=settings,
            rng=rng,
        )
        _print_diff(out(), steps, observation)
        if dry_run or not steps.actions:
            return _print_outcome(ApplyReport(results=()), observation)
        with Progress(
            TextColumn("applying"), BarColumn(), MofNCompleteColumn(), console=err()
        ) as progress:
            task = progress.add_task("apply", total=len(steps.actions))

            def advance(_: ActionResult) -> None:
                progress.advance(task)

            executor = Executor(
                clients,
                lora_paths=lora_paths(catalog),
                settings=settings,
                rng=rng,
                ledger=ledger,
                on_result=advance,
            )
            report = await executor.run(steps.actions, after=steps.after)
    return _print_outcome(report, observation)


@app.command()
@report_errors
def apply(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="The plan JSON to apply.")],
    fleet_path: Annotated[Path, typer.Option("--fleet", help="fleet.yaml")],
    catalog_path: Annotated[Path, typer.Option("--catalog", help="catalog.yaml")],
    dry_run: Annotated[bool, typer.Option(help="Show the actions; change nothing.")] = False,
    ledger_path: Annotated[
        Path | None,
        typer.Option("--ledger", help="JSON file remembering warm-ups and pins between runs."),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, help="Calls in flight, fleet-wide; default: executor.max_concurrency."),
    ] = None,
    deadline_s: Annotated[
        float | None,
        typer.Option(help="Deadline per action, with retries; default: per_action_deadline_s."),
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Timeout of one HTTP call.")] = 30.0,
    max_attempts: Annotated[
        int | None, typer.Option(min=1, help="Tries per action; default: executor.max_attempts.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the backoff jitter.")] = 0,
) -> None:
    """Load, unload and warm adapters on the pods until they hold the plan."""
    plan = read_plan_file(plan_path)
    fleet = load_fleet(fleet_path)
    catalog = load_catalog(catalog_path, fleet=fleet)
    _check_refs(plan, fleet, catalog, source=str(plan_path))
    ledger = _read_ledger(ledger_path)
    # An option given overrides the settings tree; one left out keeps its default.
    given: dict[str, Any] = {
        "max_concurrency": concurrency,
        "per_action_deadline_s": deadline_s,
        "max_attempts": max_attempts,
    }
    settings = replace(
        ExecutorSettings(), **{name: value for name, value in given.items() if value is not None}
    )
    ok = asyncio.run(
        _run(
            plan,
            fleet=fleet,
            catalog=catalog,
            settings=settings,
            ledger=ledger,
            dry_run=dry_run,
            timeout_s=timeout_s,
            seed=seed,
        )
    )
    if ledger_path is not None and ledger is not None and not dry_run:
        # atomically: a crash half-way left a torn ledger that the next apply refused
        write_atomically(ledger_path, json.dumps(ledger.to_dict(), indent=2) + "\n")
    if not ok:
        raise typer.Exit(EXIT_FAILED)
