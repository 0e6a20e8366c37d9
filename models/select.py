"""Selection per adapter and horizon by a rolling-origin backtest, shrunk toward naive.

``Selecting`` (the ``auto`` model) replays cheap experts (``models.experts``) from many
origins over the last ``days`` days of the history: every bucket for the first hour,
every ``long_every`` buckets for the day. For each adapter it then

1. stacks a few experts: the convex weights, on a grid, with the lowest absolute error
   per step of the first hour (persistence, the last half hour's mean, the last hour's
   median, the last bucket moved along the adapter's daily shape) and per band beyond
   (yesterday, the 7-day median, yesterday smoothed over neighbouring buckets, the
   recent days weighted toward yesterday);
2. shrinks those weights toward its naive target (persistence within the hour; beyond,
   yesterday and the 7-day median mixed by 1/error**2, which is the better of the two
   when one is clearly better) in proportion to the evidence against the naive target:
   the t statistic, over blocks of origins (2 h, or days), of its excess error over the
   stack's out-of-fold error (weights fitted on the other half of the blocks). The stack
   has all the weight at ``z_short`` (first hour) or ``z_full``, none at 0. Without a
   backtest (short history), or for an adapter younger than the backtest needs, the
   naive forecast is used alone; with one to ``min_days`` days, yesterday is a naive
   forecast of the first hour too. Right after the last bucket jumped (``jump_factor``
   away from the buckets before it), the first hour's stack keeps that trust only as far
   as it beat persistence at the backtest's origins right after such jumps (a t
   statistic over those origins: a drop that lasts is persistence's, a lone spike the
   smoothers');
3. forecasts an adapter that just changed level (``models.shifts``: stopped, surged,
   dropped, appeared) from its new level, as far as the backtest's changes say that
   pays (``follow``; all the way after a stop and half otherwise when it saw too few);
4. sets the q90 and q99 band from the backtest's out-of-fold errors, wider after a
   change (``models.bands``); within the first hour the band grows as the square root
   of the forecast through the day, beyond in proportion to it (``day_band_power``).

Pure: no IO, no clock, no logging.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from models.bands import (
    BOUNDARY,
    LEVELS,
    band_factors,
    band_residuals,
    day_phase,
    default_factors,
    hourly_factors,
)
from models.experts import EXPERTS, Lags
from models.rolling import Plan, crossfit, grid_losses, simplex
from models.selected import FittedSelection, SelectionSettings, jump_mask, typical
from models.series import CountPanel, FloatArray, IntArray
from models.shrink import (
    FOLLOW,
    after_change,
    follow_weights,
    jump_trust,
    naive_share,
    trust_from_evidence,
)

__all__ = ["FittedSelection", "Selecting", "SelectionSettings"]

BoolArray = npt.NDArray[np.bool_]
#: Experts that read the daily shape (the same as persistence without a past day).
SHAPED = ("shaped-persistence",)


@dataclass(frozen=True, kw_only=True)
class Selecting(SelectionSettings):
    """The ``auto`` model: its settings (``models.selected.SelectionSettings``) and the fit."""

    def fit(self, history: CountPanel) -> FittedSelection:
        n, per_day = history.n_buckets, history.per_day()
        n_bands, n_adapters = len(self.band_edges) + 1, len(history.adapters)
        weights = np.zeros((self.band_edges[0] + n_bands - 1, len(EXPERTS), n_adapters))
        weights[: self.band_edges[0], EXPERTS.index(self.short_experts[0])] = 1.0
        fallback = self.day_experts[1] if n >= 2 * per_day else self.day_experts[0]
        weights[self.band_edges[0] :, EXPERTS.index(fallback if n >= per_day else "mean-3")] = 1.0
        scale = np.zeros((n_bands, n_adapters))
        factors = np.stack([default_factors()] * n_bands)
        follow = np.stack([FOLLOW] * n_bands)
        plans = self._plans(n, per_day)
        notes = self._notes(plans, n, per_day)
        lags = Lags.of(
            history.counts, per_day=per_day, first=min((p.first for p in plans), default=n)
        )
        first_seen = _first_seen(history.counts)
        busy = _busy(history.counts, self.busy_share)
        jump_weights = weights[: self.band_edges[0]].copy()
        hourly = np.ones((BOUNDARY + 1, len(LEVELS)))
        phase = day_phase(history.start_s, history.bucket_s)
        for plan in plans:
            fitted = _fit_plan(self, lags, plan, first_seen=first_seen, busy=busy, phase=phase)
            for unit in range(len(plan.unit_band)):
                weights[plan.first_unit + unit] = _expand(fitted.weights[unit], plan.experts)
                if fitted.jump_weights is not None:
                    jump_weights[unit] = _expand(fitted.jump_weights[unit], plan.experts)
            if fitted.hourly is not None:
                hourly = fitted.hourly
            for band, (band_scale, band_factor, band_follow) in fitted.bands.items():
                scale[band], factors[band], follow[band] = band_scale, band_factor, band_follow
        return FittedSelection(
            settings=self,
            weights=weights,
            jump_weights=jump_weights,
            scale=scale,
            factors=factors,
            follow=follow,
            hourly=hourly,
            adapters=history.adapters,
            notes=tuple(notes),
        )

    def _plans(self, n: int, per_day: int) -> list[Plan]:
        """The backtest origins: one plan for the first band, one for the rest."""
        plans = []
        short = self.band_edges[0]
        if n >= self.min_short:
            origins = np.arange(max(1, n - self.days * per_day), n, self.short_every)
            # With a day or two, the backtest cannot tell yet whether an adapter repeats
            # daily (a login at 09:00) or runs on: yesterday joins persistence as naive.
            hedge = per_day <= n < self.min_days * per_day
            experts = self.short_experts
            if n < per_day:  # no day to shape by: the shaped experts are persistence
                experts = tuple(e for e in experts if e not in SHAPED)
            if hedge:
                experts = (experts[0], "yesterday", *experts[1:])
            plans.append(
                Plan(
                    origins=origins.astype(np.int64),
                    experts=experts,
                    naive=2 if hedge else 1,
                    grid=self.short_grid,
                    horizon=short,
                    unit_band=(0,) * short,
                    unit_steps=tuple((step, step + 1) for step in range(short)),
                    first_unit=0,
                    block=12,
                    min_age=self.min_short,
                )
            )
        if n >= self.min_days * per_day:
            first = max(per_day, n - self.days * per_day)
            origins = np.arange(first, n - short, self.long_every)
            edges = (*self.band_edges, per_day)
            plans.append(
                Plan(
                    origins=origins.astype(np.int64),
                    experts=self.day_experts,
                    naive=2,
                    grid=self.day_grid,
                    horizon=per_day,
                    unit_band=tuple(range(1, len(edges))),
                    unit_steps=tuple(itertools.pairwise(edges)),
                    first_unit=short,
                    block=per_day,
                    min_age=self.min_days * per_day,
                )
            )
        return [p for p in plans if len(p.origins)]

    def _notes(self, plans: list[Plan], n: int, per_day: int) -> list[str]:
        days = f"{self.name}: {n / per_day:.1f} day(s) of history is too short to select"
        if not plans:
            return [f"{days} by backtest; naive forecasts only"]
        if plans[-1].first_unit == 0:
            return [
                f"{days} past {self.band_edges[0]} buckets (it takes {self.min_days}); "
                "naive forecasts there"
            ]
        return []


@dataclass(frozen=True, kw_only=True, eq=False)
class _PlanFit:
    weights: FloatArray  # (unit, plan expert, adapter)
    #: The first band's weights after the last bucket jumped (None past the first band).
    jump_weights: FloatArray | None
    bands: dict[int, tuple[FloatArray, FloatArray, FloatArray]]  # band -> scale, factors, follow
    #: The first band's steady factors per hour of day and past a day boundary, over the
    #: pooled one (None past the first band).
    hourly: FloatArray | None


def _fit_plan(
    settings: SelectionSettings,
    lags: Lags,
    plan: Plan,
    *,
    first_seen: IntArray,
    busy: BoolArray,
    phase: int,
) -> _PlanFit:
    grid = simplex(len(plan.experts), plan.grid)
    mask = plan.unit_mask()
    folds = plan.folds
    totals, naive_loss = grid_losses(lags, plan, grid, mask, folds)
    per_fold = grid[totals.argmin(axis=1)]  # (fold, unit, adapter, expert)
    stacked = grid[totals.sum(axis=0).argmin(axis=0)]  # (unit, adapter, expert)
    bands = sorted(set(plan.unit_band))
    shares = np.stack(
        [
            naive_share(naive_loss[:, i].mean(axis=1), settings.naive_power)
            for i in range(len(bands))
        ]
    )  # (band, naive, adapter)
    crossed, naive, cells = crossfit(lags, plan, per_fold, shares, busy, settings.shift_rule)
    blocks = plan.origins // plan.block
    young = lags.n_buckets - first_seen < plan.min_age
    weights = np.zeros((len(plan.unit_steps), len(plan.experts), lags.counts.shape[1]))
    jump_weights = weights.copy() if plan.first_unit == 0 else None
    fitted: dict[int, tuple[FloatArray, FloatArray, FloatArray]] = {}
    hourly: FloatArray | None = None
    usual = typical(lags, settings.days)
    for index, band in enumerate(bands):
        band_crossed, own = crossed[index], naive[index]
        z_full = settings.z_short if plan.first_unit == 0 else settings.z_full
        trust = np.where(young, 0.0, trust_from_evidence(own - band_crossed, blocks, z_full))
        target = np.zeros((len(plan.experts), len(trust)))
        target[: plan.naive] = shares[index]
        for unit in (u for u, b in enumerate(plan.unit_band) if b == band):
            weights[unit] = trust * stacked[unit].T + (1.0 - trust) * target
        if jump_weights is not None:
            jump = jump_mask(settings, lags, plan.origins)
            excess = own - band_crossed
            kept = trust * jump_trust(excess, jump, busy, settings.min_jumps, settings.z_jump)
            for unit in (u for u, b in enumerate(plan.unit_band) if b == band):
                jump_weights[unit] = kept * stacked[unit].T + (1.0 - kept) * target
        scale = trust * np.nanmean(band_crossed, axis=0) + (1.0 - trust) * np.nanmean(own, axis=0)
        band_cells = cells.get(band)
        follow = FOLLOW.copy()
        factors = default_factors()
        if band_cells is not None:
            selected = band_cells.selected(trust)
            follow = follow_weights(band_cells, selected, settings.min_changes)
            mean = after_change(selected, band_cells.level, band_cells.kind, follow)
            power = settings.band_power if plan.first_unit == 0 else settings.day_band_power
            margin = settings.day_margin if plan.first_unit else settings.short_margin
            residuals = band_residuals(
                band_cells, mean=mean, scale=scale, typical=usual, power=power
            )
            factors = band_factors(residuals, min_changes=settings.min_changes, margin=margin)
            if plan.first_unit == 0 and settings.hourly_min_cells is not None:
                hourly = hourly_factors(
                    residuals,
                    per_day=lags.per_day,
                    phase=phase,
                    min_cells=settings.hourly_min_cells,
                    margin=margin,
                    boundary=settings.boundary_band,
                )
        fitted[band] = (scale, factors, follow)
    return _PlanFit(weights=weights, jump_weights=jump_weights, bands=fitted, hourly=hourly)


def _expand(weights: FloatArray, names: tuple[str, ...]) -> FloatArray:
    """Weights over a plan's experts ``(expert, adapter)`` as weights over all experts."""
    out = np.zeros((len(EXPERTS), weights.shape[1]))
    for row, name in enumerate(names):
        out[EXPERTS.index(name)] = weights[row]
    return out


def _first_seen(counts: FloatArray) -> IntArray:
    seen = counts > 0
    first = np.where(seen.any(axis=0), seen.argmax(axis=0), counts.shape[0])
    return np.asarray(first, dtype=np.int64)


def _busy(counts: FloatArray, share: float) -> BoolArray:
    totals = counts.sum(axis=0)
    grand = totals.sum()
    return np.asarray(totals >= share * grand if grand > 0 else np.zeros(len(totals), dtype=bool))
