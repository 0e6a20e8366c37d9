"""Series building: a request frame becomes a panel of per-adapter counts per bucket.

Owns the one shape every forecaster reads (:class:`CountPanel`, time by adapter),
the cleaning rules for messy logs (duplicates, out-of-order rows, gaps, naive or
foreign time stamps) and calendar features in each tenant's time zone.

Pure: no IO, no clock, no logging. What was cleaned is returned as notes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
import pandas as pd

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DAY_S = 86_400
WEEK_S = 7 * DAY_S


class SeriesError(ValueError):
    """The frame cannot be turned into a panel (missing columns, nothing before the origin)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class CountPanel:
    """Requests per bucket: ``counts[t, a]`` for bucket ``start_s + t*bucket_s`` and adapter a.

    Buckets with no requests hold 0. Times are seconds since the Unix epoch, UTC.
    """

    start_s: int
    bucket_s: int
    adapters: tuple[str, ...]
    counts: FloatArray
    notes: tuple[str, ...] = field(default=())

    @property
    def n_buckets(self) -> int:
        return int(self.counts.shape[0])

    @property
    def end_s(self) -> int:
        """The start of the first bucket after the history: the forecast origin."""
        return self.start_s + self.n_buckets * self.bucket_s

    def per_day(self) -> int:
        return max(1, DAY_S // self.bucket_s)

    def bucket_starts_s(self, *, first: int = 0, count: int | None = None) -> IntArray:
        n = self.n_buckets - first if count is None else count
        return self.start_s + (first + np.arange(n, dtype=np.int64)) * self.bucket_s

    def head(self, n_buckets: int) -> CountPanel:
        """The first ``n_buckets`` buckets: the history as it was at an earlier origin."""
        return replace(self, counts=self.counts[:n_buckets])

    def select(self, adapters: Sequence[str]) -> CountPanel:
        index = [self.adapters.index(name) for name in adapters]
        return replace(self, adapters=tuple(adapters), counts=self.counts[:, index])


def to_utc(ts: pd.Series, notes: list[str]) -> pd.Series:
    """Time stamps as tz-aware UTC; naive ones are taken as UTC and a note says so."""
    if not pd.api.types.is_datetime64_any_dtype(ts):
        ts = pd.to_datetime(ts, utc=True, errors="coerce", format="mixed")
    elif getattr(ts.dt, "tz", None) is None:
        notes.append("time stamps had no time zone; read as UTC")
        ts = ts.dt.tz_localize("UTC")
    elif str(ts.dt.tz) != "UTC":
        notes.append(f"time stamps were in {ts.dt.tz}; converted to UTC")
        ts = ts.dt.tz_convert("UTC")
    return ts


def epoch_seconds(ts: pd.Series) -> FloatArray:
    """Seconds since the epoch of tz-aware time stamps, whatever their resolution."""
    if not len(ts):
        return np.zeros(0, dtype=np.float64)
    delta = ts - pd.Timestamp(0, tz="UTC")
    return np.asarray(delta.dt.total_seconds().to_numpy(), dtype=np.float64)


def _epoch_s(ts: pd.Series) -> IntArray:
    return np.floor(epoch_seconds(ts)).astype(np.int64)


def build_panel(
    frame: pd.DataFrame,
    *,
    bucket_s: int,
    end_s: int,
    start_s: int | None = None,
    adapters: Sequence[str] = (),
) -> CountPanel:
    """Count requests per adapter and bucket for every bucket before ``end_s``.

    ``frame`` has ``ts`` and ``adapter``, and optionally ``requests`` (a pre-aggregated
    log). Rows at or after ``end_s`` are ignored: a forecast uses only its past. Exact
    duplicate request rows are dropped (a double-written log) while repeated buckets of an
    aggregated log add up; rows may come in any order, and missing buckets count zero.
    ``adapters`` adds adapters with no history.
    """
    if bucket_s <= 0:
        raise SeriesError(f"bucket must be positive, got {bucket_s} s")
    missing = {"ts", "adapter"} - set(frame.columns)
    if missing:
        raise SeriesError(f"request log lacks column(s) {', '.join(sorted(missing))}")
    notes: list[str] = []
    end_s = end_s - end_s % bucket_s
    clean = _clean(frame, notes)
    ts_s = _epoch_s(clean["ts"])
    before = ts_s < end_s
    clean, ts_s = clean.loc[before], ts_s[before]
    if len(clean) == 0 and not adapters:
        raise SeriesError("no requests before the forecast origin")
    first_s = int(ts_s.min()) if len(ts_s) else end_s - bucket_s
    first_s = first_s - first_s % bucket_s if start_s is None else start_s - start_s % bucket_s
    keep = ts_s >= first_s
    clean, ts_s = clean.loc[keep], ts_s[keep]
    names = tuple(sorted(set(clean["adapter"].astype(str)) | {str(a) for a in adapters}))
    n_buckets = max(1, (end_s - first_s) // bucket_s)
    counts = np.zeros((n_buckets, len(names)), dtype=np.float64)
    rows = (ts_s - first_s) // bucket_s
    cols = pd.Index(names).get_indexer(pd.Index(clean["adapter"].astype(str)))
    weights = _weights(clean, notes)
    np.add.at(counts, (rows, cols), weights)
    return CountPanel(
        start_s=first_s, bucket_s=bucket_s, adapters=names, counts=counts, notes=tuple(notes)
    )


def _clean(frame: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    clean = frame.copy()
    clean["ts"] = to_utc(clean["ts"], notes)
    bad = clean["ts"].isna() | clean["adapter"].isna()
    if bad.any():
        notes.append(f"dropped {int(bad.sum())} row(s) without a time stamp or adapter")
        clean = clean.loc[~bad]
    if "requests" in clean.columns:
        return clean  # repeated buckets of an aggregated log add up (as the log reader does)
    hashable = [c for c in clean.columns if clean[c].dtype != object or c == "adapter"]
    duplicated = clean.duplicated(subset=hashable or None)
    if duplicated.any():
        notes.append(f"dropped {int(duplicated.sum())} duplicate row(s)")
        clean = clean.loc[~duplicated]
    return clean


def _weights(clean: pd.DataFrame, notes: list[str]) -> FloatArray:
    if "requests" not in clean.columns:
        return np.ones(len(clean), dtype=np.float64)
    weights = pd.to_numeric(clean["requests"], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(weights) | (weights < 0)
    if bad.any():
        notes.append(f"ignored {int(bad.sum())} row(s) with a missing or negative count")
        weights = np.where(bad, 0.0, weights)
    return weights


def panel_from_counts(
    counts: pd.DataFrame, *, bucket_s: int, end_s: int, adapters: Sequence[str] = ()
) -> CountPanel:
    """A panel from an already aggregated ``ts, adapter, requests`` frame."""
    return build_panel(counts, bucket_s=bucket_s, end_s=end_s, adapters=adapters)


def local_calendar(
    starts_s: IntArray, adapters: Sequence[str], timezones: Mapping[str, str]
) -> tuple[IntArray, IntArray]:
    """Minute of day and weekday (Monday 0) of each bucket start, in each adapter's zone.

    Returns two ``(len(starts_s), len(adapters))`` arrays. Adapters without a zone use UTC.
    """
    minute = np.empty((len(starts_s), len(adapters)), dtype=np.int64)
    weekday = np.empty_like(minute)
    index = pd.DatetimeIndex(pd.to_datetime(starts_s, unit="s", utc=True))
    zones = [timezones.get(name, "UTC") or "UTC" for name in adapters]
    for zone in sorted(set(zones)):
        local = index.tz_convert(zone)
        cols = [i for i, z in enumerate(zones) if z == zone]
        minute[:, cols] = (local.hour * 60 + local.minute).to_numpy()[:, None]
        weekday[:, cols] = local.weekday.to_numpy()[:, None]
    return minute, weekday
