"""Forecast accuracy on ServeGen language/m-mid, evaluated as the controller uses forecasts.

One client = one adapter; counts per 10-minute bucket = rate x 600 s. Scores pool
absolute errors over the clients with at least 1% of the traffic before the first
origin. Targets:

- day-ahead: origins at midnight of each of the last 4 days, 24 h horizon, refit at
  every origin; target: MAE at most 0.9 x same-bucket-yesterday;
- hour-ahead: origins every 4 hours over the last 3 days, 1 h horizon, refit daily;
  target: MAE at most 0.9 x persistence;
- 0.9-quantile coverage between 0.85 and 0.95 in both.

Run: .venv/bin/python bench/forecast_servegen.py [--models auto,global-gbm,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from models.backtest import BacktestReport, backtest, rolling_origins
from models.registry import forecaster_named
from models.series import CountPanel

TRACES = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "traces"
    / "servegen"
    / "language"
    / "m-mid"
)
BUCKET_S = 600
START_S = 1_704_067_200  # 2024-01-01 00:00 UTC, a Monday: trace time 0 is midnight


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


def show(title: str, report: BacktestReport, seconds: dict[str, float]) -> None:
    print(
        f"\n{title}: {len(report.origins_s)} origins, horizon {report.horizon_buckets} buckets, "
        f"{len(report.major_adapters)} clients with >=1% traffic"
    )
    print(
        f"{'model':22} {'MAE/persist':>11} {'MAE/yday':>9} {'MASE':>6} {'wMAPE':>6} "
        f"{'cov90':>6} {'pin90':>10} {'s':>6}"
    )
    for m in report.models:
        s = m.major
        print(
            f"{m.model:22} {s.mae_vs_persistence:11.3f} {s.mae_vs_yesterday:9.3f} {s.mase:6.3f} "
            f"{s.wmape:6.3f} {s.coverage_90:6.3f} {s.pinball_90:10.1f} "
            f"{seconds.get(m.model, 0):6.1f}"
        )
    for note in report.notes:
        print("  note:", note)


def run(title: str, panel: CountPanel, names: list[str], **kwargs: object) -> None:
    reports, seconds = [], {}
    for name in names:
        started = time.perf_counter()
        reports.append(backtest(panel, [forecaster_named(name)], **kwargs))  # type: ignore[arg-type]
        seconds[name] = time.perf_counter() - started
    merged = BacktestReport(
        horizon_buckets=reports[0].horizon_buckets,
        bucket_s=reports[0].bucket_s,
        origins_s=reports[0].origins_s,
        major_adapters=reports[0].major_adapters,
        models=tuple(m for r in reports for m in r.models),
        notes=tuple(n for r in reports for n in r.notes),
    )
    show(title, merged, seconds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--models", default="persistence,seasonal-naive-day,median-7d,ewma,global-gbm,auto"
    )
    parser.add_argument("--only", choices=["day", "hour"], default=None)
    args = parser.parse_args()
    names = args.models.split(",")
    panel = load_panel(TRACES)
    per_day = panel.per_day()
    days = panel.n_buckets // per_day
    print(f"m-mid: {len(panel.adapters)} clients, {days} days, {panel.counts.sum():.3g} requests")
    if args.only in (None, "day"):
        origins = rolling_origins(panel, first=(days - 4) * per_day, every=per_day, count=4)
        run("day-ahead", panel, names, origins=origins, horizon=per_day, refit_every=per_day)
    if args.only in (None, "hour"):
        origins = rolling_origins(panel, first=(days - 3) * per_day, every=24, count=18)
        run("hour-ahead", panel, names, origins=origins, horizon=6, refit_every=per_day)
    return 0


if __name__ == "__main__":
    sys.exit(main())
