"""Faults delivered to the replay's pods (``placement.sim.deliveries``): an outage sends
the requests queued at the lost pod elsewhere."""

from __future__ import annotations

from placement.sim.engine import COLD_LOAD
from placement.sim.faults import DOWN, UP, FaultSchedule, FaultStep
from tests.sim.test_engine import fleet_of, replay, workload


def test_an_outage_sends_the_pods_queue_to_another_pod() -> None:
    # Ten requests for one adapter coalesce on pod-0 while it loads it; pod-0 is lost
    # before the load lands: every one of them is served by pod-1, after its own load.
    load = workload([(i * 0.001, "a") for i in range(10)])
    lost = FaultStep(at_s=0.05, kind=DOWN, pod_id="pod-0")
    back = FaultStep(at_s=60.0, kind=UP, pod_id="pod-0")
    calm = replay("bounded", load, fleet_of(2))
    assert set(calm.log.pod) == {0}
    result = replay("bounded", load, fleet_of(2), faults=FaultSchedule(steps=(lost, back)))
    assert result.log.pod == [1] * 10
    assert result.log.outcome == [COLD_LOAD] * 10
    assert result.metrics["served"] == 10
    ((_, _, first, _), (moved_at, _, second, _)) = result.log.loads
    assert (first, second, moved_at) == (0, 1, 0.05)
    assert min(result.log.ttft_ms) > 95.0  # pod-1's own load, from the outage on
