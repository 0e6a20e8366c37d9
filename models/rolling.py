"""The rolling-origin backtest of the selecting model: its origins, and its two passes.

A :class:`Plan` is one backtest: the origins, the experts it stacks and the units
(steps or bands) it sets weights for. :func:`grid_losses` scores every convex weight
vector of the stacking grid per fold of origins (blocks alternate between two folds);
:func:`crossfit` then scores, at every origin, the stack fitted on the other fold and
the naive target, and keeps the busy adapters' cells for the band calibration
(``models.bands``). Both go over the origins in chunks, so memory stays bounded for a
thousand adapters.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.bands import Cells
from models.experts import Lags, expert_means
from models.series import FloatArray, IntArray
from models.shifts import ShiftRule, Shifts, detect_shifts, level_forecast

BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, kw_only=True, eq=False)
class Plan:
    """One backtest: its origins, the experts it stacks, and the units it sets weights for.

    A unit is a step (first band) or a band (beyond): ``unit_steps`` are its steps
    ``[start, end)``, ``unit_band`` its horizon band.
    """

    origins: IntArray
    experts: tuple[str, ...]
    #: The first ``naive`` experts are the naive forecasts.
    naive: int
    grid: int
    horizon: int
    unit_band: tuple[int, ...]
    unit_steps: tuple[tuple[int, int], ...]
    first_unit: int
    #: Origins per block of the evidence; blocks alternate between the two folds.
    block: int
    #: Buckets since an adapter's first request before its stack is trusted at all.
    min_age: int

    @property
    def first(self) -> int:
        return int(self.origins[0])

    @property
    def folds(self) -> IntArray:
        return np.asarray((self.origins // self.block) % 2, dtype=np.int64)

    def unit_mask(self) -> FloatArray:
        """``(unit, step)``: 1 where the step belongs to the unit."""
        mask = np.zeros((len(self.unit_steps), self.horizon))
        for unit, (start, end) in enumerate(self.unit_steps):
            mask[unit, start:end] = 1.0
        return mask


def simplex(n: int, grid: int) -> FloatArray:
    """Convex weights of ``n`` experts in steps of ``1/grid``; row 0 is all on the first."""
    points = [
        (grid - sum(c), *c)
        for c in itertools.product(range(grid + 1), repeat=n - 1)
        if sum(c) <= grid
    ]
    return np.asarray(points, dtype=np.float64) / grid


def _chunks(plan: Plan, width: int) -> Iterator[tuple[int, IntArray]]:
    size = max(1, int(4e6 // max(1, plan.horizon * width)))
    for start in range(0, len(plan.origins), size):
        yield start, plan.origins[start : start + size]


def _actuals(lags: Lags, origins: IntArray, horizon: int) -> tuple[FloatArray, FloatArray]:
    """Actual counts ``(origin, step, adapter)`` and 1 where the step is inside the history."""
    index = origins[:, None] + np.arange(horizon)[None, :]
    valid = (index < lags.n_buckets).astype(np.float64)
    return lags.counts[np.minimum(index, lags.n_buckets - 1)], valid


def _per_origin(errors: FloatArray, valid: FloatArray, mask: FloatArray) -> FloatArray:
    """Mean error per (unit, origin, adapter) of ``errors (origin, step, adapter)``."""
    weight = valid[None] * mask[:, None, :]  # (unit, origin, step)
    total = np.einsum("ush,sha->usa", weight, errors)
    return np.asarray(total / np.maximum(weight.sum(axis=2), 1.0)[..., None], dtype=np.float64)


def grid_losses(
    lags: Lags, plan: Plan, grid: FloatArray, mask: FloatArray, folds: IntArray
) -> tuple[FloatArray, FloatArray]:
    """Absolute error summed per (fold, grid point, unit, adapter), and the naive experts'
    mean error per (naive, band, origin, adapter).
    """
    n_adapters = lags.counts.shape[1]
    bands = sorted(set(plan.unit_band))
    band_mask = np.stack(
        [mask[[u for u, b in enumerate(plan.unit_band) if b == band]].sum(0) for band in bands]
    )
    totals = np.zeros((2, len(grid), len(plan.unit_steps), n_adapters))
    naive = np.zeros((plan.naive, len(bands), len(plan.origins), n_adapters))
    for start, origins in _chunks(plan, n_adapters * len(plan.experts)):
        means = expert_means(lags, origins, horizon=plan.horizon, names=plan.experts)
        actual, valid = _actuals(lags, origins, plan.horizon)
        fold = folds[start : start + len(origins)]
        for g, point in enumerate(grid):
            errors = np.abs(np.tensordot(point, means, axes=1) - actual) * valid[..., None]
            by_unit = np.einsum("uh,sha->usa", mask, errors)
            for f in (0, 1):
                totals[f, g] += by_unit[:, fold == f].sum(axis=1)
        for k in range(plan.naive):
            errors = np.abs(means[k] - actual)
            naive[k, :, start : start + len(origins)] = _per_origin(errors, valid, band_mask)
    return totals, naive


def crossfit(
    lags: Lags,
    plan: Plan,
    per_fold: FloatArray,
    shares: FloatArray,
    busy: BoolArray,
    rule: ShiftRule,
) -> tuple[FloatArray, FloatArray, dict[int, Cells]]:
    """The mean error per (band, origin, adapter) of the out-of-fold stack and of the
    naive target (``shares`` of the naive forecasts), and each band's busy cells.
    """
    bands = sorted(set(plan.unit_band))
    unit_of_step = np.zeros(plan.horizon, dtype=np.int64)
    for unit, (start, end) in enumerate(plan.unit_steps):
        unit_of_step[start:end] = unit
    band_of_step = np.asarray(plan.unit_band)[unit_of_step]
    crossed = np.zeros((len(bands), len(plan.origins), lags.counts.shape[1]))
    naive_loss = np.zeros_like(crossed)
    parts: dict[int, list[Cells]] = {band: [] for band in bands}
    folds = plan.folds
    every = detect_shifts(lags, plan.origins, rule)
    for start, origins in _chunks(plan, lags.counts.shape[1] * len(plan.experts)):
        means = expert_means(lags, origins, horizon=plan.horizon, names=plan.experts)
        actual, valid = _actuals(lags, origins, plan.horizon)
        other = 1 - folds[start : start + len(origins)]
        # weights per (origin, step, adapter, expert): the other fold's, for the step's unit
        chosen = per_fold[other][:, unit_of_step]
        stacked = np.einsum("esha,shae->sha", means, chosen)
        shifts = every.take(slice(start, start + len(origins)))
        level = level_forecast(lags, origins, shifts, horizon=plan.horizon, rule=rule)
        rows = slice(start, start + len(origins))
        for index, band in enumerate(bands):
            steps = (band_of_step == band).astype(np.float64)[None]
            naive = np.einsum("esha,ea->sha", means[: plan.naive], shares[index])
            # An origin too late for any step of the band scores nothing (NaN).
            scored = np.where((valid * steps).sum(axis=1) > 0, 1.0, np.nan)[:, None]
            crossed[index, rows] = _per_origin(np.abs(stacked - actual), valid, steps)[0] * scored
            naive_loss[index, rows] = _per_origin(np.abs(naive - actual), valid, steps)[0] * scored
            keep = ((valid * steps) > 0)[..., None] & busy[None, None, :]
            parts[band].append(_cells(keep, actual, stacked, naive, level, shifts, origins))
    cells = {band: Cells.concat(chunks) for band, chunks in parts.items() if chunks}
    return crossed, naive_loss, cells


def _cells(
    keep: BoolArray,
    actual: FloatArray,
    stacked: FloatArray,
    naive: FloatArray,
    level: FloatArray,
    shifts: Shifts,
    origins: IntArray,
) -> Cells:
    shape = actual.shape

    def spread(values: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        return np.broadcast_to(values[:, None, :], shape)[keep]

    return Cells(
        actual=actual[keep],
        stacked=stacked[keep],
        naive=naive[keep],
        level=level[keep],
        kind=spread(shifts.kind).astype(np.int8),
        ratio=spread(shifts.ratio).astype(np.float64),
        recent=spread(shifts.level).astype(np.float64),
        column=np.broadcast_to(np.arange(shape[-1])[None, None, :], shape)[keep],
        origin=np.broadcast_to(origins[:, None, None], shape)[keep],
        step=np.broadcast_to(np.arange(shape[1])[None, :, None], shape)[keep],
    )
