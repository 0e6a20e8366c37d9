"""bench/oracle_levers.py: the hybrids between lorafleet and the oracle, through its
Python API on a small synthetic scenario (2 pods of 3 slots, 14 adapters of skewed
popularity): the two ends are ``lorafleet replay``'s lorafleet and oracle, request by
request; every hybrid runs; a bad variant or missing inputs get a clear error. Figures
are not asserted (a benchmark reports them)."""

from __future__ import annotations

import importlib
import random
from datetime import UTC, datetime
from types import ModuleType

import pytest

from bench.oracle_levers import Scenario
from placement.errors import InputError
from placement.settings import Settings
from placement.sim.engine import FleetReplay
from placement.sim.planning import ReplayHistory
from placement.sim.replay import Levers, ReplayResult, pod_specs, run_policy
from placement.sim.routers import ClassedPlanning, PlannedRouter
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from policies.eviction import EvictionPolicy
from tests import factories

MB = 1_000_000


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """bench/oracle_levers.py, as the module bench.oracle_levers."""
    return importlib.import_module("bench.oracle_levers")


def _workload() -> SimWorkload:
    rng = random.Random(3)
    names = [f"adapter-{i:02d}" for i in range(14)]
    weights = [1.0 / (rank + 1) for rank in range(len(names))]
    picks = rng.choices(names, weights=weights, k=2400)
    return SimWorkload(
        start=datetime(2026, 3, 10, 9, tzinfo=UTC),
        arrival_s=[0.5 * i for i in range(len(picks))],
        adapters=picks,
        prompt_tokens=[400] * len(picks),
        output_tokens=[40] * len(picks),
        size_bytes=dict.fromkeys(names, 60 * MB),
    )


@pytest.fixture(scope="module")
def scenario(bench: ModuleType) -> Scenario:
    workload = _workload()
    fleet = factories.replay_fleet(2, max_loras=3, max_cpu_loras=8)
    catalog = factories.replay_catalog(workload.size_bytes)
    made: Scenario = bench.Scenario(workload=workload, catalog=catalog, fleet=fleet)
    return made


def _planning(scenario: Scenario) -> ClassedPlanning:
    return replay_planning(
        scenario.catalog,
        scenario.fleet,
        settings=Settings(),
        planner="greedy",
    )


def _replay(name: str, scenario: Scenario, *, levers: Levers | None = None) -> ReplayResult:
    return run_policy(
        name,
        scenario.workload,
        scenario.fleet,
        settings=Settings(),
        planning=_planning(scenario),
        levers=levers,
    )


@pytest.mark.parametrize(("variant", "policy"), [("F-L-i", "lorafleet"), ("T-B-n", "oracle")])
def test_the_ends_are_the_replays_lorafleet_and_oracle(
    bench: ModuleType, scenario: Scenario, variant: str, policy: str
) -> None:
    hybrid = _replay("lorafleet", scenario, levers=bench.levers(variant))
    replayed = _replay(policy, scenario)
    assert hybrid.log.outcome == replayed.log.outcome
    assert hybrid.log.pod == replayed.log.pod
    assert hybrid.log.ttft_ms == replayed.log.ttft_ms
    assert hybrid.metrics == replayed.metrics
    assert hybrid.eviction is replayed.eviction


def test_every_hybrid_runs_and_the_ends_close_none_and_all(
    bench: ModuleType, scenario: Scenario
) -> None:
    variants = [
        "bounded",
        *(f"{p}-{e}-{w}" for p in "FT" for e in "LBW" for w in "in"),
    ]
    figures = bench.run_variants(
        scenario, variants, settings=Settings(), planning=_planning(scenario)
    )
    by_name = {row.variant: row for row in figures}
    assert list(by_name) == variants
    requests = len(scenario.workload)
    for row in figures:
        assert 0.0 < row.gpu_hit_rate <= 1.0 and row.loads > 0, row
        assert row.wall_s >= 0.0
    lorafleet, oracle = by_name["F-L-i"], by_name["T-B-n"]
    assert lorafleet.loads > oracle.loads  # the scenario has a gap to decompose
    assert lorafleet.closed == 0.0 and oracle.closed == 1.0
    gap = lorafleet.loads - oracle.loads
    for row in figures:
        assert row.closed == pytest.approx((lorafleet.loads - row.loads) / gap)
    # Only the W engine sends warm-ups (no classes here); it sends some on full pods.
    assert all((row.warmups > 0) == ("-W-" in row.variant) for row in figures), figures
    assert all(row.warmups < requests for row in figures)


def test_the_oracles_victim_is_beladys_in_its_worth_and_its_wait(scenario: Scenario) -> None:
    """The oracle's victim worth weighs Belady's victim (the one whose wait it reads),
    not the LRU one, and with every adapter planned the one its engine evicts then;
    lorafleet's, on vLLM's LRU, the LRU one."""
    workload = scenario.workload
    fleet = scenario.fleet
    settings = Settings()
    for eviction in (EvictionPolicy.BELADY, EvictionPolicy.LRU):
        replay = FleetReplay(
            workload, pod_specs(fleet), sim=settings.sim, load_cost=settings.load_cost
        )
        router = PlannedRouter(
            "oracle" if eviction is EvictionPolicy.BELADY else "lorafleet",
            replay,
            settings,
            eviction,
            planning=_planning(scenario),
            history=ReplayHistory(workload),
        )
        replay.router_eviction = eviction
        replay.now_s = 600.0
        pod = replay.pods[0]
        for k, name in enumerate(("adapter-00", "adapter-09", "adapter-13")):
            pod.fetch(name, busy=(), now_s=float(k))
            pod.land(name, float(k))
            pod.last_used[name] = float(k)
        assert pod.free_slots == 0
        router.plan(600.0, replay)
        assert router.victims is not None
        if eviction is EvictionPolicy.LRU:
            assert router.victims.victim_of is None
            continue
        assert router.victims.victim_of is not None
        victim = router.victims.victim_of(pod)
        assert victim == replay.engine_victim(pod)
        later = {name: replay.next_use_s(name) for name in pod.gpu_adapters}
        assert victim == max(later, key=later.__getitem__)
        assert victim != next(iter(pod.gpu_adapters))  # the LRU one, first loaded
        # Every adapter there planned: Belady has none, the engine model evicts its LRU.
        pod.planned = frozenset(pod.gpu_adapters)
        assert router.victims.victim_of(pod) == next(iter(pod.gpu_adapters))


def test_a_bad_variant_names_itself(bench: ModuleType) -> None:
    with pytest.raises(InputError, match="'F-X-i' is not PLAN-ENGINE-ESTIMATE"):
        bench.levers("F-X-i")


def test_missing_inputs_say_what_to_give(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.main([])
    assert stopped.value.code == 2
    assert "give --scenario NAME, --servegen, or --catalog, --fleet and --log" in (
        capsys.readouterr().err
    )


def test_a_bad_variant_stops_before_the_scenario_is_read(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--scenario", "no-such-scenario", "--variant", "T-B-x"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "--variant: 'T-B-x' is not PLAN-ENGINE-ESTIMATE" in error
    assert "no-such-scenario" not in error


def test_warm_ups_by_estimate_are_sent_and_a_prohibitive_margin_sends_none(
    bench: ModuleType, scenario: Scenario
) -> None:
    assert bench.levers("F-E-i").warm_by_estimate == "worth"
    assert bench.levers("F-R-i", warm_margin_s=0.5).warm_by_estimate == "recent"
    assert bench.levers("F-R-i", warm_margin_s=0.5).warm_margin_s == 0.5
    figures = bench.run_variants(
        scenario, ["F-L-i", "F-E-i"], settings=Settings(), planning=_planning(scenario)
    )
    plain, warmed = figures
    assert plain.warmups == 0 and warmed.warmups > 0
    blocked = bench.run_variants(
        scenario, ["F-E-i"], settings=Settings(), planning=_planning(scenario), warm_margin_s=1e9
    )[0]
    assert blocked.warmups == 0
    assert (blocked.loads, blocked.gpu_hit_rate, blocked.ttft_p95_ms) == (
        plain.loads,
        plain.gpu_hit_rate,
        plain.ttft_p95_ms,
    )
