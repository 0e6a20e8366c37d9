"""Tiering proposes hot, warm and cold by rate, and does not flap near a boundary."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.tiering import ProposedTier, TieringRule, boundary_rps, propose_tiers

HOT, WARM, COLD = ProposedTier.HOT, ProposedTier.WARM, ProposedTier.COLD
RULE = TieringRule(hot_places=2, warm_places=4, promote_factor=1.25, demote_factor=0.8)
#: Boundaries for these rates: hot at the 2nd rate (8.0), warm at the 4th (2.0).
RATES = {"a": 10.0, "b": 8.0, "c": 7.0, "d": 2.0, "e": 1.9, "f": 0.0}


def test_boundaries_are_the_rates_of_the_last_place() -> None:
    assert boundary_rps(RATES, 2) == 8.0
    assert boundary_rps(RATES, 4) == 2.0
    assert boundary_rps(RATES, 10) == 0.0
    assert boundary_rps(RATES, 0) == float("inf")


@pytest.mark.parametrize(
    ("name", "previous", "expected"),
    [
        pytest.param("a", COLD, HOT, id="far-above-hot-boundary-promoted"),
        pytest.param("b", COLD, WARM, id="at-hot-boundary-not-enough-to-promote"),
        pytest.param("b", HOT, HOT, id="at-hot-boundary-stays-hot"),
        pytest.param("c", HOT, HOT, id="just-below-hot-boundary-stays-hot"),
        pytest.param("c", WARM, WARM, id="just-below-hot-boundary-stays-warm"),
        pytest.param("d", WARM, WARM, id="at-warm-boundary-stays-warm"),
        pytest.param("d", COLD, COLD, id="at-warm-boundary-not-promoted"),
        pytest.param("e", HOT, WARM, id="hot-far-below-falls-to-warm"),
        pytest.param("f", HOT, COLD, id="no-traffic-is-cold"),
    ],
)
def test_hysteresis(name: str, previous: ProposedTier, expected: ProposedTier) -> None:
    proposals = propose_tiers(RATES, {name: previous}, rule=RULE)
    assert proposals[name].tier is expected


def test_reasons_name_the_move_and_the_numbers() -> None:
    proposals = propose_tiers(RATES, {"c": HOT}, rule=RULE)
    assert proposals["a"].reason.startswith("promoted hot: 10 rps")
    assert proposals["c"].reason.startswith("stays hot")
    assert proposals["f"].reason == "no forecast traffic"


def test_no_places_means_nothing_is_proposed_hot() -> None:
    rule = replace(RULE, hot_places=0, warm_places=0)
    assert {p.tier for p in propose_tiers(RATES, {}, rule=rule).values()} == {COLD}
