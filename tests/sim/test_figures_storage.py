"""Two figures beside a replay's totals: the fewest storage reads the fleet's host places
allow (``storage_read_bound``) and the requests just after a pod's loss
(``after_pod_loss``)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.sim.engine import COLD_LOAD, CPU_HIT, GPU_HIT, REJECTED, SimLog
from placement.sim.faults import DOWN, RESTART, UP, FaultStep
from placement.sim.figures import after_pod_loss, storage_read_bound


def lru_reads(adapters: list[str], places: int) -> int:
    held: OrderedDict[str, None] = OrderedDict()
    reads = 0
    for adapter in adapters:
        if adapter in held:
            held.move_to_end(adapter)
            continue
        reads += 1
        held[adapter] = None
        if len(held) > places:
            held.popitem(last=False)
    return reads


@pytest.mark.parametrize(
    ("places", "reads"),
    [(0, 6), (1, 6), (2, 4), (3, 3)],
    ids=["no place", "one place", "two: c evicts b, asked for last", "all fit"],
)
def test_the_bound_evicts_the_adapter_asked_for_furthest_ahead(places: int, reads: int) -> None:
    assert storage_read_bound(["a", "b", "a", "c", "a", "b"], places) == reads


@given(
    adapters=st.lists(st.sampled_from("abcdefgh"), max_size=60),
    places=st.integers(min_value=1, max_value=8),
)
def test_no_demand_policy_reads_less_and_more_places_never_read_more(
    adapters: list[str], places: int
) -> None:
    bound = storage_read_bound(adapters, places)
    assert len(set(adapters)) <= bound <= lru_reads(adapters, places)
    assert storage_read_bound(adapters, places + 1) <= bound


def log_of(outcomes: list[int], ttft_ms: list[float]) -> SimLog:
    count = len(outcomes)
    return SimLog(pod=[0] * count, outcome=outcomes, ttft_ms=ttft_ms, end_s=[0.0] * count)


def test_after_a_pod_loss_counts_the_requests_of_its_window_only() -> None:
    arrivals = [10.0, 100.0, 110.0, 150.0, 400.0, 1000.0, 1010.0]
    outcomes = [GPU_HIT, COLD_LOAD, REJECTED, CPU_HIT, GPU_HIT, GPU_HIT, COLD_LOAD]
    ttft = [50.0, 900.0, 0.0, 100.0, 50.0, 60.0, 800.0]
    steps = [
        FaultStep(at_s=100.0, kind=RESTART, pod_id="pod-0"),
        FaultStep(at_s=1000.0, kind=DOWN, pod_id="pod-1"),
        FaultStep(at_s=1300.0, kind=UP, pod_id="pod-1"),  # a pod's return is no loss
    ]
    figures = after_pod_loss(log_of(outcomes, ttft), arrivals, steps, after_s=60.0)
    # 100, 110 and 150 after the restart; 1000 and 1010 after the outage's start.
    assert figures == {
        "pod_losses": 2,
        "requests": 5,
        "served_share": 0.8,
        "gpu_hit_rate": 0.25,
        "cold_loads_on_critical_path": 2,
        "ttft_p95_ms": pytest.approx(885.0),
    }


def test_without_a_pod_loss_the_window_is_empty() -> None:
    figures = after_pod_loss(log_of([GPU_HIT], [50.0]), [5.0], [], after_s=60.0)
    assert (figures["pod_losses"], figures["requests"], figures["served_share"]) == (0, 0, 0.0)
