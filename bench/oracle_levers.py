"""Where the gap between lorafleet and the oracle is: the hybrids between them, one
lever at a time, on one scenario.

lorafleet and the oracle differ in three levers, each named by one letter of a variant
``PLAN-ENGINE-ESTIMATE``:

- plan: ``F`` lorafleet's forecast plan (events heard, as ``lorafleet replay``);
  ``T`` the oracle's, from the true future demand (the bound planner, no events);
- engine eviction: ``L`` vLLM's LRU; ``B`` Belady's, keeping the plan's hot set (the
  oracle's engine; its plan's whole hot set is preloaded); ``W`` vLLM's LRU with the
  router warming up the idle adapters ahead of the one used furthest in the future
  (the truth), so that the LRU evicts Belady's victim; ``E`` the same, ahead of the idle
  adapter lorafleet's own victim worth values least, when the LRU victim is worth more
  by ``--warm-margin-s`` plus a batch place per warm-up; ``R`` as ``E``, its rate the
  last minute's;
- victim estimate, the wait a load's victim worth reads: ``i`` its idle time on the
  pod, over lorafleet's ``RouterSettings.victim_horizon_s``; ``n`` its true next use,
  over the oracle's own ``SimSettings.oracle_victim_horizon_s`` (``--oracle-horizon-s``
  sets it, to compare horizons).

``F-L-i`` is ``lorafleet`` and ``T-B-n`` the ``oracle`` of ``lorafleet replay`` (the same
code, figures identical); ``bounded`` runs bounded affinity. Each variant prints GPU
hits, loads, TTFT p95, warm-ups, the share of the lorafleet-to-oracle loads gap it
closes and its wall time. The levers are ``placement.sim.replay.Levers``.

    .venv/bin/python bench/oracle_levers.py --scenario legal-research --planner greedy
    .venv/bin/python bench/oracle_levers.py --scenario war-story --no-events \\
        --from 2026-03-12T09:00:00-04:00 --to 2026-03-12T13:00:00-04:00 --planner greedy
    .venv/bin/python bench/oracle_levers.py --servegen --planner greedy   # m-mid
    .venv/bin/python bench/oracle_levers.py --catalog C --fleet F --log L [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd

from placement.cli.replay_cmds import replay_events
from placement.domain import Catalog, Fleet, Pipelines
from placement.errors import InputError, LorafleetError, Problem
from placement.inputs import load_catalog, load_fleet
from placement.inputs.pipelines import load_pipelines
from placement.inputs.request_log import load_request_log
from placement.settings import Settings
from placement.sim.events import EventController, SimEvent
from placement.sim.eviction_choice import VictimWait
from placement.sim.replay import Levers, run_policy
from placement.sim.routers import ClassedPlanning
from placement.sim.wiring import PLANNERS, replay_planning
from placement.sim.workload import SimWorkload, workload_from_log
from policies.eviction import EvictionPolicy

DATA = Path(__file__).resolve().parents[1] / "data"
LORAFLEET, ORACLE, BOUNDED = "F-L-i", "T-B-n", "bounded"
#: The finder's table (docs/benchmarks.md, "Where the gap to the oracle is").
DEFAULT_VARIANTS = (BOUNDED, LORAFLEET, ORACLE, "T-L-i", "F-L-n", "F-W-i", "T-B-i")
_ENGINES = {
    "L": EvictionPolicy.LRU,
    "B": EvictionPolicy.BELADY,
    "W": EvictionPolicy.LRU,
    "E": EvictionPolicy.LRU,
    "R": EvictionPolicy.LRU,
}
#: The engines whose warm-ups follow lorafleet's own estimate (``Levers.warm_by_estimate``).
_ESTIMATES = {"E": "worth", "R": "recent"}
_WAITS = {"i": VictimWait.IDLE, "n": VictimWait.NEXT_USE}


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """What one replay reads: the requests, and the events lorafleet hears."""

    workload: SimWorkload
    catalog: Catalog
    fleet: Fleet
    events: tuple[SimEvent, ...] = ()
    controller: EventController | None = None


@dataclass(frozen=True, kw_only=True)
class Figures:
    variant: str
    gpu_hit_rate: float
    loads: int
    ttft_p95_ms: float
    warmups: int
    #: Of lorafleet's loads above the oracle's, the share this variant saves (None
    #: without both, or with no gap).
    closed: float | None
    wall_s: float


def levers(variant: str, *, warm_margin_s: float = 0.0) -> Levers:
    """``PLAN-ENGINE-ESTIMATE`` (``F-W-i``) as ``Levers``; a clear error otherwise."""
    parts = variant.split("-")
    if (
        len(parts) != 3
        or parts[0] not in ("F", "T")
        or parts[1] not in _ENGINES
        or parts[2] not in _WAITS
    ):
        raise InputError(
            [
                Problem(
                    source="--variant",
                    message=f"{variant!r} is not PLAN-ENGINE-ESTIMATE: plan F or T, "
                    "engine L, B, W, E or R, estimate i or n (like F-L-i), nor 'bounded'",
                )
            ]
        )
    plan, engine, wait = parts
    return Levers(
        true_plan=plan == "T",
        eviction=_ENGINES[engine],
        victim_wait=_WAITS[wait],
        warm_to_true_victim=engine == "W",
        warm_by_estimate=_ESTIMATES.get(engine),
        warm_margin_s=warm_margin_s,
    )


def run_variants(
    scenario: Scenario,
    variants: Sequence[str],
    *,
    settings: Settings,
    planning: ClassedPlanning,
    warm_margin_s: float = 0.0,
) -> list[Figures]:
    """Each variant on a fresh fleet with the same requests and events, in the order
    given; the share closed is of the gap between ``F-L-i`` and ``T-B-n`` when both ran."""
    for variant in variants:
        if variant != BOUNDED:
            levers(variant)  # every name checked before the first replay
    runs: list[tuple[str, dict[str, float], int, float]] = []
    for variant in variants:
        started = time.perf_counter()
        result = run_policy(
            "bounded" if variant == BOUNDED else "lorafleet",
            scenario.workload,
            scenario.fleet,
            settings=settings,
            planning=planning,
            events=scenario.events,
            controller=scenario.controller,
            levers=None if variant == BOUNDED else levers(variant, warm_margin_s=warm_margin_s),
        )
        metrics = {
            key: float(result.metrics[key]) for key in ("gpu_hit_rate", "loads", "ttft_p95_ms")
        }
        runs.append((variant, metrics, result.warmups, time.perf_counter() - started))
    loads = {variant: metrics["loads"] for variant, metrics, _, _ in runs}
    gap = loads[LORAFLEET] - loads[ORACLE] if LORAFLEET in loads and ORACLE in loads else 0.0
    return [
        Figures(
            variant=variant,
            gpu_hit_rate=metrics["gpu_hit_rate"],
            loads=int(metrics["loads"]),
            ttft_p95_ms=metrics["ttft_p95_ms"],
            warmups=warmups,
            closed=(loads[LORAFLEET] - metrics["loads"]) / gap if gap else None,
            wall_s=wall_s,
        )
        for variant, metrics, warmups, wall_s in runs
    ]


# --- the inputs ---------------------------------------------------------------------


def _cut(path: Path, window: tuple[pd.Timestamp, pd.Timestamp], into: Path) -> Path:
    """The rows of parquet ``path`` with ``ts`` in [from, to), written under ``into``."""
    inside = [("ts", ">=", window[0]), ("ts", "<", window[1])]
    target = into / path.name
    pd.read_parquet(path, filters=inside).to_parquet(target, index=False)
    return target


def read_scenario(
    *,
    catalog_path: Path,
    fleet_path: Path,
    log_path: Path,
    events_path: Path | None,
    pipelines_path: Path | None,
    window: tuple[pd.Timestamp, pd.Timestamp] | None,
    settings: Settings,
) -> Scenario:
    """A scenario as ``lorafleet replay`` reads it, its log and events cut to
    ``window`` (the requests replayed and the figures are the window's)."""
    fleet = load_fleet(fleet_path)
    catalog = load_catalog(catalog_path, fleet=fleet)
    with tempfile.TemporaryDirectory() as scratch:
        if window is not None:
            log_path = _cut(log_path, window, Path(scratch))
            if events_path is not None:
                events_path = _cut(events_path, window, Path(scratch))
        log = load_request_log(log_path)
        workload = workload_from_log(log, catalog, bucket_s=settings.forecast.bucket_s)
        if events_path is None:
            return Scenario(workload=workload, catalog=catalog, fleet=fleet)
        pipelines = (
            load_pipelines(pipelines_path, catalog=catalog) if pipelines_path else Pipelines()
        )
        events, controller = replay_events(
            events_path,
            workload,
            catalog=catalog,
            fleet=fleet,
            pipelines=pipelines,
            settings=settings,
        )
    return Scenario(
        workload=workload,
        catalog=catalog,
        fleet=fleet,
        events=tuple(events),
        controller=controller,
    )


def _scenario(args: argparse.Namespace, settings: Settings) -> Scenario:
    if args.servegen:
        from bench.replay_servegen import build  # reads ../shared/traces

        workload, catalog, fleet = build(2, 4.0, 0)  # ServeGen m-mid
        return Scenario(workload=workload, catalog=catalog, fleet=fleet)
    if args.scenario:
        folder = DATA / args.scenario
        if not folder.is_dir():
            names = ", ".join(sorted(p.name for p in DATA.iterdir() if p.is_dir()))
            raise InputError(
                [Problem(source="--scenario", message=f"no data/{args.scenario}; have: {names}")]
            )
        events = folder / "events.parquet"
        pipelines = folder / "pipelines.yaml"
        paths = (folder / "catalog.yaml", folder / "fleet.yaml", folder / "requests.parquet")
        found = (events if events.exists() else None, pipelines if pipelines.exists() else None)
    elif args.catalog and args.fleet and args.log:
        paths = (Path(args.catalog), Path(args.fleet), Path(args.log))
        found = (
            Path(args.events) if args.events else None,
            Path(args.pipelines) if args.pipelines else None,
        )
    else:
        message = "give --scenario NAME, --servegen, or --catalog, --fleet and --log"
        raise InputError([Problem(source="arguments", message=message)])
    window = None
    if args.start or args.end:
        if not (args.start and args.end):
            raise InputError([Problem(source="--from/--to", message="give both or neither")])
        window = (_timestamp(args.start, "--from"), _timestamp(args.end, "--to"))
    return read_scenario(
        catalog_path=paths[0],
        fleet_path=paths[1],
        log_path=paths[2],
        events_path=None if args.no_events else found[0],
        pipelines_path=found[1],
        window=window,
        settings=settings,
    )


def _timestamp(text: str, flag: str) -> pd.Timestamp:
    try:
        moment = pd.Timestamp(text)
    except ValueError as error:
        raise InputError([Problem(source=flag, message=f"{text!r}: {error}")]) from None
    if moment.tzinfo is None:
        raise InputError([Problem(source=flag, message=f"{text!r} has no UTC offset")])
    return moment.tz_convert("UTC")  # the logs' ts are UTC (parquet filters compare alike)


# --- the command --------------------------------------------------------------------


def _row(figures: Figures) -> str:
    closed = "" if figures.closed is None else f"{figures.closed:.0%}"
    return (
        f"| {figures.variant} | {figures.gpu_hit_rate:.2%} | {figures.loads:,} "
        f"| {figures.ttft_p95_ms:.0f} ms | {figures.warmups:,} | {closed} "
        f"| {figures.wall_s:.0f} s |"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", help="a folder of data/ (legal-research, war-story)")
    parser.add_argument("--servegen", action="store_true", help="ServeGen m-mid")
    parser.add_argument("--catalog")
    parser.add_argument("--fleet")
    parser.add_argument("--log")
    parser.add_argument("--events")
    parser.add_argument("--pipelines")
    parser.add_argument("--no-events", action="store_true", help="deliver no events")
    parser.add_argument("--from", dest="start", help="ISO time with offset: cut the log")
    parser.add_argument("--to", dest="end", help="ISO time with offset (exclusive)")
    parser.add_argument("--planner", choices=PLANNERS, default="solver")
    parser.add_argument(
        "--variant", action="append", help=f"repeatable; default: {' '.join(DEFAULT_VARIANTS)}"
    )
    parser.add_argument(
        "--oracle-horizon-s", type=float, help="the oracle's victim horizon (variants with n)"
    )
    parser.add_argument(
        "--warm-margin-s",
        type=float,
        default=0.0,
        help="E and R: the seconds of worth a warm-up's case must beat (beside a batch place each)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    settings = Settings()
    if args.oracle_horizon_s is not None:
        sim = replace(settings.sim, oracle_victim_horizon_s=args.oracle_horizon_s)
        settings = replace(settings, sim=sim)
    variants = args.variant or DEFAULT_VARIANTS
    try:
        for variant in variants:  # checked before the scenario is read
            if variant != BOUNDED:
                levers(variant)
        scenario = _scenario(args, settings)
        planning = replay_planning(
            scenario.catalog, scenario.fleet, settings=settings, planner=args.planner
        )
        figures = run_variants(
            scenario,
            variants,
            settings=settings,
            planning=planning,
            warm_margin_s=args.warm_margin_s,
        )
    except LorafleetError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.json:
        print(json.dumps([asdict(row) for row in figures], indent=1))
        return
    print(f"{len(scenario.workload):,} requests, {len(scenario.events):,} events")
    print("| variant | GPU hits | loads | TTFT p95 | warm-ups | gap closed | wall |")
    print("|---|---|---|---|---|---|---|")
    for row in figures:
        print(_row(row))


if __name__ == "__main__":
    main()
