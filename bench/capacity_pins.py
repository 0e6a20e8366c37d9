"""Do ``lorafleet recommend pins``' pins pay? Every policy replayed without and with them.

The pins are recommended from the log before ``--until`` (the war story: its first two
days) and checked on the day after it (Thursday), each policy three ways:

- ``none``: the catalog as shipped;
- ``plan``: the catalog with the pins (``pinned: [pods]``): a constraint of the plan,
  all lorafleet can do on a vLLM pod (vLLM pins only through its engine API);
- ``engine``: the plan's pins and the engine's too: the pinned adapters start on their
  pods' GPU slots and the engine never evicts them (SGLang's ``pinned`` load over HTTP,
  vLLM's ``pin_lora``), under the engine's LRU.

The replay starts an hour before ``--check-from`` (its caches warm); the forecaster
sees the log before that as counts, as ``lorafleet capacity`` does.

    .venv/bin/python bench/capacity_pins.py                          # the war story
    .venv/bin/python bench/capacity_pins.py --scenario saas-50 --until 2026-03-09T12:00:00-04:00 \\
        --check-from 2026-03-09T12:00:00-04:00
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from placement.cli.capacity_cmds import split_log
from placement.cli.recommend_cmds import pinned_catalog_yaml
from placement.cli.replay_cmds import figures_window, parse_moment
from placement.domain import Catalog, Fleet
from placement.forecast.pins import PinRules, PoolPins, recommend_pins
from placement.inputs import load_catalog, load_fleet
from placement.inputs.request_log import RequestLog, load_request_log
from placement.settings import Settings
from placement.sim.capacity import PastHistory, past_counts
from placement.sim.engine import GPU_HIT, FleetReplay
from placement.sim.replay import run_policy
from placement.sim.routers import PLANNED
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload, workload_from_log

if not __package__:  # run as a file (python bench/<name>.py): the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import war_story_windows as ws

DATA = Path(__file__).resolve().parents[1] / "data"


@dataclass(frozen=True, kw_only=True)
class Case:
    policy: str
    pins: str  # none, plan, engine


@dataclass(frozen=True, kw_only=True)
class Shared:
    workload: SimWorkload
    fleet: Fleet
    catalogs: dict[str, Catalog]
    by_pod: dict[str, frozenset[str]]
    pinned: frozenset[str]
    window_s: tuple[float, float] | None
    past: RequestLog | None
    planner: str


_SHARED: dict[str, Shared] = {}


def run_case(case: Case) -> tuple[Case, dict[str, float], float]:
    shared = _SHARED["job"]
    settings = Settings()
    catalog = shared.catalogs["none" if case.pins == "none" else "pins"]
    planning = None
    if case.policy in PLANNED:
        planning = replay_planning(catalog, shared.fleet, settings=settings, planner=shared.planner)
        if shared.past is not None:
            past = PastHistory(planning.forecaster, shared.past)
            planning = replace(planning, forecaster=past)
    replay_type = (
        ws.engine_pinned_replay(shared.by_pod, lru_only=False)
        if case.pins == "engine"
        else FleetReplay
    )
    began = time.process_time()
    result = run_policy(
        case.policy,
        shared.workload,
        shared.fleet,
        settings=settings,
        planning=planning,
        replay_type=replay_type,
        window_s=shared.window_s,
    )
    arrival = np.asarray(shared.workload.arrival_s)
    lo, hi = shared.window_s or (0.0, float("inf"))
    inside = (arrival >= lo) & (arrival < hi)
    pinned = np.isin(np.asarray(shared.workload.adapters), sorted(shared.pinned))
    hits = np.asarray(result.log.outcome) == GPU_HIT
    figures = {
        "gpu_hit_rate": float(result.metrics["gpu_hit_rate"]),
        "ttft_p95_ms": float(result.metrics["ttft_p95_ms"]),
        "loads": float(result.metrics["loads"]),
        "pinned_hits": float(hits[inside & pinned].mean()) if (inside & pinned).any() else 0.0,
        "rest_hits": float(hits[inside & ~pinned].mean()) if (inside & ~pinned).any() else 0.0,
    }
    return case, figures, time.process_time() - began


def describe(pools: list[PoolPins]) -> None:
    for pool in pools:
        for pin in pool.pins:
            print(
                f"  pin {pin.adapter}: {pin.share:.1%} of requests, peak {pin.peak_rps:.2f}"
                f" req/s, on {', '.join(pin.pod_ids)}"
            )
        print(
            f"  {len(pool.pins)} pins, {pool.pinned_share:.1%} of requests,"
            f" {pool.pinned_slots} of {pool.slots} GPU slots;"
            f" passed over: {dict(pool.passed_over) or 'none'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="war-story")
    parser.add_argument("--until", default="2026-03-12T00:00:00-04:00")
    parser.add_argument("--check-from", default="2026-03-12T00:00:00-04:00")
    parser.add_argument("--check-to", default="2026-03-13T00:00:00-04:00")
    parser.add_argument("--policies", default="lorafleet,epp,bounded,oracle")
    parser.add_argument("--planner", default="greedy")
    parser.add_argument("--max-pins", type=int, default=10)
    parser.add_argument(
        "--pods-per-pin", type=int, default=1, help="0: enough pods to carry the peak hour"
    )
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    folder = DATA / args.scenario
    fleet = load_fleet(folder / "fleet.yaml")
    catalog = load_catalog(folder / "catalog.yaml", fleet=fleet)
    log = load_request_log(folder / "requests.parquet")
    hourly = log.counts(3600)
    hourly = hourly[hourly["ts"] < parse_moment(args.until, "--until")]

    pools = recommend_pins(
        hourly,
        catalog,
        fleet,
        PinRules(max_pins=args.max_pins, pods_per_pin=args.pods_per_pin or None),
    )
    print(f"{args.scenario}: pins from the log before {args.until}")
    describe(pools)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "catalog.yaml"
        path.write_text(pinned_catalog_yaml(folder / "catalog.yaml", pools))
        pinned_catalog = load_catalog(path, fleet=fleet)
    by_pod: dict[str, set[str]] = {}
    for pool in pools:
        for pin in pool.pins:
            for pod_id in pin.pod_ids:
                by_pod.setdefault(pod_id, set()).add(pin.adapter)
    settings = Settings()
    replayed, before = split_log(log, args.check_from, args.check_to, history="7D", warmup="1h")
    workload = workload_from_log(replayed, catalog, bucket_s=settings.forecast.bucket_s)
    _SHARED["job"] = Shared(
        workload=workload,
        fleet=fleet,
        catalogs={"none": catalog, "pins": pinned_catalog},
        by_pod={pod: frozenset(names) for pod, names in by_pod.items()},
        pinned=frozenset(name for names in by_pod.values() for name in names),
        window_s=figures_window(workload, args.check_from, args.check_to),
        past=None if before is None else past_counts(before, settings.forecast.bucket_s),
        planner=args.planner,
    )
    cases = [
        Case(policy=policy, pins=pins)
        for policy in args.policies.split(",")
        for pins in (("none", "plan", "engine") if policy in PLANNED else ("none", "engine"))
    ]
    print(f"checked on {args.check_from} .. {args.check_to}: {len(workload.arrival_s):,} requests")
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=context) as executor:
        rows = list(executor.map(run_case, cases))
    print(
        "| policy | pins | GPU hits | pinned adapters' hits | the rest's hits"
        " | TTFT p95 ms | loads | CPU s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for case, figures, cpu_s in rows:
        print(
            f"| {case.policy} | {case.pins} | {figures['gpu_hit_rate']:.2%} |"
            f" {figures['pinned_hits']:.2%} | {figures['rest_hits']:.2%} |"
            f" {figures['ttft_p95_ms']:.0f} | {figures['loads']:,.0f} | {cpu_s:.0f} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
