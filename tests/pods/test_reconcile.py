"""Reconcile: limits at every step, make before break, warm-ups, pins, idempotence."""

from __future__ import annotations

import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from placement.actuation.reconcile import PodState, depends_on, reconcile, schedule
from placement.domain import Action, ActionKind, AdapterId, PodId
from placement.plan import Plan
from tests.factories import make_plan
from tests.pods.pod_states import after, replay, state

P0, P1, P2 = PodId("pod-0"), PodId("pod-1"), PodId("pod-2")


def _kinds(actions: tuple[Action, ...]) -> list[tuple[str, str, str]]:
    return [(a.kind.value, a.pod, a.adapter) for a in actions]


def test_empty_pods_load_then_warm_hot_adapters() -> None:
    plan = make_plan({"pod-0": ["h"]}, {"pod-0": ["w"]})
    actions = reconcile(plan, {P0: state([], cpu=4)})
    assert _kinds(actions) == [
        ("load", "pod-0", "h"),
        ("warmup", "pod-0", "h"),
        ("load", "pod-0", "w"),
    ]


def test_a_move_loads_the_new_replica_before_unloading_the_old() -> None:
    plan = make_plan({"pod-0": [], "pod-1": ["x"]})
    actions = reconcile(plan, {P0: state(["x"], cpu=2), P1: state([], cpu=2)})
    assert _kinds(actions) == [
        ("load", "pod-1", "x"),
        ("warmup", "pod-1", "x"),
        ("unload", "pod-0", "x"),
    ]
    assert actions[-1].reason == "moved to pod-1"
    assert depends_on(actions)[2] == (0, 1)


def test_a_full_pod_unloads_what_the_plan_wants_least_first() -> None:
    plan = make_plan({"pod-0": ["new"], "pod-1": ["hot"]}, {"pod-1": ["warm"]})
    observed = {P0: state(["gone", "warm", "hot"], cpu=3), P1: state(["hot", "warm"], cpu=3)}
    actions = reconcile(plan, observed)
    assert _kinds(actions)[:2] == [("unload", "pod-0", "gone"), ("load", "pod-0", "new")]


def test_a_swap_between_two_full_pods_is_forced_and_says_so() -> None:
    plan = make_plan({"pod-0": ["y"], "pod-1": ["x"]})
    actions = reconcile(plan, {P0: state(["x"], cpu=1), P1: state(["y"], cpu=1)})
    assert actions[0].kind is ActionKind.UNLOAD
    assert actions[0].reason.startswith("forced")
    assert {(a.pod, a.adapter) for a in actions if a.kind is ActionKind.LOAD} == {
        (P0, "y"),
        (P1, "x"),
    }


def test_pinned_adapters_are_never_unloaded() -> None:
    plan = make_plan({"pod-0": []}, {"pod-0": ["w"]}, pinned={"pod-0": ["p"]})
    actions = reconcile(plan, {P0: state(["p", "q", "old"], cpu=2, pinned=["q"])})
    assert not any(a.kind is ActionKind.UNLOAD and a.adapter in {"p", "q"} for a in actions)
    assert reconcile(make_plan({}), {P0: state(["q"], cpu=2, pinned=["q"])}) == ()


def test_loads_of_pinned_adapters_carry_the_flag() -> None:
    plan = make_plan({"pod-0": ["p"]}, pinned={"pod-0": ["p"]})
    (load, _warmup) = reconcile(plan, {P0: state([], cpu=2)})
    assert load.pinned and load.reason == "pinned in plan"


def test_nothing_is_unloaded_towards_an_unreachable_pod() -> None:
    plan = make_plan({"pod-0": [], "pod-1": ["x"]})
    assert reconcile(plan, {P0: state(["x"], cpu=2)}) == ()


@pytest.mark.parametrize(
    ("warmed", "expected"),
    [
        pytest.param(None, [], id="no-ledger"),
        pytest.param([], [("warmup", "pod-0", "h")], id="ledger-lacks-it"),
        pytest.param(["h"], [], id="ledger-has-it"),
    ],
)
def test_registered_hot_adapters_are_warmed_when_the_ledger_lacks_them(
    warmed: list[str] | None, expected: list[tuple[str, str, str]]
) -> None:
    plan = make_plan({"pod-0": ["h"]})
    assert _kinds(reconcile(plan, {P0: state(["h"], cpu=2, warmed=warmed)})) == expected


# Property: random pairs of placements ------------------------------------------------

ADAPTERS = [AdapterId(f"a{i}") for i in range(6)]


@st.composite
def scenarios(draw: st.DrawFn, *, slack: int) -> tuple[Plan, dict[PodId, PodState]]:
    """A current state and a new plan; each pod's plan leaves ``slack`` slots free."""
    pods = [PodId(f"pod-{i}") for i in range(draw(st.integers(2, 4)))]
    hot_adapters = set(draw(st.sets(st.sampled_from(ADAPTERS), min_size=3)))
    observed: dict[PodId, PodState] = {}
    for pod in pods:
        cpu = draw(st.integers(1 + slack, 4))
        gpu = draw(st.integers(1, cpu))
        size = draw(st.sampled_from([cpu, cpu, cpu - 1, 0]))  # mostly full pods
        held = draw(st.lists(st.sampled_from(ADAPTERS), unique=True, min_size=size, max_size=size))
        warmed = draw(st.none() | st.permutations(held))
        observed[pod] = state(held, cpu=cpu, gpu=gpu, warmed=warmed)
    # Plans mostly move what the pods hold, so that replicas must travel.
    pool = sorted({a for s in observed.values() for a in s.registered}) or ADAPTERS
    hot_on, warm_on = {}, {}
    for pod, pod_state in observed.items():
        source = draw(st.sampled_from([pool, pool, ADAPTERS]))
        size = pod_state.max_cpu_loras - slack
        want = draw(st.lists(st.sampled_from(source), unique=True, max_size=size))
        hot = [a for a in want if a in hot_adapters][: pod_state.max_loras]
        hot_on[pod], warm_on[pod] = hot, [a for a in want if a not in hot]
    return make_plan(hot_on, warm_on), observed


def _check_limits(observed: dict[PodId, PodState], actions: tuple[Action, ...]) -> None:
    for regs in replay(observed, actions):
        for pod, held in regs.items():
            assert len(held) <= observed[pod].max_cpu_loras, (pod, held)


def _check_converged(
    plan: Plan, observed: dict[PodId, PodState], actions: tuple[Action, ...]
) -> None:
    final = after(observed, actions)
    for pod, pod_plan in plan.pods.items():
        assert set(pod_plan.registered) <= final[pod].registered
    assert reconcile(plan, final) == (), "reconcile is not idempotent"


#: Two hot adapters leave a full pod-0 for pod-1 and pod-2 while pod-0 needs room.
MOVE_OUT = (
    make_plan({"pod-0": [], "pod-1": ["x"], "pod-2": ["y"]}, {"pod-0": ["z"]}),
    {P0: state(["x", "y"], cpu=2), P1: state([], cpu=2), P2: state([], cpu=2)},
)


@settings(max_examples=300, deadline=None)
@given(scenarios(slack=1))
@example(MOVE_OUT)
def test_no_hot_adapter_ever_lacks_a_ready_replica(
    scenario: tuple[Plan, dict[PodId, PodState]],
) -> None:
    plan, observed = scenario
    actions = reconcile(plan, observed)
    hot = {a for pod_plan in plan.pods.values() for a in pod_plan.hot}
    ready = {a for s in observed.values() for a in s.registered} & hot
    for regs in replay(observed, actions):
        held = {a for adapters in regs.values() for a in adapters}
        assert ready <= held, f"hot adapters without a replica: {ready - held}"
        ready |= held & hot
    assert not any(a.reason.startswith("forced") for a in actions)
    _check_limits(observed, actions)
    _check_converged(plan, observed, actions)


@settings(max_examples=300, deadline=None)
@given(scenarios(slack=0))
def test_full_plans_keep_limits_and_converge(scenario: tuple[Plan, dict[PodId, PodState]]) -> None:
    plan, observed = scenario
    actions = reconcile(plan, observed)
    _check_limits(observed, actions)
    _check_converged(plan, observed, actions)


@settings(max_examples=100, deadline=None)
@given(scenarios(slack=0))
def test_dependencies_point_backwards_and_cover_make_before_break(
    scenario: tuple[Plan, dict[PodId, PodState]],
) -> None:
    plan, observed = scenario
    actions = reconcile(plan, observed)
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
    scenario: tuple[Plan, dict[PodId, PodState]], rnd: random.Random
) -> None:
    plan, observed = scenario
    steps = schedule(plan, observed)
    actions = tuple(steps.actions[i] for i in _any_order(steps.after, rnd))
    hot = {a for pod_plan in plan.pods.values() for a in pod_plan.hot}
    ready = {a for s in observed.values() for a in s.registered} & hot
    for regs in replay(observed, actions):
        held = {a for adapters in regs.values() for a in adapters}
        assert ready <= held, f"hot adapters without a replica: {ready - held}"
        ready |= held & hot
    _check_limits(observed, actions)
