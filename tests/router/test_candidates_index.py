"""The pool's candidate index stays what a full scan of its pods would say, whatever the
router does to the pods (requests, loads, listings, forgets, scrapes, plan swaps), and
the picker's pre-filtered choice equals the full scan's where it must."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.ports import PodMetrics
from placement.router.picking import Picker
from placement.router.state import LivePod, Topology, Upstream, build_topology
from placement.settings import LoadCostSettings, RouterSettings
from policies.candidates import holder_positions, least_kv, least_queued
from tests import factories

NAMES = [AdapterId(f"a{i}") for i in range(10)]
PODS = 6
CALLS = st.sampled_from(["use", "load", "already", "start", "stop", "forget", "listing", "scrape"])
STEPS = st.lists(
    st.tuples(CALLS, st.integers(0, PODS - 1), st.sampled_from(NAMES), st.integers(0, 5)),
    max_size=50,
)


def _upstreams(count: int) -> tuple[Upstream, ...]:
    return tuple(
        Upstream(
            pod=PodId(f"pod-{i}"),
            pool=PoolId("pool"),
            url=f"http://pod-{i}.invalid",
            engine=Engine.VLLM,
            served_model="base-model",
            max_loras=2,
            max_cpu_loras=4,
        )
        for i in range(count)
    )


def _apply(
    state: LivePod, call: str, adapter: AdapterId, number: int, loop: asyncio.AbstractEventLoop
) -> None:
    if call == "use":
        state.note_use(adapter, float(number))
    elif call in ("load", "already"):
        state.ledger.loaded(adapter, f"s3://x/{adapter}", changed=call == "load")
        state.sync()
    elif call == "start" and adapter not in state.loading:
        state.start_loading(adapter, loop.create_future())
    elif call == "stop":
        state.stop_loading(adapter)
    elif call == "forget":
        state.ledger.forget(adapter)
        state.sync()
    elif call == "listing":
        listed = {AdapterId(a): "" for a in state.ledger.residency.listed if a != adapter}
        state.ledger.reconcile_listing(listed)
        state.sync()
    else:
        state.observe(PodMetrics(waiting=number, running=number % 3, kv_usage=number / 6))
        state.healthy = number != 5
        assert state.index is not None
        state.index.refresh()


def _assert_index_matches_a_scan(topology: Topology) -> None:
    for view in topology.pools.values():
        index = view.index
        for name in NAMES:
            assert index.holders.get(name, set()) == holder_positions(view.states, name), name
        assert index.least_queued == least_queued(view.states, count=index.width)
        assert index.least_kv == least_kv(view.states)


@settings(max_examples=120, deadline=None)
@given(steps=STEPS, swap_at=st.integers(0, 50))
def test_the_index_equals_a_full_scan_after_any_steps(
    steps: list[tuple[str, int, AdapterId, int]], swap_at: int
) -> None:
    plan = factories.make_plan({"pod-0": ["a0", "a1"], "pod-1": ["a2"]}, warm={"pod-2": ["a3"]})
    topology = build_topology(_upstreams(PODS), plan)
    loop = asyncio.new_event_loop()
    try:
        for step, (call, at, adapter, number) in enumerate(steps):
            if step == swap_at:  # a new topology keeps the live pods, with a fresh index
                topology = build_topology(_upstreams(PODS), None, previous=topology.pods)
            _apply(topology.pods[PodId(f"pod-{at}")], call, adapter, number, loop)
            if call != "scrape":  # the rankings are refreshed by scrapes only
                for view in topology.pools.values():
                    view.index.refresh()
            _assert_index_matches_a_scan(topology)
    finally:
        loop.close()


def test_the_picker_chooses_as_the_full_scan_with_a_holder_among_many() -> None:
    plan = factories.make_plan({f"pod-{i}": [f"a{i}"] for i in range(5)})
    upstreams = _upstreams(40)
    topology = build_topology(upstreams, plan)
    for i, state in enumerate(topology.pods.values()):
        state.observe(PodMetrics(waiting=i % 5, running=i % 3, kv_usage=0.3))
    topology.pods[PodId("pod-33")].note_use(AdapterId("z"), 1.0)  # unplanned, held on 33
    for view in topology.pools.values():
        view.index.refresh()
    lean = Picker(settings=RouterSettings(), load_cost=LoadCostSettings())
    full = Picker(settings=RouterSettings(), load_cost=LoadCostSettings(), prefilter=False)
    for model in ["a0", "a3", "z", "never-seen", "base-model"]:
        assert lean.pick(topology, model) == full.pick(topology, model), model
    assert len(topology.pools[PoolId("pool")].index.candidates("a3", ("pod-3",))) <= 7
