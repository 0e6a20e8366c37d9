"""Zones: a hot adapter's replicas spread over the pool's zones, and the plan says so.

With room enough, no zone holds more than its even share of an adapter's replicas,
whether stage 2 is the greedy packer or CP-SAT; pins that keep replicas in one zone are
kept, and the plan's why says the replicas are not spread. A pool in one zone (or
none) adds nothing to the why.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]  # no stubs: types-jsonschema is not installed
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import Adapter, AdapterId, Fleet, PodId, Tier
from placement.plan import plan_to_json
from placement.settings import PlannerSettings, Settings
from placement.solver import SolveOptions, build_problem, extract_plan, solve
from placement.solver.greedy import greedy_counts
from placement.solver.packing import assign_pods
from placement.solver.packing_sat import pack_hot
from tests.factories import adapter, catalog, demand, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
FAST = SolveOptions(time_limit_s=2.0, workers=1, seed=0, gap_limit=PlannerSettings().gap_limit)
SETTINGS = Settings(planner=PlannerSettings(replicate_share=1.0))
SCHEMA = Path(__file__).parents[2] / "placement" / "schemas" / "plan.schema.json"


def zoned(pods: int, zones: str, *, max_loras: int, max_cpu_loras: int) -> Fleet:
    """``pods`` pods, the i-th in zone ``zones[i % len(zones)]``."""
    base = pool("p", pods, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    members = tuple(
        replace(member, zone=zones[i % len(zones)]) for i, member in enumerate(base.pods)
    )
    return fleet(replace(base, pods=members))


def replicated(name: str, replicas: int, *, pinned_pods: tuple[PodId, ...] = ()) -> Adapter:
    return replace(
        adapter(name), min_replicas=replicas, max_replicas=replicas, pinned_pods=pinned_pods
    )


def over_cap(fl: Fleet, hot: dict[AdapterId, tuple[PodId, ...]]) -> list[str]:
    zone_of = {p.name: p.zone for p in fl.pods}
    zones = len({z for z in zone_of.values()})
    found = []
    for name, pods in hot.items():
        if len(pods) < 2:
            continue
        per_zone = Counter(zone_of[p] for p in pods)
        cap = -(-len(pods) // zones)
        if max(per_zone.values()) > cap:
            found.append(f"{name}: {dict(per_zone)} over {cap} a zone")
    return found


@st.composite
def roomy_zoned(draw: st.DrawFn) -> tuple[Fleet, list[Adapter]]:
    zones = draw(st.sampled_from(["ab", "abc"]))
    pods = draw(st.integers(len(zones), 6))
    n = draw(st.integers(1, 5))
    adapters = [replicated(f"a{i}", draw(st.integers(1, min(pods, 3)))) for i in range(n)]
    return zoned(pods, zones, max_loras=n, max_cpu_loras=2 * n), adapters


@settings(max_examples=40, deadline=None)
@given(roomy_zoned())
def test_with_room_no_zone_holds_more_than_its_share_of_an_adapters_replicas(
    case: tuple[Fleet, list[Adapter]],
) -> None:
    fl, adapters = case
    rates = {str(a.name): 1.0 for a in adapters}
    problem = build_problem(catalog(*adapters), fl, demand(rates), settings=SETTINGS, valid_from=AT)
    (pool_problem,) = problem.pools
    counts = greedy_counts(pool_problem)
    greedy = assign_pods(pool_problem, counts)
    assert greedy is not None
    assert over_cap(fl, dict(greedy.hot)) == []
    packed, _ = pack_hot(pool_problem, counts, time_limit_s=2.0, workers=1, seed=0)
    assert packed is not None
    assert over_cap(fl, packed) == []
    solution = solve(problem, options=FAST)
    assert over_cap(fl, dict(solution.pools[0].assignment.hot)) == []


def test_two_replicas_on_four_pods_in_two_zones_span_both_and_the_plan_says_so() -> None:
    fl = zoned(4, "ab", max_loras=2, max_cpu_loras=4)
    adapters = [replicated("busy", 2), replicated("also", 2)]
    problem = build_problem(
        catalog(*adapters), fl, demand({"busy": 2.0, "also": 1.0}), settings=SETTINGS, valid_from=AT
    )
    plan = extract_plan(problem, solve(problem, options=FAST), created_at=AT)
    jsonschema.validate(json.loads(plan_to_json(plan)), json.loads(SCHEMA.read_text()))
    for name in ("busy", "also"):
        zones = {p.zone for p in fl.pods if AdapterId(name) in plan.pods[p.name].hot}
        assert zones == {"a", "b"}
        assert "replicas span zones a (1), b (1)" in plan.why[AdapterId(name)]


def test_cp_sat_moves_a_replica_to_the_other_zone_rather_than_keep_both_in_one() -> None:
    # Both replicas are hot in zone a now; keeping them costs no load, yet one moves.
    fl = zoned(4, "ab", max_loras=2, max_cpu_loras=4)
    now = {PodId("p-0"): {AdapterId("busy"): Tier.HOT}, PodId("p-2"): {AdapterId("busy"): Tier.HOT}}
    problem = build_problem(
        catalog(replicated("busy", 2)),
        fl,
        demand({"busy": 1.0}),
        settings=SETTINGS,
        valid_from=AT,
        current=now,
    )
    (pool_problem,) = problem.pools
    packed, _ = pack_hot(
        pool_problem, greedy_counts(pool_problem), time_limit_s=2.0, workers=1, seed=0
    )
    assert packed is not None
    assert over_cap(fl, packed) == []
    assert len(set(packed[AdapterId("busy")]) & {"p-0", "p-2"}) == 1  # one kept, one moved


def test_pins_in_one_zone_are_kept_and_the_why_says_the_replicas_are_not_spread() -> None:
    fl = zoned(4, "ab", max_loras=2, max_cpu_loras=4)
    pinned = replicated("pinned", 2, pinned_pods=(PodId("p-0"), PodId("p-2")))
    problem = build_problem(
        catalog(pinned), fl, demand({"pinned": 1.0}), settings=SETTINGS, valid_from=AT
    )
    plan = extract_plan(problem, solve(problem, options=FAST), created_at=AT)
    assert {pod for pod, held in plan.pods.items() if AdapterId("pinned") in held.hot} == {
        "p-0",
        "p-2",
    }
    assert (
        "replicas in zones a (2), not spread over the pool's zones a, b"
        in plan.why[AdapterId("pinned")]
    )


def test_a_pool_in_one_zone_says_nothing_of_zones() -> None:
    fl = zoned(4, "a", max_loras=2, max_cpu_loras=4)
    problem = build_problem(
        catalog(replicated("busy", 2)), fl, demand({"busy": 1.0}), settings=SETTINGS, valid_from=AT
    )
    plan = extract_plan(problem, solve(problem, options=FAST), created_at=AT)
    assert "zone" not in plan.why[AdapterId("busy")]
