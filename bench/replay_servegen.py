"""Replay ServeGen m-mid (../shared/traces) under every policy: real per-client demand.

One client = one adapter; ranks are assigned round-robin over 8, 16, 32, 64, 128 (as
S-LoRA and Chameleon do) on Llama-3.1-8B q/v projections. The trace's 10-minute rates
are scaled so the fleet averages ``--rps`` requests per second; arrivals inside a
window are Poisson (uniform order statistics; the trace's Gamma/Weibull shapes are
not used), lengths are drawn from the Azure 2023 conversation trace. The fleet has
8 pods of 4 GPU slots: 32 slots, fewer than the adapters active on a day.

The first replayed day gives lorafleet its history (its forecast uses yesterday);
figures are for the whole replay. Ratios as in bench/replay_war_story.py.

    .venv/bin/python bench/replay_servegen.py [--days 2] [--rps 4] [--planner greedy]
        [--policy P ...] [--forecast-model M]
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from models.registry import forecaster_named
from placement.domain import (
    Adapter,
    AdapterId,
    Catalog,
    Engine,
    Fleet,
    Pod,
    PodId,
    Pool,
    PoolId,
)
from placement.settings import Settings
from placement.sim.replay import run_policy
from placement.sim.routers import POLICIES
from placement.sim.wiring import PLANNERS, replay_planning
from placement.sim.workload import SimWorkload
from placement.sizing import BUILTIN_MODELS, adapter_bytes

if not __package__:  # run as a file (python bench/<name>.py): the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.replay_targets import print_target_ratios

TRACES = Path("../shared/traces")
RANKS = (8, 16, 32, 64, 128)
MODEL = "llama-3.1-8b"
GiB = 1 << 30


def read_clients(days: int) -> dict[str, np.ndarray]:
    """Per client, its rates (req/s) for the first ``days`` days of 10-minute windows."""
    rates: dict[str, np.ndarray] = {}
    for path in sorted(TRACES.glob("servegen/language/m-mid/chunk-*-trace.csv")):
        frame = pd.read_csv(path, header=None, usecols=[0, 1], names=["t", "rate"])
        series = frame[frame["t"] < days * 86_400]["rate"].to_numpy(dtype=float)
        if series.sum() > 0:
            client = int(path.name.split("-")[1])
            rates[f"client-{client:03d}"] = series
    return rates


def build(days: int, rps: float, seed: int) -> tuple[SimWorkload, Catalog, Fleet]:
    rng = np.random.default_rng(seed)
    rates = read_clients(days)
    total = sum(series.mean() for series in rates.values())
    scale = rps / total
    lengths = pd.read_csv(TRACES / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv")
    times: list[np.ndarray] = []
    names: list[np.ndarray] = []
    for name, series in rates.items():
        counts = rng.poisson(series * scale * 600.0)
        starts = np.repeat(np.arange(series.size) * 600.0, counts)
        times.append(starts + rng.uniform(0.0, 600.0, starts.size))
        names.append(np.full(starts.size, name, dtype=object))
    arrival = np.concatenate(times)
    order = np.argsort(arrival, kind="stable")
    picks = rng.integers(0, len(lengths), arrival.size)
    dims = BUILTIN_MODELS[MODEL]
    adapters = tuple(
        Adapter(
            name=AdapterId(name),
            base_model=MODEL,
            rank=RANKS[index % len(RANKS)],
            alpha=RANKS[index % len(RANKS)],
            target_modules=("q_proj", "v_proj"),
            dtype="float16",
            source=f"s3://servegen/{name}",
            size_bytes=adapter_bytes(
                dims, RANKS[index % len(RANKS)], ("q_proj", "v_proj"), "float16"
            ),
        )
        for index, name in enumerate(sorted(rates))
    )
    pods = tuple(
        Pod(
            name=PodId(f"pod-{i}"),
            pool=PoolId("m-mid"),
            url=f"http://127.0.0.1:{18000 + i}",
            engine=Engine.VLLM,
            max_loras=4,
            max_cpu_loras=16,
            max_lora_rank=128,
            hbm_adapter_bytes=2 * GiB,
            host_adapter_bytes=16 * GiB,
            capacity_rps=4.0,
        )
        for i in range(8)
    )
    pool = Pool(
        name=PoolId("m-mid"),
        base_model=MODEL,
        served_model_name=MODEL,
        engine=Engine.VLLM,
        max_lora_rank=128,
        dims=dims,
        pods=pods,
    )
    workload = SimWorkload(
        start=datetime(2025, 1, 6, tzinfo=UTC),
        arrival_s=arrival[order].tolist(),
        adapters=[str(name) for name in np.concatenate(names)[order]],
        prompt_tokens=lengths["ContextTokens"].to_numpy()[picks].clip(1).tolist(),
        output_tokens=lengths["GeneratedTokens"].to_numpy()[picks].clip(1).tolist(),
        size_bytes={str(adapter.name): adapter.size_bytes for adapter in adapters},
    )
    return workload, Catalog(adapters=adapters), Fleet(pools=(pool,))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=2)
    parser.add_argument("--rps", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--planner", choices=PLANNERS, default="solver")
    parser.add_argument("--policy", action="append", default=None)
    parser.add_argument(
        "--forecast-model", default="level-profile", help="lorafleet's forecaster (models/)"
    )
    args = parser.parse_args()
    try:
        forecaster_named(args.forecast_model)
    except KeyError as exc:
        parser.error(str(exc.args[0]))
    settings = Settings()
    load, catalog, fleet = build(args.days, args.rps, args.seed)
    active = len(set(load.adapters))
    planning = replay_planning(
        catalog, fleet, settings=settings, planner=args.planner, forecast_model=args.forecast_model
    )
    print(
        f"servegen m-mid: {len(load):,} requests over {args.days} d, {active} adapters,"
        f" 32 GPU slots; planning: {planning.description}"
    )
    print(
        f"{'policy':12s} {'hit':>6s} {'loads':>7s} {'l/pod/s':>8s} {'peak':>6s} {'res50':>6s}"
        f" {'p50':>5s} {'p95':>5s} {'p99':>6s} {'wait':>6s} {'convoy':>6s} | {'Mreq/min':>8s}"
    )
    results: dict[str, dict[str, float]] = {}
    for name in args.policy or list(POLICIES):
        began = time.perf_counter()
        m = run_policy(name, load, fleet, settings=settings, planning=planning).metrics
        wall_s = time.perf_counter() - began
        results[name] = {key: float(value) for key, value in m.items()}
        print(
            f"{name:12s} {m['gpu_hit_rate']:6.3f} {m['loads']:7d} {m['loads_per_pod_s']:8.4f}"
            f" {m['loads_per_pod_s_peak']:6.3f} {m['residency_p50_s']:6.0f} {m['ttft_p50_ms']:5.0f}"
            f" {m['ttft_p95_ms']:5.0f} {m['ttft_p99_ms']:6.0f} {m['load_wait_share']:6.3f}"
            f" {m['convoy']!s:>6s} | {len(load) / wall_s * 60 / 1e6:8.2f}"
        )
    print_target_ratios(results)


if __name__ == "__main__":
    main()
