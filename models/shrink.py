"""Shrinking toward naive forecasts, and following a change of level.

The selecting model (``models.select``) weighs its stacked experts against the naive
forecasts by the evidence in its backtest: ``trust_from_evidence`` turns the naive
forecast's excess error per origin into the stack's weight; ``naive_share`` mixes the
naive forecasts into the shrink target; ``follow_weights`` learns from the backtest's
changes of level how far a changed adapter's forecast moves to its new level, and
``after_change`` applies it.

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from models.bands import Cells
from models.series import FloatArray, IntArray
from models.shifts import Change

#: How far a changed adapter's forecast follows its new level ([stopped, other changes])
#: when the backtest saw too few changes to learn it.
FOLLOW = np.array([1.0, 0.5])


def naive_share(mean_loss: FloatArray, power: float | None) -> FloatArray:
    """Weights ``(naive, adapter)`` of the naive forecasts in the shrink target: by
    1/error**power, or all on the best one without a power.
    """
    if power is None:
        share = np.zeros_like(mean_loss)
        share[mean_loss.argmin(axis=0), np.arange(mean_loss.shape[1])] = 1.0
        return share
    floor = np.maximum(mean_loss.min(axis=0, keepdims=True), 1e-9)
    score = (floor / np.maximum(mean_loss, 1e-9)) ** power
    return np.asarray(score / score.sum(axis=0, keepdims=True), dtype=np.float64)


def follow_weights(cells: Cells, selected: FloatArray, min_changes: int) -> FloatArray:
    """How far to follow the new level ([stopped, other changes]): the weight, in tenths,
    with the lowest error over the backtest's cells after such a change.
    """
    follow = FOLLOW.copy()
    steps = np.linspace(0.0, 1.0, 11)
    for k, group in enumerate(
        (cells.kind == Change.STOPPED, cells.changed & (cells.kind != Change.STOPPED))
    ):
        if group.sum() >= min_changes:
            level, chosen, actual = cells.level[group], selected[group], cells.actual[group]
            errors = [np.abs(a * level + (1 - a) * chosen - actual).sum() for a in steps]
            follow[k] = steps[int(np.argmin(errors))]
    return follow


def after_change(
    selected: FloatArray, level: FloatArray, kind: npt.NDArray[np.int8], follow: FloatArray
) -> FloatArray:
    """The forecast with changed adapters moved toward their new level by ``follow``."""
    weight = np.where(kind == Change.STOPPED, follow[0], np.where(kind != 0, follow[1], 0.0))
    return np.asarray(weight * level + (1 - weight) * selected, dtype=np.float64)


def trust_from_evidence(excess: FloatArray, blocks: IntArray, z_full: float) -> FloatArray:
    """Weight of the stack per adapter: the t statistic of ``excess`` (naive minus stack
    error per origin) over blocks of origins, over ``z_full``, within [0, 1].
    """
    scored = ~np.isnan(excess).all(axis=1)
    excess, blocks = excess[scored], blocks[scored]
    labels = np.unique(blocks)
    if len(labels) < 2:
        return np.zeros(excess.shape[1])
    means = np.stack([excess[blocks == label].mean(axis=0) for label in labels])
    spread = means.std(axis=0, ddof=1) / np.sqrt(len(labels))
    average = means.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(spread > 0, average / spread, np.where(average > 0, np.inf, 0.0))
    return np.asarray(np.clip(np.nan_to_num(z / z_full, posinf=1.0), 0.0, 1.0), dtype=np.float64)


def jump_trust(
    excess: FloatArray,
    jump: npt.NDArray[np.bool_],
    busy: npt.NDArray[np.bool_],
    min_jumps: int,
    z_full: float,
) -> FloatArray:
    """Per adapter, how far the stack keeps its trust right after a jump: 1/2 plus the t
    statistic of ``excess`` (naive minus stack error per origin, NaN where not scored)
    over the backtest's origins right after a jump, over ``2 z_full``, within [0, 1]
    (all the weight to the naive forecast where it clearly won after jumps, none where
    it clearly lost). An adapter with under ``min_jumps`` such origins takes the busy
    adapters' pooled statistic.
    """
    at = jump & ~np.isnan(excess)
    values = np.where(at, excess, 0.0)
    count = at.sum(axis=0)
    own = _t_statistic(values.sum(axis=0), (values**2).sum(axis=0), count)
    pick = busy & (count > 0)
    pooled = _t_statistic(
        np.array([values[:, pick].sum()]),
        np.array([(values[:, pick] ** 2).sum()]),
        np.array([count[pick].sum()]),
    )
    t = np.where(count >= min_jumps, own, pooled)
    return np.asarray(np.clip(0.5 + t / (2.0 * z_full), 0.0, 1.0), dtype=np.float64)


def _t_statistic(total: FloatArray, squares: FloatArray, count: IntArray) -> FloatArray:
    """The t statistic of the mean from sums over ``count`` observations (0 under two)."""
    n = np.maximum(count, 1).astype(np.float64)
    mean = total / n
    var = np.maximum(squares / n - mean**2, 0.0) * n / np.maximum(n - 1.0, 1.0)
    spread = np.sqrt(var / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(spread > 0, mean / spread, np.sign(mean) * np.inf)
    return np.asarray(np.where(count >= 2, np.nan_to_num(t, posinf=1e9, neginf=-1e9), 0.0))
