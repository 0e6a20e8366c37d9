"""``costs_for`` under each admission: a load weighs its transfer plus
``expected_drain_ms`` on every pod; under vLLM's (no drain) a load also waits that figure
for a slot where it can take none (``Costs.slot_wait_s``)."""

from __future__ import annotations

from dataclasses import replace

from placement.settings import Settings
from placement.sim.engine import FleetReplay
from placement.sim.replay import pod_specs
from placement.sim.routers import ReactiveRouter, costs_for
from policies.eviction import EvictionPolicy
from tests.sim.test_engine import MB, fleet_of, workload


def replay_of(settings: Settings) -> FleetReplay:
    load = workload([(0.0, "a"), (0.5, "b")])
    return FleetReplay(load, pod_specs(fleet_of(2)), sim=settings.sim, load_cost=settings.load_cost)


def test_the_drain_is_in_every_load_by_default() -> None:
    settings = Settings()
    costs = costs_for(replay_of(settings), settings)
    cost = settings.load_cost
    assert costs.slot_wait_s is None
    assert costs.warm_load_s == cost.warm_load_ms(50 * MB, drain_ms=cost.expected_drain_ms) / 1e3


def test_under_vllm_a_load_also_waits_the_drain_figure_for_a_slot() -> None:
    base = Settings()
    settings = replace(base, sim=replace(base.sim, load_admission="vllm"))
    costs = costs_for(replay_of(settings), settings)
    assert replace(costs, slot_wait_s=None) == costs_for(replay_of(base), base)
    assert costs.slot_wait_s == settings.load_cost.expected_drain_ms / 1e3
    router = ReactiveRouter("bounded", replay_of(settings), settings, EvictionPolicy.LRU)
    assert router.context("a", 0.0).slot_wait_s == costs.slot_wait_s


def test_with_the_router_setting_off_the_replay_prices_no_slot_wait() -> None:
    """``RouterSettings.price_slot_wait`` off turns the slot wait off in the replay's
    routers as in the live router's picker (``--set router.price_slot_wait=false``)."""
    base = Settings()
    vllm = replace(base, sim=replace(base.sim, load_admission="vllm"))
    off = replace(vllm, router=replace(vllm.router, price_slot_wait=False))
    costs = costs_for(replay_of(off), off)
    assert costs.slot_wait_s is None
    assert costs == replace(costs_for(replay_of(vllm), vllm), slot_wait_s=None)
    router = ReactiveRouter("bounded", replay_of(off), off, EvictionPolicy.LRU)
    assert router.context("a", 0.0).slot_wait_s is None
