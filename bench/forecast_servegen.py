"""Forecast accuracy on every ServeGen trace in ../shared/traces, as the controller uses forecasts.

One client = one adapter; counts per 10-minute bucket = rate x 600 s. Scores pool
absolute errors over the clients with at least 1% of the traffic before the first
origin, against the naive forecasts on the very same cells: persistence (last bucket),
same bucket yesterday, and the median of the same bucket over the last 7 days. Coverage
leaves out a client with no request on any scored cell (one that stopped for good): any
band covers it, so it says nothing of the band (``models.accuracy.Cells.live``); MAE
keeps it.

Traces: every folder under ``servegen/`` with per-client rates (language m-mid, 14
days; reason deepseek-r1 and multimodal mm-image, 1 day each), and ``m-mid-perturbed``,
m-mid made non-stationary with a seed (clients that stop for good, appear, or jump
tenfold; every day's volume scaled by 0.5-1.5): a check, not a headline.

- day-ahead (14-day traces only: a 1-day trace has no day before a 24 h horizon):
  origins at midnight of 4 days, 24 h horizon, refit at each origin;
- hour-ahead: on 14-day traces origins every 4 h over 3 days, 1 h horizon, refit
  daily; on 1-day traces origins every hour from 04:00 to 23:00, refit at each origin.

``--split test`` (the default) scores the last 4 days (day-ahead) and last 3 days
(hour-ahead); ``--split dev`` the 4 and 3 days before those, which is where choices
were made (docs/benchmarks.md). 1-day traces are the same in both splits.

Run: .venv/bin/python -m bench.forecast_servegen [--models auto,...] [--traces m-mid,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from models.backtest import BacktestReport, backtest, rolling_origins
from models.registry import forecaster_named
from models.series import DAY_S, CountPanel, IntArray

ROOT = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "servegen"
BUCKET_S = 600
START_S = 1_704_067_200  # 2024-01-01 00:00 UTC, a Monday: trace time 0 is midnight
DEFAULT_MODELS = "persistence,seasonal-naive-day,median-7d,auto"


@dataclass(frozen=True, kw_only=True)
class Protocol:
    title: str
    origins: tuple[int, ...]
    horizon: int
    refit_every: int


def load_panel(folder: Path) -> CountPanel:
    columns: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("chunk-*-trace.csv"), key=lambda p: int(p.stem.split("-")[1])):
        frame = pd.read_csv(path, header=None, usecols=[0, 1], names=["t", "rate"])
        series = np.zeros(int(frame["t"].max()) // BUCKET_S + 1)
        series[(frame["t"] // BUCKET_S).astype(int)] = frame["rate"].fillna(0.0) * BUCKET_S
        columns[f"client-{path.stem.split('-')[1]}"] = series
    n = max(len(s) for s in columns.values())
    counts = np.column_stack([np.pad(s, (0, n - len(s))) for s in columns.values()])
    return CountPanel(start_s=START_S, bucket_s=BUCKET_S, adapters=tuple(columns), counts=counts)


def perturb(panel: CountPanel, *, seed: int) -> CountPanel:
    """m-mid made non-stationary: each client has a 1 in 8 chance of each of stopping for good,
    appearing (nothing before), or jumping tenfold up or down, at a random bucket after day 2,
    and every day's volume is scaled by a factor drawn from 0.5-1.5.
    """
    rng = np.random.default_rng(seed)
    counts = panel.counts.copy()
    per_day = panel.per_day()
    n, n_adapters = counts.shape
    # 0 stop, 1 appear, 2 jump, else unchanged
    fate: IntArray = np.asarray(rng.integers(0, 8, size=n_adapters), dtype=np.int64)
    when: IntArray = rng.integers(2 * per_day, n - per_day // 2, size=n_adapters)
    for column in range(n_adapters):
        at = when[column]
        if fate[column] == 0:
            counts[at:, column] = 0.0
        elif fate[column] == 1:
            counts[:at, column] = 0.0
        elif fate[column] == 2:
            counts[at:, column] *= 10.0 if rng.random() < 0.5 else 0.1
    daily = rng.uniform(0.5, 1.5, n // per_day + 1)
    counts *= np.repeat(daily, per_day)[:n, None]
    return replace(panel, counts=counts)


def traces(root: Path, *, seed: int) -> dict[str, CountPanel]:
    """Every ServeGen folder with per-client files, by folder name, and the perturbed m-mid."""
    found = {
        folder.name: load_panel(folder)
        for folder in sorted(root.glob("*/*"))
        if folder.is_dir() and any(folder.glob("chunk-*-trace.csv"))
    }
    if "m-mid" in found:
        found["m-mid-perturbed"] = perturb(found["m-mid"], seed=seed)
    return found


def protocols(panel: CountPanel, *, split: str) -> list[Protocol]:
    per_day = panel.per_day()
    days = panel.n_buckets // per_day
    hour = 3600 // panel.bucket_s
    if days < 2:  # hour-ahead inside the one day, after 4 hours to learn from
        origins = tuple(range(4 * hour, panel.n_buckets - hour + 1, hour))
        return [Protocol(title="hour-ahead", origins=origins, horizon=hour, refit_every=1)]
    back = 4 if split == "test" else 8
    day = rolling_origins(panel, first=(days - back) * per_day, every=per_day, count=4)
    back = 3 if split == "test" else 6
    hourly = rolling_origins(panel, first=(days - back) * per_day, every=4 * hour, count=18)
    return [
        Protocol(title="day-ahead", origins=day, horizon=per_day, refit_every=per_day),
        Protocol(title="hour-ahead", origins=hourly, horizon=hour, refit_every=per_day),
    ]


def show(title: str, report: BacktestReport, seconds: dict[str, float]) -> None:
    print(
        f"\n{title}: {len(report.origins_s)} origins, horizon {report.horizon_buckets} buckets, "
        f"{len(report.major_adapters)} clients with >=1% traffic"
    )
    print(
        f"{'model':20} {'/persist':>8} {'/yday':>6} {'/med7':>6} {'/best':>6} "
        f"{'wMAPE':>6} {'cov90':>6} {'cov99':>6} {'s':>6}"
    )
    for m in report.models:
        s = m.major
        print(
            f"{m.model:20} {s.mae_vs_persistence:8.3f} {s.mae_vs_yesterday:6.3f} "
            f"{s.mae_vs_median_7d:6.3f} {s.mae_vs_best_naive:6.3f} {s.wmape:6.3f} "
            f"{s.coverage_90:6.3f} {s.coverage_99:6.3f} {seconds.get(m.model, 0):6.1f}"
        )
    for note in dict.fromkeys(report.notes):
        print("  note:", note)


def run(title: str, panel: CountPanel, names: Sequence[str], protocol: Protocol) -> None:
    reports, seconds = [], {}
    for name in names:
        started = time.perf_counter()
        reports.append(
            backtest(
                panel,
                [forecaster_named(name)],
                origins=protocol.origins,
                horizon=protocol.horizon,
                refit_every=protocol.refit_every,
            )
        )
        seconds[name] = time.perf_counter() - started
    merged = replace(
        reports[0],
        models=tuple(m for r in reports for m in r.models),
        notes=tuple(n for r in reports for n in r.notes),
    )
    show(title, merged, seconds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--traces", default="", help="comma-separated; default: all")
    parser.add_argument("--only", choices=["day", "hour"], default=None)
    parser.add_argument("--split", choices=["dev", "test"], default="test")
    parser.add_argument("--seed", type=int, default=2, help="of the perturbed m-mid")
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    wanted = [t for t in args.traces.split(",") if t]
    for trace, panel in traces(ROOT, seed=args.seed).items():
        if wanted and trace not in wanted:
            continue
        days = panel.n_buckets * panel.bucket_s / DAY_S
        print(
            f"\n== {trace}: {len(panel.adapters)} clients, {days:g} day(s), "
            f"{panel.counts.sum():.3g} requests, split {args.split}"
        )
        for protocol in protocols(panel, split=args.split):
            if args.only and not protocol.title.startswith(args.only):
                continue
            run(f"{trace} {protocol.title}", panel, names, protocol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
