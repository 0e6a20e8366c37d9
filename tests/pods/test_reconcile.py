"""Reconcile: the engine's semantics, make before break, pins, sources, idempotence.

The property tests run reconcile's actions through the engine model
(``placement.residency.PodResidency``) of every engine and check the pods after every
action and at the end: what the GPU holds, not only the names listed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from placement.actuation.executor import Ledger
from placement.actuation.reconcile import depends_on, reconcile, schedule
from placement.actuation.reconcile_pods import PodState
from placement.domain import Action, ActionKind, AdapterId, PodId
from placement.plan import Plan
from placement.residency import EngineModel, PodResidency
from tests.factories import make_plan
from tests.pods.pod_states import (
    SGLANG,
    SGLANG_HARD_CAP,
    VLLM,
    engines,
    held,
    ledger_of,
    observe,
    path_of,
    run,
    state,
)

P0, P1, P2 = PodId("pod-0"), PodId("pod-1"), PodId("pod-2")


def _kinds(actions: tuple[Action, ...]) -> list[tuple[str, str, str]]:
    return [(a.kind.value, a.pod, a.adapter) for a in actions]


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        pytest.param(VLLM, [("load", "pod-0", "w"), ("load", "pod-0", "h")], id="vllm"),
        pytest.param(
            SGLANG,
            [("load", "pod-0", "h"), ("load", "pod-0", "w"), ("warmup", "pod-0", "h")],
            id="sglang",
        ),
    ],
)
def test_the_hot_set_is_activated_last(
    engine: EngineModel, expected: list[tuple[str, str, str]]
) -> None:
    """vLLM activates every load, so warm adapters load first and the hot one last;
    SGLang registers on load and activates on the warm-up."""
    plan = make_plan({"pod-0": ["h"]}, {"pod-0": ["w"]})
    assert _kinds(reconcile(plan, {P0: state([], cpu=4, engine=engine)})) == expected


def test_the_most_valuable_hot_adapter_is_activated_last() -> None:
    plan = make_plan({"pod-0": ["a", "b", "c"]})
    empty = {P0: state([], cpu=4, gpu=3)}
    by_demand = reconcile(plan, empty, demand_rps={AdapterId("a"): 9.0, AdapterId("b"): 1.0})
    assert [a.adapter for a in by_demand] == ["c", "b", "a"]
    # Without a forecast, by the plan's weights: "b" shares its traffic with pod-1.
    shared = make_plan({"pod-0": ["a", "b"], "pod-1": ["b"]})
    both = {P0: state([], cpu=2, gpu=2), P1: state([], cpu=2, gpu=2)}
    assert [a.adapter for a in reconcile(shared, both) if a.pod == P0] == ["b", "a"]


def test_a_warm_load_on_vllm_is_followed_by_the_hot_set_again() -> None:
    """The warm load takes the only GPU slot; a warm-up puts the hot adapter back."""
    plan = make_plan({"pod-0": ["h"]}, {"pod-0": ["w"]})
    observed = {P0: state(["h"], cpu=2, gpu=1, warmed=["h"])}
    assert _kinds(reconcile(plan, observed)) == [("load", "pod-0", "w"), ("warmup", "pod-0", "h")]


def test_a_move_loads_the_new_replica_before_unloading_the_old() -> None:
    plan = make_plan({"pod-0": [], "pod-1": ["x"]})
    observed = {P0: state(["x"], cpu=2, engine=SGLANG), P1: state([], cpu=2, engine=SGLANG)}
    actions = reconcile(plan, observed)
    assert _kinds(actions) == [
        ("load", "pod-1", "x"),
        ("unload", "pod-0", "x"),
        ("warmup", "pod-1", "x"),
    ]
    assert actions[1].reason == "moved to pod-1"
    assert depends_on(actions)[1] == (0,)


def test_a_move_on_vllm_keeps_the_old_replica_listed() -> None:
    """vLLM's unload frees nothing (the slot and the cache entry stay until LRU), and a
    later load of the name reads it from storage again: a name the plan knows stays."""
    plan = make_plan({"pod-0": [], "pod-1": ["x"]})
    actions = reconcile(plan, {P0: state(["x"], cpu=2), P1: state([], cpu=2)})
    assert _kinds(actions) == [("load", "pod-1", "x")]


def test_a_vllm_pod_unloads_names_the_plan_does_not_know_and_stale_paths() -> None:
    plan = make_plan({"pod-0": ["h"], "pod-1": ["x", "old"]})
    observed = {
        P0: state(["h", "x", "stray", "old"], cpu=4, paths={"old": path_of("old", 0)}),
        P1: state(["x", "old"], cpu=4),
    }
    sources = {AdapterId(a): path_of(a) for a in ("h", "x", "old")}
    actions = reconcile(plan, observed, sources=sources)
    unloads = {(a.adapter, a.reason) for a in actions if a.kind is ActionKind.UNLOAD}
    assert unloads == {("stray", "not in plan"), ("old", "moved to pod-1")}


FULL_POD = (
    make_plan({"pod-0": ["new"], "pod-1": ["hot"]}, {"pod-1": ["warm"]}),
    {"pod-0": ["gone", "warm", "hot"], "pod-1": ["hot", "warm"]},
)


def test_a_full_sglang_pod_unloads_what_the_plan_wants_least_first() -> None:
    plan, held_now = FULL_POD
    observed = {PodId(p): state(names, cpu=3, engine=SGLANG) for p, names in held_now.items()}
    assert _kinds(reconcile(plan, observed))[:2] == [
        ("unload", "pod-0", "gone"),
        ("load", "pod-0", "new"),
    ]


def test_a_full_vllm_pod_loads_without_waiting_for_an_unload() -> None:
    """An unload frees nothing on vLLM: the load comes first, the unloads after it."""
    plan, held_now = FULL_POD
    observed = {PodId(p): state(names, cpu=3) for p, names in held_now.items()}
    actions = reconcile(plan, observed)
    assert _kinds(actions)[0] == ("load", "pod-0", "new")
    # "warm" and "hot" are the plan's (on pod-1) and stay listed; "gone" it does not know.
    assert {a.adapter for a in actions if a.kind is ActionKind.UNLOAD} == {"gone"}


def test_a_swap_between_two_full_sglang_pods_is_forced_and_says_so() -> None:
    plan = make_plan({"pod-0": ["y"], "pod-1": ["x"]})
    observed = {P0: state(["x"], cpu=1, engine=SGLANG), P1: state(["y"], cpu=1, engine=SGLANG)}
    actions = reconcile(plan, observed)
    assert actions[0].kind is ActionKind.UNLOAD
    assert actions[0].reason.startswith("forced")
    assert {(a.pod, a.adapter) for a in actions if a.kind is ActionKind.LOAD} == {
        (P0, "y"),
        (P1, "x"),
    }


def test_a_swap_between_two_full_vllm_pods_needs_no_forced_unload() -> None:
    plan = make_plan({"pod-0": ["y"], "pod-1": ["x"]})
    actions = reconcile(plan, {P0: state(["x"], cpu=1), P1: state(["y"], cpu=1)})
    assert [a.kind for a in actions] == [ActionKind.LOAD] * 2  # the old names stay listed
    assert not any(a.reason.startswith("forced") for a in actions)


@pytest.mark.parametrize("engine", [VLLM, SGLANG])
def test_pinned_adapters_are_never_unloaded(engine: EngineModel) -> None:
    plan = make_plan({"pod-0": []}, {"pod-0": ["w"]}, pinned={"pod-0": ["p"]})
    observed = {P0: state(["p", "q", "old"], cpu=3, gpu=3, pinned=["q"], engine=engine)}
    actions = reconcile(plan, observed)
    assert not any(a.kind is ActionKind.UNLOAD and a.adapter in {"p", "q"} for a in actions)
    assert reconcile(make_plan({}), {P0: state(["q"], cpu=2, pinned=["q"], engine=engine)}) == ()


def test_loads_of_pinned_adapters_carry_the_flag() -> None:
    """On SGLang a pinned load takes its GPU slot for good: no warm-up needed."""
    plan = make_plan({"pod-0": ["p"]}, pinned={"pod-0": ["p"]})
    (load,) = reconcile(plan, {P0: state([], cpu=2, gpu=2, engine=SGLANG)})
    assert load.pinned and load.reason == "pinned in plan"


def test_nothing_is_unloaded_towards_an_unreachable_pod() -> None:
    plan = make_plan({"pod-0": [], "pod-1": ["x"]})
    assert reconcile(plan, {P0: state(["x"], cpu=2)}) == ()


@pytest.mark.parametrize("engine", [VLLM, SGLANG])
@pytest.mark.parametrize(
    ("warmed", "expected"),
    [
        pytest.param(None, [], id="no-ledger"),
        pytest.param([], [("warmup", "pod-0", "h")], id="ledger-lacks-it"),
        pytest.param(["h"], [], id="ledger-has-it"),
    ],
)
def test_registered_hot_adapters_are_warmed_when_the_ledger_lacks_them(
    engine: EngineModel, warmed: list[str] | None, expected: list[tuple[str, str, str]]
) -> None:
    plan = make_plan({"pod-0": ["h"]})
    observed = {P0: state(["h"], cpu=2, warmed=warmed, engine=engine)}
    assert _kinds(reconcile(plan, observed)) == expected


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        pytest.param(VLLM, [("load", "pod-0", "h")], id="vllm-load-inplace"),
        pytest.param(SGLANG, [("load", "pod-0", "h"), ("warmup", "pod-0", "h")], id="sglang"),
    ],
)
def test_an_adapter_whose_source_changed_is_loaded_again_in_place(
    engine: EngineModel, expected: list[tuple[str, str, str]]
) -> None:
    plan = make_plan({"pod-0": ["h"]})
    observed = {P0: state(["h"], cpu=2, warmed=["h"], engine=engine)}
    sources = {AdapterId("h"): path_of("h", 2)}
    actions = reconcile(plan, observed, sources=sources)
    assert _kinds(actions) == expected
    assert actions[0].inplace
    assert actions[0].reason == f"source changed: {path_of('h')} -> {path_of('h', 2)}"
    assert reconcile(plan, observed, sources={AdapterId("h"): path_of("h")}) == ()


def test_what_a_pod_cannot_hold_is_left_out_and_said() -> None:
    plan = make_plan({"pod-0": ["a", "b"]}, {"pod-0": ["c"]})
    steps = schedule(plan, {P0: state([], cpu=2, gpu=1)}, demand_rps={AdapterId("a"): 1.0})
    assert {a.adapter for a in steps.actions} == {"a", "b"}
    assert steps.left_out == (
        (P0, "c", "over max_cpu_loras 2"),
        (P0, "b", "hot over max_loras 1: warm"),
    )


# Property: random pairs of placements, run on the engine model ------------------------

ADAPTERS = [AdapterId(f"a{i}") for i in range(6)]
ENGINES = st.sampled_from([VLLM, SGLANG, SGLANG_HARD_CAP])

Scenario = tuple[Plan, dict[PodId, PodState], dict[AdapterId, str]]


@st.composite
def scenarios(draw: st.DrawFn, *, slack: int) -> Scenario:
    """A current state, a new plan and the catalog's sources; each pod's plan leaves
    ``slack`` slots free. Some sources changed; vLLM ledgers may hold unloaded names."""
    chosen = draw(ENGINES)
    has_ledger = draw(st.booleans())  # apply keeps a ledger for every pod, or none
    pods = [PodId(f"pod-{i}") for i in range(draw(st.integers(2, 4)))]
    hot_adapters = set(draw(st.sets(st.sampled_from(ADAPTERS), min_size=3)))
    observed: dict[PodId, PodState] = {}
    for pod in pods:
        cpu = draw(st.integers(1 + slack, 4))
        gpu = draw(st.integers(1, cpu))
        size = draw(st.sampled_from([cpu, cpu, cpu - 1, 0]))  # mostly full pods
        held_now = draw(
            st.lists(st.sampled_from(ADAPTERS), unique=True, min_size=size, max_size=size)
        )
        ghosts = []
        if chosen is VLLM:
            others = [a for a in ADAPTERS if a not in held_now]
            ghosts = draw(st.lists(st.sampled_from(others), unique=True, max_size=2))
        warmed = draw(st.permutations(held_now + ghosts)) if has_ledger else None
        old = draw(st.sets(st.sampled_from(held_now))) if held_now else set()
        paths = {str(a): path_of(a, 0) for a in old}
        observed[pod] = state(held_now, cpu=cpu, gpu=gpu, warmed=warmed, engine=chosen, paths=paths)
    # Plans mostly move what the pods hold, so that replicas must travel.
    pool = sorted({a for s in observed.values() for a in s.registered}) or ADAPTERS
    hot_on: dict[str, list[AdapterId]] = {}
    warm_on: dict[str, list[AdapterId]] = {}
    for pod, pod_state in observed.items():
        source = draw(st.sampled_from([pool, pool, ADAPTERS]))
        size = pod_state.max_cpu_loras - slack
        want = draw(st.lists(st.sampled_from(source), unique=True, max_size=size))
        hot = [a for a in want if a in hot_adapters][: pod_state.max_loras]
        hot_on[pod], warm_on[pod] = hot, [a for a in want if a not in hot]
    sources = {a: path_of(a) for a in ADAPTERS}
    return make_plan(hot_on, warm_on), observed, sources


def _replicas(pods: Mapping[PodId, PodResidency], hot: set[AdapterId]) -> set[AdapterId]:
    return {AdapterId(a) for pod in pods.values() for a in pod.listed if a in hot}


@dataclass
class _Applied:
    """The pods of a scenario on the engine model, and what apply sees of them."""

    pods: dict[PodId, PodResidency]
    ledger: Ledger | None
    seen: dict[PodId, PodState]


def _applied(scenario: Scenario) -> _Applied:
    """Pods holding the scenario's state, read as ``apply.observe`` reads them: their
    listings and the ledger (which, on vLLM, remembers names it unloaded)."""
    _, state_now, _ = scenario
    pods, ledger = engines(state_now), ledger_of(state_now)
    return _Applied(pods=pods, ledger=ledger, seen=observe(pods, state_now, ledger))


def _actions(scenario: Scenario) -> tuple[_Applied, tuple[Action, ...]]:
    plan, _, sources = scenario
    applied = _applied(scenario)
    return applied, reconcile(plan, applied.seen, sources=sources)


def _check_run(scenario: Scenario, applied: _Applied, actions: tuple[Action, ...]) -> None:
    """Run ``actions`` on the engine model: every step keeps the limits (SGLang: never
    past ``--max-loaded-loras``, so its soft cap never unloads an adapter) and keeps a
    replica of every hot adapter that had one; at the end each pod lists the plan's
    adapters from their sources and its GPU holds the hot set."""
    plan, observed, sources = scenario
    pods, ledger = applied.pods, applied.ledger
    hot = {a for pod_plan in plan.pods.values() for a in pod_plan.hot}
    ready = _replicas(pods, hot)
    for action, effects in run(pods, actions, sources=sources, ledger=ledger):
        pod, limits = pods[action.pod], observed[action.pod]
        assert effects.unlisted == (), f"the soft cap unloaded {effects.unlisted}"
        assert len(pod.on_gpu()) + pod.ghosts_on_gpu() <= limits.max_loras
        if pod.engine.is_sglang:
            assert len(pod.listed) <= limits.max_cpu_loras, (action, pod.listed)
        now = _replicas(pods, hot)
        assert ready <= now, f"hot adapters without a replica: {ready - now}"
        ready |= now
    for pod_id, pod_plan in plan.pods.items():
        pod, limits = pods[pod_id], observed[pod_id]
        wanted = {a: sources[a] for a in pod_plan.registered}
        if limits.engine is EngineModel.VLLM:
            # An unload frees nothing on vLLM: names the plan knows, listed from their
            # source, stay listed beside the plan's.
            kept = {a: p for a, p in pod.listed.items() if a not in wanted}
            assert {a: pod.listed.get(a) for a in wanted} == wanted, pod_id
            assert set(kept) <= set(plan.adapters), (pod_id, kept)
            assert all(p == sources[AdapterId(a)] for a, p in kept.items()), (pod_id, kept)
        else:
            assert pod.listed == wanted, pod_id
        loaded = any(a.kind is ActionKind.LOAD and a.pod == pod_id for a in actions)
        if limits.warmed is not None or loaded:
            on_gpu = set(pod.on_gpu())
            assert set(pod_plan.hot) <= on_gpu, (pod_id, pod.on_gpu())
            if len(pod_plan.hot) == limits.max_loras:
                assert on_gpu == set(pod_plan.hot), (pod_id, pod.on_gpu())
    _check_again(scenario, pods, ledger)


def _check_again(
    scenario: Scenario, pods: Mapping[PodId, PodResidency], ledger: Ledger | None
) -> None:
    """Reconciling the same plan again loads and unloads nothing and leaves every pod
    holding what it held; with a ledger it does nothing at all."""
    plan, observed, sources = scenario
    again = reconcile(plan, observe(pods, observed, ledger), sources=sources)
    assert not [a for a in again if a.kind is not ActionKind.WARMUP], again
    if ledger is not None:
        assert again == ()
    before = {pod_id: held(pod) for pod_id, pod in pods.items()}
    for _ in run(pods, again, sources=sources):
        pass
    assert {pod_id: held(pod) for pod_id, pod in pods.items()} == before


#: Two hot adapters leave a full pod-0 for pod-1 and pod-2 while pod-0 needs room.
MOVE_OUT: Scenario = (
    make_plan({"pod-0": [], "pod-1": ["x"], "pod-2": ["y"]}, {"pod-0": ["z"]}),
    {
        P0: state(["x", "y"], cpu=2, engine=SGLANG),
        P1: state([], cpu=2, engine=SGLANG),
        P2: state([], cpu=2, engine=SGLANG),
    },
    {AdapterId(a): path_of(a) for a in "xyz"},
)
#: A warm load pushes the only hot adapter off vLLM's one GPU slot.
WARM_PUSHES_HOT: Scenario = (
    make_plan({"pod-0": ["h"], "pod-1": []}, {"pod-0": ["w"]}),
    {P0: state(["h"], cpu=2, warmed=["h"]), P1: state([], cpu=2)},
    {AdapterId(a): path_of(a) for a in "hw"},
)

#: vLLM: "g" was unloaded after "h" was activated and keeps its GPU slot, so "y" pushed
#: "h" off; the ledger must remember "g" for reconcile to warm "h" up again.
GHOST_HOLDS_A_SLOT: Scenario = (
    make_plan({"pod-0": ["h"]}, {"pod-0": ["y"]}),
    {P0: state(["h", "y"], cpu=3, gpu=2, warmed=["h", "g", "y"])},
    {AdapterId(a): path_of(a) for a in "ghy"},
)


@settings(max_examples=300, deadline=None)
@given(scenarios(slack=1))
@example(MOVE_OUT)
@example(WARM_PUSHES_HOT)
@example(GHOST_HOLDS_A_SLOT)
def test_with_a_free_slot_no_hot_adapter_ever_lacks_a_replica(scenario: Scenario) -> None:
    applied, actions = _actions(scenario)
    assert not any(a.reason.startswith("forced") for a in actions)
    _check_run(scenario, applied, actions)


@settings(max_examples=300, deadline=None)
@given(scenarios(slack=0))
def test_full_plans_keep_the_limits_and_end_with_the_hot_set_on_the_gpu(
    scenario: Scenario,
) -> None:
    applied, actions = _actions(scenario)
    forced = [a for a in actions if a.reason.startswith("forced")]
    assert not forced or all(applied.seen[a.pod].engine.is_sglang for a in forced)
    _check_run(scenario, applied, actions)


@settings(max_examples=100, deadline=None)
@given(scenarios(slack=0))
def test_dependencies_point_backwards_and_cover_make_before_break(scenario: Scenario) -> None:
    _, actions = _actions(scenario)
    for index, deps in enumerate(depends_on(actions)):
        assert all(d < index for d in deps)
        if actions[index].kind is ActionKind.UNLOAD:
            loads = {
                i
                for i in range(index)
                if actions[i].adapter == actions[index].adapter
                and actions[i].kind is ActionKind.LOAD
            }
            assert loads <= set(deps)


def _any_order(after: tuple[tuple[int, ...], ...], rnd: random.Random) -> list[int]:
    """One order a concurrent executor may run the actions in, honouring ``after``."""
    done: set[int] = set()
    order: list[int] = []
    while len(order) < len(after):
        ready = [i for i in range(len(after)) if i not in done and set(after[i]) <= done]
        pick = rnd.choice(ready)
        done.add(pick)
        order.append(pick)
    return order


@settings(max_examples=200, deadline=None)
@given(scenarios(slack=1), st.randoms(use_true_random=False))
@example(MOVE_OUT, random.Random(0))
def test_every_order_the_schedule_allows_keeps_the_promises(
    scenario: Scenario, rnd: random.Random
) -> None:
    plan, _, sources = scenario
    applied = _applied(scenario)
    steps = schedule(plan, applied.seen, sources=sources)
    order = _any_order(steps.after, rnd)
    for pod_id in applied.seen:  # each pod's actions keep their order
        mine = [i for i in order if steps.actions[i].pod == pod_id]
        assert mine == sorted(mine)
    _check_run(scenario, applied, tuple(steps.actions[i] for i in order))
