"""The q90/q99 band of the selecting model, calibrated on its own backtest.

Each adapter's band is its forecast plus a factor times its error scale (the mean
absolute error of its selected forecast in that horizon band of the backtest). The
factor is the quantile of the normalised out-of-fold errors over the busy adapters'
cells (split-conformal calibration), computed apart for cells after a change of level
(``models.shifts``), where the scale also grows with the new level: a changed adapter's
band is wider, as its history says less about what comes next. With too few changes in
the backtest the changed factor is the steady one times ``CHANGED_WIDENING``. The
band never falls below the Poisson band of the mean.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.series import DAY_S, FloatArray, IntArray

#: Quantile levels of the band.
LEVELS = (0.9, 0.99)
#: Groups of the first hour's calibration: the hour of day of the origin (0-23), and
#: the steps past a day boundary the history has not reached.
HOURS = 24
BOUNDARY = HOURS
#: Day boundaries the backtest needs before the steps past one get their own factor.
MIN_BOUNDARIES = 3
#: The changed factor over the steady one when the backtest saw too few changes.
CHANGED_WIDENING = 1.5
#: After a change, the error scale is at least this share of the new level.
RECENT_SHARE = 0.5
#: The steady scale follows the forecast over the typical level, that ratio clipped to
#: this much either way before the power (0.2-5 at power 1/2, 1/25-25 at power 1).
SHAPE_CLIP = 25.0


@dataclass(frozen=True, kw_only=True, eq=False)
class Cells:
    """The busy adapters' backtest cells of one horizon band, flattened."""

    actual: FloatArray
    #: The out-of-fold stacked forecast, and the naive target of the band.
    stacked: FloatArray
    naive: FloatArray
    #: The forecast from the new level, the change (``models.shifts.Change``), how much.
    level: FloatArray
    kind: npt.NDArray[np.int8]
    ratio: FloatArray
    recent: FloatArray
    column: IntArray
    #: The backtest origin (bucket index) of each cell, and its step (0: the origin's bucket).
    origin: IntArray
    step: IntArray

    @classmethod
    def concat(cls, parts: list[Cells]) -> Cells:
        keys = (
            "actual",
            "stacked",
            "naive",
            "level",
            "kind",
            "ratio",
            "recent",
            "column",
            "origin",
            "step",
        )
        return cls(
            **{key: np.concatenate([getattr(p, key) for p in parts], axis=-1) for key in keys}
        )

    @property
    def changed(self) -> npt.NDArray[np.bool_]:
        return np.asarray(self.kind != 0)

    def selected(self, trust: FloatArray) -> FloatArray:
        """The fitted model's forecast before any change of level: stack and naive mixed."""
        share = trust[self.column]
        return np.asarray(share * self.stacked + (1 - share) * self.naive, dtype=np.float64)


def default_factors() -> FloatArray:
    """``(level, [steady, changed])`` factors when there is no backtest."""
    factors = np.ones((len(LEVELS), 2))
    factors[:, 1] = CHANGED_WIDENING
    return factors


@dataclass(frozen=True, kw_only=True, eq=False)
class Residuals:
    """The cells with a positive error scale: their errors over that scale, which are
    after a change, their backtest origins and steps.
    """

    residual: FloatArray
    changed: npt.NDArray[np.bool_]
    origin: IntArray
    step: IntArray


def band_residuals(
    cells: Cells,
    *,
    mean: FloatArray,
    scale: FloatArray,
    typical: FloatArray,
    power: float | FloatArray,
) -> Residuals:
    """The normalised errors of the fitted model's forecast ``mean`` in each cell."""
    column = cells.column
    sigma = widened(
        scale[column],
        cells.changed,
        cells.ratio,
        cells.recent,
        mean=mean,
        typical=typical[column],
        power=power,
    )
    ok = sigma > 0
    residual = (cells.actual - mean)[ok] / sigma[ok]
    return Residuals(
        residual=np.asarray(residual, dtype=np.float64),
        changed=np.asarray(cells.changed[ok]),
        origin=np.asarray(cells.origin[ok], dtype=np.int64),
        step=np.asarray(cells.step[ok], dtype=np.int64),
    )


def band_factors(residuals: Residuals, *, min_changes: int, margin: float = 0.0) -> FloatArray:
    """Factors ``(level, [steady, changed])`` on the error scale that give q90 and q99."""
    factors = default_factors()
    residual, changed = residuals.residual, residuals.changed
    if not len(residual):
        return factors
    for k, nominal in enumerate(LEVELS):
        level = nominal + margin * (1.0 - nominal)
        steady = residual[~changed]
        factors[k, 0] = max(float(np.quantile(steady, level)), 0.0) if len(steady) else 1.0
        factors[k, 1] = (
            max(float(np.quantile(residual[changed], level)), factors[k, 0])
            if changed.sum() >= min_changes
            else factors[k, 0] * CHANGED_WIDENING
        )
    return factors


def hourly_factors(
    residuals: Residuals,
    *,
    per_day: int,
    phase: int,
    min_cells: int,
    margin: float = 0.0,
    boundary: bool = True,
) -> FloatArray:
    """``(group, level)``: each group's steady factor over the pooled one. Groups 0-23
    are the hour of day of the origin; group ``BOUNDARY`` holds the cells past a day
    boundary the history had not reached (with ``boundary``; else, or with too few such
    cells, they stay in their hour and that row is NaN: the hour's factor applies).

    Each group gets its own quantile (Mondrian split-conformal calibration): the errors
    are not the same through the day (a morning ramp), and a bucket in a new day carries
    that day's volume, which nothing before midnight shows (a week's days can differ by
    half). An hour with fewer than ``min_cells`` steady cells keeps the pooled factor
    (ratio 1); the boundary needs as many, over ``MIN_BOUNDARIES`` day boundaries.
    ``phase``: the bucket of the day the panel starts at (``day_phase``).
    """
    ratios = np.ones((BOUNDARY + 1, len(LEVELS)))
    ratios[BOUNDARY] = np.nan
    steady = ~residuals.changed
    residual = residuals.residual[steady]
    origin, step = residuals.origin[steady], residuals.step[steady]
    group = _hour_of_day(origin + phase, per_day)
    past = past_boundary(origin, step, per_day=per_day, phase=phase)
    days = len(np.unique((origin + phase + step)[past] // per_day))
    if boundary and past.sum() >= min_cells and days >= MIN_BOUNDARIES:
        group = np.where(past, BOUNDARY, group)
    if not len(residual):
        return ratios
    for k, nominal in enumerate(LEVELS):
        level = nominal + margin * (1.0 - nominal)
        pooled = max(float(np.quantile(residual, level)), 0.0)
        if pooled <= 0:
            continue
        for g in np.unique(group):
            inside = group == g
            if inside.sum() >= min_cells:
                ratios[g, k] = max(float(np.quantile(residual[inside], level)), 0.0) / pooled
    return ratios


def past_boundary(
    origin: IntArray, step: IntArray, *, per_day: int, phase: int
) -> npt.NDArray[np.bool_]:
    """Whether the bucket ``step`` after ``origin`` is in a later day than the history's
    last bucket (the one before the origin).
    """
    last = (origin + phase - 1) % per_day
    return np.asarray(last + step + 1 >= per_day)


def first_hour_ratios(
    ratios: FloatArray, origin: int, steps: int, *, per_day: int, phase: int, boundary: bool
) -> FloatArray:
    """``(step, level)``: the fitted ratios (``hourly_factors``) of each of the first
    ``steps`` steps from ``origin``: the boundary's past a day boundary (with
    ``boundary``, where it was calibrated), the origin's hour of day's otherwise.
    """
    hour = int(_hour_of_day(np.array([origin + phase]), per_day)[0])
    picked = np.repeat(ratios[hour][None, :], steps, axis=0)
    if boundary and not np.isnan(ratios[BOUNDARY]).any():
        past = past_boundary(np.full(steps, origin), np.arange(steps), per_day=per_day, phase=phase)
        picked[past] = ratios[BOUNDARY]
    return np.asarray(picked, dtype=np.float64)


def day_phase(start_s: int, bucket_s: int) -> int:
    """The bucket of the (UTC) day a panel starting at ``start_s`` starts at."""
    return int((start_s % DAY_S) // bucket_s)


def _hour_of_day(origins: IntArray, per_day: int) -> IntArray:
    return np.asarray((origins % per_day) * HOURS // per_day, dtype=np.int64)


def widened(
    scale: FloatArray,
    changed: npt.NDArray[np.bool_],
    ratio: FloatArray,
    recent: FloatArray,
    *,
    mean: FloatArray,
    typical: FloatArray,
    power: float | FloatArray,
) -> FloatArray:
    """The error scale of each cell.

    Steady: the adapter's scale, following its forecast through the day (times the
    forecast over the adapter's typical level, clipped to ``SHAPE_CLIP`` either way, to
    ``power``). After a change: grown with
    the new level (never shrunk by it) and at least half the new level, since the past
    says little about it.
    """
    shape = np.clip((mean + 1.0) / (typical + 1.0), 1.0 / SHAPE_CLIP, SHAPE_CLIP) ** power
    grow = np.where(np.isfinite(ratio), np.maximum(ratio, 1.0), 1.0)
    after = np.maximum(scale * grow, RECENT_SHARE * recent)
    return np.asarray(np.where(changed, after, scale * shape), dtype=np.float64)
