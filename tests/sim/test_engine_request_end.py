"""The replay's router sees a request's end as the live proxy sees its stream end: the
victim's idle time counts from its last request's end (``SimPod.last_seen``), while
``last_used`` keeps the start (what the controller's log says); on vLLM the end also
touches the adapter in the engine's LRU (``SimPod.last_step``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from placement.residency import EngineModel
from placement.settings import Settings
from placement.sim.engine import FleetReplay, SimLog, SimRouter
from placement.sim.pods import PodSpec, SimPod
from placement.sim.replay import run_policy
from placement.sim.workload import SimWorkload
from tests import factories

MB = 1_000_000


def full_pod(engine: EngineModel) -> SimPod:
    """A pod holding "a" then "b" on its two slots, "a" used at 0 s and "b" at 5 s."""
    pod = SimPod(PodSpec(pod_id="p", max_loras=2, max_cpu_loras=2, engine=engine))
    for adapter in ("a", "b"):
        pod.fetch(adapter, now_s=0.0, busy=())
        pod.land(adapter, 0.0)
    pod.use("a", 0.0)
    pod.use("b", 5.0)
    return pod


@pytest.mark.parametrize(
    ("engine", "victim", "victim_seen_s"),
    [(EngineModel.VLLM, "b", 5.0), (EngineModel.SGLANG, "a", 20.0)],
    ids=["vllm-last-step-touches", "sglang-lru-stays"],
)
def test_a_requests_end_is_its_adapters_last_use(
    engine: EngineModel, victim: str, victim_seen_s: float
) -> None:
    pod = full_pod(engine)
    pod.end("a", 20.0)  # a request on "a" from 0 s to 20 s
    assert next(iter(pod.gpu_adapters)) == victim
    assert pod.victim_last_used_s == victim_seen_s
    assert pod.last_used["a"] == 0.0, "the start, as the controller's log has it"
    assert pod.agrees()


def test_in_a_replay_each_adapter_is_last_seen_at_its_last_requests_end() -> None:
    arrivals = [(0.0, "a", 2000), (1.0, "b", 5), (30.0, "b", 5)]
    load = SimWorkload(
        start=datetime(2026, 3, 10, tzinfo=UTC),
        arrival_s=[moment for moment, _, _ in arrivals],
        adapters=[adapter for _, adapter, _ in arrivals],
        prompt_tokens=[100] * len(arrivals),
        output_tokens=[steps for _, _, steps in arrivals],
        size_bytes=dict.fromkeys("ab", 50 * MB),
    )
    replays: list[FleetReplay] = []

    class Kept(FleetReplay):
        def run(self, router: SimRouter) -> SimLog:
            replays.append(self)
            return super().run(router)

    fleet = factories.replay_fleet(1, max_loras=2, max_cpu_loras=8)
    log = run_policy("epp", load, fleet, settings=Settings(), replay_type=Kept).log
    (pod,) = replays[0].pods
    assert log.end_s[0] > log.end_s[2] > 30.0, "a's long request ends last"
    assert pod.last_seen == {"a": log.end_s[0], "b": log.end_s[2]}
    assert pod.last_used["a"] < 1.0 and pod.last_used["b"] < log.end_s[2]
