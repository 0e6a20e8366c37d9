"""Synthetic histories for the forecasting tests: small, seeded, with known structure."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from models.series import CountPanel

START_S = 1_767_225_600  # 2026-01-01 00:00 UTC
BUCKET_S = 600
PER_DAY = 144


def daily_rate(peak: float, *, base: float = 0.5, peak_hour: float = 13.0) -> np.ndarray:
    """A rate per bucket of one day: a smooth bump around ``peak_hour`` UTC."""
    hours = np.arange(PER_DAY) / 6.0
    return base + peak * np.exp(-0.5 * ((hours - peak_hour) / 2.5) ** 2)


@pytest.fixture
def seasonal_panel() -> Callable[..., CountPanel]:
    """Poisson counts of daily-periodic adapters (``peaks`` sets each adapter's size)."""

    def make(days: int = 7, peaks: tuple[float, ...] = (40.0, 8.0), seed: int = 1) -> CountPanel:
        rng = np.random.default_rng(seed)
        rates = np.column_stack([np.tile(daily_rate(p), days) for p in peaks])
        return CountPanel(
            start_s=START_S,
            bucket_s=BUCKET_S,
            adapters=tuple(f"adapter-{i}" for i in range(len(peaks))),
            counts=rng.poisson(rates).astype(np.float64),
        )

    return make


def requests_frame(panel: CountPanel) -> pd.DataFrame:
    """One row per request, at the start of its bucket plus a second per earlier request."""
    rows: list[tuple[pd.Timestamp, str]] = []
    for column, name in enumerate(panel.adapters):
        for index in np.flatnonzero(panel.counts[:, column]):
            start = panel.start_s + int(index) * panel.bucket_s
            rows.extend(
                (pd.Timestamp(start + k, unit="s", tz="UTC"), name)
                for k in range(int(panel.counts[index, column]))
            )
    return pd.DataFrame(rows, columns=["ts", "adapter"])


@pytest.fixture
def to_requests() -> Callable[[CountPanel], pd.DataFrame]:
    return requests_frame
