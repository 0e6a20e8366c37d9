"""Fit-and-predict time of the default model for 1,000 adapters over 14 days of 10-min buckets.

Synthesises the history (no files): a power-law of adapter sizes, each with a daily
bump at its own hour and a weekday dip, Poisson counts; most adapters are sparse, as
in a real long tail. Times one fit and one 24 h prediction for every adapter of the
default model (``auto``), the global gradient-boosting model and a baseline in the
same run (the ratio is the figure to compare across machines; the machine is shared,
so seconds are pessimistic). Target: ``auto`` fit + predict within 60 s on the 2-core
machine, so that the controller can refit it at every forecast tick.

Run: .venv/bin/python -m bench.forecast_scale [--adapters 1000] [--days 14] [--models ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from models.base import Forecaster
from models.registry import forecaster_named
from models.series import CountPanel

START_S = 1_767_225_600
PER_DAY = 144


def synthesize(adapters: int, days: int, *, seed: int = 0) -> CountPanel:
    rng = np.random.default_rng(seed)
    per_day_total = 5_000.0 / (np.arange(1, adapters + 1) ** 1.2)  # requests a day, power law
    peak_hour = rng.uniform(7, 20, adapters)
    hours = (np.arange(days * PER_DAY) % PER_DAY) / 6.0
    weekday = (np.arange(days * PER_DAY) // PER_DAY) % 7
    shape = 0.2 + np.exp(-0.5 * ((hours[:, None] - peak_hour[None, :]) / 2.0) ** 2)
    shape *= np.where(weekday[:, None] >= 5, 0.4, 1.0)
    rate = shape / shape[:PER_DAY].sum(axis=0) * per_day_total
    counts = rng.poisson(rate).astype(np.float64)
    names = tuple(f"adapter-{i:04d}" for i in range(adapters))
    return CountPanel(start_s=START_S, bucket_s=600, adapters=names, counts=counts)


def timed(forecaster: Forecaster, panel: CountPanel) -> tuple[float, float]:
    started = time.perf_counter()
    fitted = forecaster.fit(panel)
    fit_s = time.perf_counter() - started
    started = time.perf_counter()
    fitted.predict(panel, horizon=PER_DAY)
    return fit_s, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapters", type=int, default=1000)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--models", default="profile-7d,global-gbm,auto")
    args = parser.parse_args()
    panel = synthesize(args.adapters, args.days)
    sparse = float(np.mean(panel.counts.sum(axis=0) / (args.days) < 10))
    print(
        f"{args.adapters} adapters x {args.days} days x {PER_DAY} buckets/day "
        f"({panel.counts.size:,} cells; {sparse:.0%} of adapters under 10 requests/day); "
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f}"
    )
    names = [name for name in args.models.split(",") if name]
    base_total = None
    for name in names:
        fit_s, predict_s = timed(forecaster_named(name), panel)
        total = fit_s + predict_s
        base_total = base_total or total
        print(
            f"{name:12} fit {fit_s:7.2f} s  predict 24 h {predict_s:6.2f} s  "
            f"total {total:7.2f} s  ({total / base_total:,.0f}x {names[0]})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
