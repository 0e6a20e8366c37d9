"""Tiering by traffic: propose hot, warm or cold for every adapter from its forecast rate.

Adapter traffic is power-law shaped: a few adapters carry most requests and
deserve a GPU slot, a middle band is worth a host-RAM registration, and the long tail
pays a load from storage. The boundaries come from the budgets: the hot boundary is
the rate of the adapter that would take the last GPU slot, the warm boundary the rate
of the one that would take the last host-cache place.

Hysteresis keeps an adapter near a boundary from flapping between plans: one that is
not yet in a tier must beat the boundary by ``promote_factor``; one already in it
stays until it falls below ``demote_factor`` times the boundary.

Pure: numbers in, a proposal out. Tiering proposes; the placement solver decides
within the budgets. Imports nothing from ``placement``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class ProposedTier(enum.StrEnum):
    HOT = "hot"
    WARM = "warm"
    COLD = "cold"


_RANK = {ProposedTier.COLD: 0, ProposedTier.WARM: 1, ProposedTier.HOT: 2}


@dataclass(frozen=True, kw_only=True)
class TieringRule:
    """How many places each tier has, and how sticky a tier is."""

    #: Distinct adapters that fit on GPU slots across the pool (slots per pod times pods,
    #: divided by the replicas a hot adapter typically takes).
    hot_places: int
    #: Distinct adapters that fit registered in host RAM, hot ones included.
    warm_places: int
    #: The hysteresis above (``PlannerSettings.promote_factor``, ``demote_factor``).
    promote_factor: float
    demote_factor: float


@dataclass(frozen=True, kw_only=True)
class TierProposal:
    tier: ProposedTier
    rate_rps: float
    #: The rate an adapter had to reach (or keep) for this tier; 0 for cold.
    threshold_rps: float
    reason: str


def boundary_rps(rates_rps: Mapping[str, float], places: int) -> float:
    """The rate of the adapter that takes the last of ``places``; 0 when all fit."""
    ordered = sorted((rate for rate in rates_rps.values() if rate > 0.0), reverse=True)
    if places <= 0:
        return float("inf")
    if len(ordered) <= places:
        return 0.0
    return ordered[places - 1]


def _holds(rate: float, boundary: float, *, was_in: bool, rule: TieringRule) -> bool:
    if rate <= 0.0 or boundary == float("inf"):
        return False
    factor = rule.demote_factor if was_in else rule.promote_factor
    return rate >= boundary * factor


def propose_tiers(
    rates_rps: Mapping[str, float],
    previous: Mapping[str, ProposedTier],
    *,
    rule: TieringRule,
) -> dict[str, TierProposal]:
    """A tier for every adapter in ``rates_rps``, sticky around the boundaries.

    ``previous`` holds each adapter's tier in the plan now in force (missing means
    cold). Adapters are returned in the order of ``rates_rps``.
    """
    hot_rps = boundary_rps(rates_rps, rule.hot_places)
    warm_rps = boundary_rps(rates_rps, rule.warm_places)
    proposals: dict[str, TierProposal] = {}
    for name, rate in rates_rps.items():
        before = previous.get(name, ProposedTier.COLD)
        was_hot = _RANK[before] >= _RANK[ProposedTier.HOT]
        was_warm = _RANK[before] >= _RANK[ProposedTier.WARM]
        if _holds(rate, hot_rps, was_in=was_hot, rule=rule):
            proposals[name] = _proposal(ProposedTier.HOT, rate, hot_rps, before)
        elif _holds(rate, warm_rps, was_in=was_warm, rule=rule):
            proposals[name] = _proposal(ProposedTier.WARM, rate, warm_rps, before)
        else:
            proposals[name] = _proposal(ProposedTier.COLD, rate, warm_rps, before)
    return proposals


def _proposal(
    tier: ProposedTier, rate: float, boundary: float, before: ProposedTier
) -> TierProposal:
    if tier is ProposedTier.COLD:
        if rate <= 0.0:
            reason = "no forecast traffic"
        else:
            reason = f"{rate:.4g} rps is below the warm boundary {boundary:.4g} rps"
        return TierProposal(tier=tier, rate_rps=rate, threshold_rps=0.0, reason=reason)
    if before is tier:
        verb = "stays"
    elif _RANK[before] < _RANK[tier]:
        verb = "promoted"
    else:
        verb = "demoted"
    reason = f"{verb} {tier.value}: {rate:.4g} rps against a boundary of {boundary:.4g} rps"
    return TierProposal(tier=tier, rate_rps=rate, threshold_rps=boundary, reason=reason)
