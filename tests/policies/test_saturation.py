"""Saturation and shedding: the reference EPP's detector, and the simulated EPP's 503."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.settings import MB, LoadCostSettings, RouterSettings
from policies.routing import PodSnapshot, RouteReason, RoutingContext, route_epp
from policies.saturation import (
    REFERENCE_EPP,
    Criticality,
    SaturationThresholds,
    has_capacity,
    is_saturated,
    sheds,
)

MED = "medical-qa-hipaa"
_ROUTER = RouterSettings()
_COST = LoadCostSettings()


def _pod(name: str, queue: int = 0, kv: float = 0.0, **fields: Any) -> PodSnapshot:
    return PodSnapshot(pod_id=name, queue_depth=queue, kv_usage=kv, **fields)


def _context(pods: Sequence[PodSnapshot]) -> RoutingContext:
    return RoutingContext(
        adapter=MED,
        pods=pods,
        per_request_s=_ROUTER.per_request_s,
        warm_load_s=_COST.warm_load_ms(50 * MB, drain_ms=_COST.expected_drain_ms) / 1e3,
        cold_load_s=_COST.cold_load_ms(50 * MB, drain_ms=_COST.expected_drain_ms) / 1e3,
        no_load_kv_usage=_ROUTER.no_load_kv_usage,
        reject_kv_usage=_ROUTER.reject_kv_usage,
    )


def test_the_reference_defaults() -> None:
    assert (REFERENCE_EPP.queue_depth, REFERENCE_EPP.kv_usage) == (5, 0.8)


@pytest.mark.parametrize(
    ("pods", "saturated"),
    [
        ([(6, 0.1), (9, 0.2), (5, 0.3)], False),
        ([(6, 0.1), (9, 0.2), (7, 0.3)], True),
        ([(0, 0.85), (1, 0.9)], True),
        ([(6, 0.1), (0, 0.81), (5, 0.8)], False),
        ([], True),
    ],
    ids=["one-at-the-queue-line", "every-queue-over", "every-kv-over", "one-at-both", "no-pods"],
)
def test_saturated_when_no_pod_has_capacity(pods: list[tuple[int, float]], saturated: bool) -> None:
    views = [_pod(f"p{k}", queue, kv) for k, (queue, kv) in enumerate(pods)]
    assert is_saturated(views, REFERENCE_EPP) is saturated


@given(
    st.lists(st.tuples(st.integers(0, 20), st.floats(0.0, 1.0)), max_size=12),
    st.integers(0, 10),
    st.floats(0.0, 1.0),
)
def test_saturation_is_no_pod_with_capacity(
    pods: list[tuple[int, float]], queue_line: int, kv_line: float
) -> None:
    thresholds = SaturationThresholds(queue_depth=queue_line, kv_usage=kv_line)
    views = [_pod(f"p{k}", queue, kv) for k, (queue, kv) in enumerate(pods)]
    assert is_saturated(views, thresholds) is not any(has_capacity(v, thresholds) for v in views)
    # One pod with room is enough to take the pool out of saturation.
    room = _pod("room", queue_line, kv_line)
    assert not is_saturated([*views, room], thresholds)


@pytest.mark.parametrize(
    ("criticality", "saturated", "shed"),
    [
        (Criticality.SHEDDABLE, True, True),
        (Criticality.SHEDDABLE, False, False),
        (Criticality.STANDARD, True, False),
        (Criticality.CRITICAL, True, False),
    ],
    ids=["sheddable-saturated", "sheddable-room", "standard-saturated", "critical-saturated"],
)
def test_only_sheddable_requests_are_shed(
    criticality: Criticality, saturated: bool, shed: bool
) -> None:
    assert sheds(criticality, saturated=saturated) is shed


@pytest.mark.parametrize(
    ("priority", "criticality"),
    [(-1, Criticality.SHEDDABLE), (-100, Criticality.SHEDDABLE), (0, Criticality.STANDARD)],
    ids=["minus-one", "very-negative", "default-zero"],
)
def test_priority_below_zero_is_sheddable(priority: int, criticality: Criticality) -> None:
    assert Criticality.of_priority(priority) is criticality


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"queue_depth": -1}, "saturation queue_depth must be 0 or more, not -1"),
        ({"kv_usage": 1.5}, "saturation kv_usage must be within 0-1, not 1.5"),
    ],
    ids=["negative-queue", "kv-over-one"],
)
def test_bad_thresholds_are_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SaturationThresholds(**fields)


# --- the simulated EPP ----------------------------------------------------------------


def test_epp_sheds_when_every_pod_is_past_the_line() -> None:
    pods = [_pod("a", 6, gpu_adapters=(MED,)), _pod("b", 12), _pod("c", 0, kv=0.82)]
    decision = route_epp(_context(pods))
    assert (decision.pod_id, decision.reason) == (None, RouteReason.REJECT)


def test_epp_routes_while_one_pod_has_room() -> None:
    # The pod with room need not win: the score still prefers the adapter's pod.
    pods = [_pod("a", 6, gpu_adapters=(MED,), running_adapters=frozenset({MED})), _pod("b", 5)]
    assert route_epp(_context(pods)).pod_id == "a"


def test_a_standard_request_is_never_shed() -> None:
    pods = [_pod("a", 12), _pod("b", 9, gpu_adapters=(MED,))]
    decision = route_epp(_context(pods), criticality=Criticality.STANDARD)
    assert decision.pod_id == "b"


@given(st.lists(st.tuples(st.integers(0, 12), st.floats(0.0, 0.84)), min_size=1, max_size=8))
def test_epp_sheds_exactly_when_saturated(pods: list[tuple[int, float]]) -> None:
    views = [_pod(f"p{k}", queue, kv) for k, (queue, kv) in enumerate(pods)]
    decision = route_epp(_context(views))
    if is_saturated(views, REFERENCE_EPP):
        assert decision.reason is RouteReason.REJECT
    else:
        assert decision.pod_id is not None
