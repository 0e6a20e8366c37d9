"""Replay the war story (data/war-story) under every policy and print the table.

Three days to Thursday 12 March 2026, 8 pods x 4 GPU slots, 40 adapters; on Thursday
10:15 (EDT, -04:00) an A/B test adds 20 variants (60 active). Prints, per policy, the
whole-run metrics, the same figures for the 4 hours after the experiment starts, and
the replay speed (requests per minute of wall time). Baselines in the same run, as
ratios: loads of round-robin and EPP over lorafleet's, lorafleet's hit-rate gap and
TTFT p95 ratio to the oracle.

``--calibration`` replays EPP alone and prints the article's timeline beside the
simulator's (``war_story_windows``): the figures the scenario was calibrated on.

    .venv/bin/python bench/replay_war_story.py [--planner solver|greedy] [--policy P ...]
    .venv/bin/python bench/replay_war_story.py --calibration [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from placement.domain import Catalog, Fleet
from placement.inputs import load_catalog, load_fleet
from placement.inputs.request_log import load_request_log
from placement.settings import Settings
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.routers import POLICIES
from placement.sim.wiring import PLANNERS, replay_planning
from placement.sim.workload import SimWorkload, workload_from_log

if not __package__:  # run as a file (python bench/<name>.py): the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.replay_targets import print_target_ratios
from bench.war_story_windows import (
    ARTICLE,
    TimedReplay,
    Window,
    article_windows,
    window_figures,
    within,
)

DATA = Path("data/war-story")
EXPERIMENT = pd.Timestamp("2026-03-12T10:15:00-04:00")


def window(
    result: ReplayResult, load: SimWorkload, start_s: float, end_s: float
) -> dict[str, float]:
    arrival = np.asarray(load.arrival_s)
    inside = (arrival >= start_s) & (arrival < end_s)
    outcome = np.asarray(result.log.outcome)[inside]
    ttft = np.asarray(result.log.ttft_ms)[inside]
    loads = np.asarray([start for start, *_ in result.log.loads])
    count = int(((loads >= start_s) & (loads < end_s)).sum()) if loads.size else 0
    pods = len(result.pod_ids)
    return {
        "hit": float(np.mean(outcome == 0)) if outcome.size else 0.0,
        "p95": float(np.percentile(ttft, 95)) if ttft.size else 0.0,
        "lps": count / (pods * max(end_s - start_s, 1.0)),
    }


def _load(data: Path, settings: Settings) -> tuple[Fleet, Catalog, SimWorkload]:
    fleet = load_fleet(data / "fleet.yaml")
    catalog = load_catalog(data / "catalog.yaml", fleet=fleet)
    log = load_request_log(data / "requests.parquet")
    return fleet, catalog, workload_from_log(log, catalog, bucket_s=settings.forecast.bucket_s)


class _Keep(TimedReplay):
    """The replay ``run_policy`` builds, kept for its eviction times."""

    last: TimedReplay | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        _Keep.last = self


def calibration(data: Path) -> None:
    """EPP on the whole log; the article's figures beside the simulator's."""
    settings = Settings()
    fleet, _, load = _load(data, settings)
    began = time.perf_counter()
    result = run_policy("epp", load, fleet, settings=settings, replay_type=_Keep)
    replay = _Keep.last
    assert replay is not None
    print(f"epp on {len(load):,} requests in {time.perf_counter() - began:.0f} s")
    windows = {w.name: w for w in article_windows()}
    wednesday = Window(
        name="Wednesday 14:00-16:00 (40 adapters)",
        start=pd.Timestamp("2026-03-11T14:00:00-04:00"),
        end=pd.Timestamp("2026-03-11T16:00:00-04:00"),
    )
    figures = {
        name: window_figures(
            load,
            result.log,
            replay,
            pods=len(fleet.pods),
            window=w,
            prefill_ms_per_token=settings.sim.prefill_ms_per_token,
        )
        for name, w in [*windows.items(), (wednesday.name, wednesday)]
    }
    print("\n| figure | window | article | simulator | within 30% |\n|---|---|---|---|---|")
    for name, key, value, words in ARTICLE:
        measured = figures[name][key]
        mark = "yes" if within(key, measured, value) else "no"
        print(f"| {words} | {name} | {value:g} | {measured:.4g} | {mark} |")
    print(
        "\n| window | req/s | GPU hit | swaps/s/pod | residency p50 s | slot-time p50 s"
        " | TTFT p95 ms | critical pods |\n|---|---|---|---|---|---|---|---|"
    )
    for name, f in figures.items():
        print(
            f"| {name} | {f['req_per_s']:.1f} | {f['hit']:.3f} | {f['swaps']:.3f} |"
            f" {f['residency_p50_s']:.1f} | {f['residency_slot_p50_s']:.0f} |"
            f" {f['ttft_p95_ms']:.0f} | {f['critical_pods']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--planner", choices=PLANNERS, default="solver")
    parser.add_argument("--policy", action="append", default=None)
    parser.add_argument("--calibration", action="store_true")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    if args.calibration:
        calibration(args.data)
        return
    settings = Settings()
    fleet, catalog, load = _load(args.data, settings)
    planning = replay_planning(catalog, fleet, settings=settings, planner=args.planner)
    experiment_s = (EXPERIMENT - pd.Timestamp(load.start)).total_seconds()
    print(
        f"war story: {len(load):,} requests, {len(fleet.pods)} pods;"
        f" planning: {planning.description}"
    )
    header = (
        f"{'policy':12s} {'hit':>6s} {'loads':>7s} {'l/pod/s':>8s} {'peak':>6s} {'res50':>6s}"
        f" {'p50':>5s} {'p95':>5s} {'p99':>5s} {'wait':>6s} {'convoy':>6s} |"
        f" {'hit+4h':>6s} {'p95+4h':>6s} {'l/pod/s+4h':>10s} | {'Mreq/min':>8s}"
    )
    print(header)
    results: dict[str, dict[str, float]] = {}
    for name in args.policy or list(POLICIES):
        began = time.perf_counter()
        result = run_policy(name, load, fleet, settings=settings, planning=planning)
        wall_s = time.perf_counter() - began
        m = result.metrics
        after = window(result, load, experiment_s, experiment_s + 4 * 3600)
        results[name] = {**{k: float(v) for k, v in m.items()}, "wall_s": wall_s}
        print(
            f"{name:12s} {m['gpu_hit_rate']:6.3f} {m['loads']:7d} {m['loads_per_pod_s']:8.4f}"
            f" {m['loads_per_pod_s_peak']:6.3f} {m['residency_p50_s']:6.0f} {m['ttft_p50_ms']:5.0f}"
            f" {m['ttft_p95_ms']:5.0f} {m['ttft_p99_ms']:5.0f} {m['load_wait_share']:6.3f}"
            f" {m['convoy']!s:>6s} | {after['hit']:6.3f} {after['p95']:6.0f} {after['lps']:10.4f} |"
            f" {len(load) / wall_s * 60 / 1e6:8.2f}"
        )
    print_target_ratios(results)


if __name__ == "__main__":
    main()
