"""``SimSettings.load_admission``: the default drain, and vLLM's scheduler ("vllm").

Under "vllm" a request whose adapter can get no GPU slot waits while requests behind it
on resident adapters run, a load does not drain the batch, and the load stalls the
running batch for its time (placement.sim.admission). Under "drain" a load drains the
batch and the pod admits nothing until it lands.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import Fleet
from placement.settings import LoadAdmission, LoadCostSettings, Settings, SimSettings
from placement.sim.engine import COLD_LOAD, GPU_HIT, FleetReplay
from placement.sim.pods import SimPod
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.routers import POLICIES
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from tests.sim.test_engine import MB, TRACES, catalog_of, fleet_of, workload

#: A request's prefill: 100 prompt tokens at the default 0.05 ms each.
PREFILL_MS = 100 * SimSettings().prefill_ms_per_token


def admitted(admission: LoadAdmission) -> Settings:
    base = Settings()
    return replace(base, sim=replace(base.sim, load_admission=admission))


def replay(
    admission: LoadAdmission,
    load: SimWorkload,
    fleet: Fleet,
    *,
    name: str = "epp",
    **options: object,
) -> ReplayResult:
    tree = admitted(admission)
    planning = replay_planning(catalog_of(load), fleet, settings=tree, planner="greedy")
    return run_policy(name, load, fleet, settings=tree, planning=planning, **options)  # type: ignore[arg-type]


def busy_slot() -> SimWorkload:
    """One GPU slot: "a" runs 100 steps (about 3 s) from 0.1 s, "b" asks at 0.5 s (its
    adapter would need the slot "a" runs on), "a" asks again at 0.6 s."""
    return workload([(0.0, "a"), (0.5, "b"), (0.6, "a")], output=100)


def test_under_vllm_a_resident_adapters_request_passes_a_queued_load() -> None:
    result = replay("vllm", busy_slot(), fleet_of(1, max_loras=1))
    assert result.log.outcome[2] == GPU_HIT
    assert result.log.ttft_ms[2] == pytest.approx(PREFILL_MS)


def test_under_vllm_the_new_adapter_waits_while_every_slot_is_busy() -> None:
    result = replay("vllm", busy_slot(), fleet_of(1, max_loras=1))
    log = result.log
    last_a_end_s = max(log.end_s[0], log.end_s[2])
    assert [start for start, *_ in log.loads] == [0.0, pytest.approx(last_a_end_s)]
    assert log.ttft_ms[1] > (last_a_end_s - 0.5) * 1000.0
    assert log.outcome[1] == COLD_LOAD


def test_under_drain_the_load_drains_the_batch_and_blocks_the_pod() -> None:
    result = replay("drain", busy_slot(), fleet_of(1, max_loras=1))
    log = result.log
    cost = LoadCostSettings()
    drain_ms = min(cost.max_drain_ms, (log.end_s[0] - 0.5) * 1000.0)
    assert [start for start, *_ in log.loads][:2] == [0.0, 0.5]
    assert log.ttft_ms[1] == pytest.approx(cost.cold_load_ms(50 * MB, drain_ms=drain_ms) + 5.0)
    # "a" was evicted for "b": its second request waits for "b" and a load of its own.
    assert log.outcome[2] != GPU_HIT
    assert log.ttft_ms[2] > log.ttft_ms[1]


def test_the_default_is_drain() -> None:
    load = busy_slot()
    fleet = fleet_of(1, max_loras=1)
    planning = replay_planning(catalog_of(load), fleet, settings=Settings(), planner="greedy")
    default = run_policy("epp", load, fleet, settings=Settings(), planning=planning)
    assert default.log.ttft_ms == replay("drain", load, fleet).log.ttft_ms


def test_under_vllm_a_load_stalls_the_running_batch_for_its_time() -> None:
    # Two slots: "b" loads into the free one while "a" runs, which ends that much later.
    load = workload([(0.0, "a"), (0.5, "b")], output=100)
    drained = replay("drain", load, fleet_of(1, max_loras=2)).log
    stalled = replay("vllm", load, fleet_of(1, max_loras=2)).log
    load_s = stalled.loads[1][1] - stalled.loads[1][0]
    assert load_s > 0.0
    assert stalled.end_s[0] == pytest.approx(drained.end_s[0] + load_s)
    assert stalled.ttft_ms == drained.ttft_ms  # a free slot: no drain under either


def test_under_vllm_a_load_delays_the_first_token_of_a_request_in_prefill() -> None:
    # "a" is admitted at 0.2 s with a 2,000-token prompt (100 ms of prefill); "b" loads
    # into the free slot at 0.25 s, before that prefill ends.
    load = SimWorkload(
        start=workload([(0.0, "a")]).start,
        arrival_s=[0.0, 0.2, 0.25],
        adapters=["a", "a", "b"],
        prompt_tokens=[100, 2000, 100],
        output_tokens=[10, 10, 10],
        size_bytes={"a": 50 * MB, "b": 50 * MB},
    )
    drained = replay("drain", load, fleet_of(1, max_loras=2)).log
    stalled = replay("vllm", load, fleet_of(1, max_loras=2)).log
    load_ms = (stalled.loads[1][1] - stalled.loads[1][0]) * 1000.0
    assert stalled.loads[1][0] == pytest.approx(0.25)
    assert stalled.ttft_ms[1] == pytest.approx(drained.ttft_ms[1] + load_ms)


def test_an_unknown_admission_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="load_admission"):
        SimSettings(load_admission="fifo")  # type: ignore[arg-type]


class CheckedVllmReplay(FleetReplay):
    """Under "vllm": the pod invariants, the passed-over requests counted as queued, and
    no running request's adapter off the GPU."""

    def _check(self, pod: SimPod) -> None:
        assert pod.agrees(), "the routers' views are not the engine model's"
        assert len(pod.gpu_adapters) + len(pod.loading) <= pod.max_loras
        assert pod.running <= self.sim.max_num_seqs
        passed = sum(len(waiting) for waiting in pod.passed.values())
        assert pod.queue_depth == passed + sum(1 for r in pod.queue if r >= 0)
        assert all(adapter not in pod.gpu_adapters for adapter in pod.passed)

    def _load_done(self, p: int, now_s: float) -> None:
        super()._load_done(p, now_s)
        self._check(self.pods[p])

    def _done(self, p: int, r: int, now_s: float) -> None:
        super()._done(p, r, now_s)
        self._check(self.pods[p])


@settings(max_examples=40, deadline=None)
@given(TRACES, st.sampled_from(POLICIES))
def test_under_vllm_every_request_is_served_or_rejected(
    trace: list[tuple[float, str]], name: str
) -> None:
    load = workload(trace)
    result = replay(
        "vllm",
        load,
        fleet_of(3, max_loras=2, max_cpu_loras=3),
        name=name,
        replay_type=CheckedVllmReplay,
    )
    metrics = result.metrics
    assert metrics["requests"] == metrics["served"] + metrics["rejected"] == len(trace)
    assert all(ttft >= 0.0 for ttft in result.log.ttft_ms)
    assert all(end >= start for start, end in zip(load.arrival_s, result.log.end_s, strict=True))
