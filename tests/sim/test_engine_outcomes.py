"""A request's outcome is the load it waited for, even where its adapter moved between
its routing and that load (the replay engine's ``_charge_loads``)."""

from __future__ import annotations

from placement.sim.engine import COLD_LOAD, CPU_HIT, GPU_HIT
from tests.sim.test_engine import fleet_of, replay, workload


def test_a_host_hit_whose_adapter_left_the_host_is_charged_the_cold_read() -> None:
    # One GPU slot, two host places. "a" is read and served; "b" replaces it on the
    # GPU (a stays in host RAM), and the next "a"s are routed as host hits, queued
    # behind "c". c's load needs a host place while b runs and a waits: the engine
    # takes the least recently used, a, so a's load reads it from storage again.
    load = workload([(0.0, "a"), (0.001, "b"), (0.002, "c"), (0.1, "a"), (0.11, "a")])
    result = replay("epp", load, fleet_of(1, max_loras=1, max_cpu_loras=2))
    assert [cold for *_, cold in result.log.loads] == [True] * 4
    assert result.log.outcome == [COLD_LOAD] * 5
    assert result.metrics["cold_loads_on_critical_path"] == 5
    assert result.metrics["cpu_hit_rate"] == 0.0


def test_a_host_hit_whose_adapter_stayed_in_the_host_stays_a_host_hit() -> None:
    # The same pod with room for all three in host RAM: a's second load is from host.
    load = workload([(0.0, "a"), (0.001, "b"), (0.002, "c"), (0.1, "a"), (0.11, "a")])
    result = replay("epp", load, fleet_of(1, max_loras=1, max_cpu_loras=3))
    assert [cold for *_, cold in result.log.loads] == [True, True, True, False]
    assert result.log.outcome == [COLD_LOAD, COLD_LOAD, COLD_LOAD, CPU_HIT, CPU_HIT]


def test_every_hit_queued_for_an_adapter_that_left_the_gpu_is_charged() -> None:
    # Two GPU slots, two host places. "a" is on a slot while "c" loads; two "a"s
    # arrive then (GPU hits) behind "b". b's load finds every slot and host place in
    # use and takes the least recently used, a: both a's wait for its cold read.
    load = workload([(0.0, "a"), (0.001, "c"), (0.002, "b"), (0.15, "a"), (0.16, "a")])
    result = replay("epp", load, fleet_of(1, max_loras=2, max_cpu_loras=2))
    assert len(result.log.loads) == 4 and result.log.loads[-1][3]
    assert result.log.outcome == [COLD_LOAD] * 5
    assert GPU_HIT not in result.log.outcome
    a_read = result.log.loads[-1][1] - result.log.loads[-1][0]
    assert min(result.log.ttft_ms[3:]) > a_read * 1000.0
