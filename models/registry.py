"""Forecasters by name, for the CLI, backtests and benchmarks.

Pure: builds settings objects only.
"""

from __future__ import annotations

from collections.abc import Mapping

from models.base import Forecaster
from models.baselines import (
    DailyProfile,
    Ewma,
    LevelProfile,
    Persistence,
    RecentMedian,
    SameBucketMedian,
    SeasonalNaive,
)
from models.boosting import GlobalBoosting
from models.select import Selecting
from models.smoothing import HoltWinters


def forecaster_named(
    name: str, *, timezones: Mapping[str, str] | None = None, seed: int = 0
) -> Forecaster:
    """The forecaster called ``name``; ``auto`` selects per adapter and horizon band by backtest.

    KeyError names the known models when ``name`` is not one of them.
    """
    zones = tuple(sorted((timezones or {}).items()))
    table: dict[str, Forecaster] = {
        "persistence": Persistence(),
        "seasonal-naive-day": SeasonalNaive(),
        "seasonal-naive-week": SeasonalNaive(period_days=7, name="seasonal-naive-week"),
        "median-7d": SameBucketMedian(),
        "profile-7d": DailyProfile(),
        "ewma": Ewma(),
        "level-profile": LevelProfile(),
        "recent-median-3": RecentMedian(window=3, name="recent-median-3"),
        "recent-median-24": RecentMedian(window=24, name="recent-median-24"),
        "global-gbm": GlobalBoosting(timezones=zones, seed=seed),
        "holt-winters": HoltWinters(),
    }
    table["auto"] = Selecting()
    if name not in table:
        raise KeyError(f"unknown forecaster {name!r}; known: {', '.join(sorted(table))}")
    return table[name]
