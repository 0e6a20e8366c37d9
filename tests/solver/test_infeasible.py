"""Planted infeasible problems: the explanation names the cause in actionable words."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from placement.domain import Adapter, AdapterId, Catalog, Fleet, PodId
from placement.errors import InfeasibleError
from placement.settings import PlannerSettings, Settings
from placement.solver import SolveOptions, extract_plan, solve
from placement.solver.infeasible import explain_by_relaxing
from placement.solver.problem_build import build_problem
from tests.factories import adapter, catalog, demand, fleet, pool

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
FAST = SolveOptions(time_limit_s=1.0, workers=1, seed=0, gap_limit=PlannerSettings().gap_limit)

SEVENTY = "llama-3.1-70b"


def _pins(n: int, *, size_mib: int = 50) -> list[Adapter]:
    return [adapter(f"pin-{i}", base=SEVENTY, pinned=True, size_mib=size_mib) for i in range(n)]


CASES = [
    pytest.param(
        catalog(*_pins(6)),
        fleet(pool("llama-70b", 3, base=SEVENTY, max_loras=4)),
        ["llama-70b-0"],
        "pins need 6 GPU slots in pool llama-70b; its pods have 4 each and 1 pod is ready",
        id="pins-exceed-slots-of-ready-pods",
    ),
    pytest.param(
        catalog(*_pins(2, size_mib=600)),
        fleet(pool("llama-70b", 1, base=SEVENTY, hbm_mib=1024)),
        None,
        "pins need 1.17 GiB of GPU adapter memory in pool llama-70b; its pods have 1 GiB each",
        id="pins-exceed-gpu-bytes",
    ),
    pytest.param(
        catalog(adapter("big", base=SEVENTY, rank=128, pinned=True)),
        fleet(pool("llama-70b", 2, base=SEVENTY, max_lora_rank=64)),
        None,
        "pinned adapter big has rank 128; pool llama-70b accepts rank at most 64",
        id="pinned-rank-too-large",
    ),
    pytest.param(
        catalog(adapter("ghost", base="qwen2.5-7b", pinned=True)),
        fleet(pool("llama-70b", 2, base=SEVENTY)),
        None,
        "ghost is pinned but no pool serves its base model qwen2.5-7b",
        id="pinned-without-pool",
    ),
    pytest.param(
        catalog(adapter("a", base=SEVENTY, pinned_pods=["llama-70b-9"])),
        fleet(pool("llama-70b", 2, base=SEVENTY)),
        None,
        "a is pinned to llama-70b-9, which is not a pod of pool llama-70b",
        id="pinned-to-unknown-pod",
    ),
    pytest.param(
        catalog(adapter("a", base=SEVENTY, pinned_pods=["llama-70b-1"])),
        fleet(pool("llama-70b", 2, base=SEVENTY)),
        ["llama-70b-0"],
        "a is pinned to llama-70b-1, which is not ready",
        id="pinned-to-unready-pod",
    ),
    pytest.param(
        catalog(*[adapter(f"n{i}", base=SEVENTY, pinned_pods=["llama-70b-0"]) for i in range(3)]),
        fleet(pool("llama-70b", 2, base=SEVENTY, max_loras=2)),
        None,
        "pins name pod llama-70b-0 for 3 adapters; it has 2 GPU slots (max_loras)",
        id="named-pod-overbooked",
    ),
    pytest.param(
        catalog(adapter("r", base=SEVENTY, pinned=True, min_replicas=3, max_replicas=4)),
        fleet(pool("llama-70b", 2, base=SEVENTY)),
        None,
        "pinned adapter r needs 3 replicas",
        id="pinned-replicas-exceed-pods",
    ),
]


@pytest.mark.parametrize(("cat", "fl", "ready", "expected"), CASES)
def test_explanations_name_the_cause(
    cat: Catalog, fl: Fleet, ready: list[str] | None, expected: str
) -> None:
    rates = {str(a.name): 1.0 for a in cat.adapters}
    problem = build_problem(
        cat,
        fl,
        demand(rates),
        settings=Settings(),
        valid_from=AT,
        ready=[PodId(p) for p in ready] if ready is not None else None,
    )
    with pytest.raises(InfeasibleError) as caught:
        solve(problem, options=FAST)
    assert any(expected in reason for reason in caught.value.reasons), caught.value.reasons


def test_capacity_shortfall_still_plans_and_says_how_much_is_missing() -> None:
    cat = catalog(adapter("a", base=SEVENTY), adapter("b", base=SEVENTY))
    fl = fleet(pool("llama-70b", 2, base=SEVENTY, capacity_rps=10.0))
    problem = build_problem(
        cat, fl, demand({"a": 10.0, "b": 10.0}), settings=Settings(), valid_from=AT
    )
    solution = solve(problem, options=FAST)
    assert solution.notes == (
        "forecast q90 traffic of pool llama-70b is 27.07 rps; its pods have 10 rps each and "
        "2 pods are ready, which carry 17 rps at 85% headroom: the plan spreads it at 135% "
        "of capacity; add pods or raise capacity_rps",
    )
    plan = extract_plan(problem, solution, created_at=AT)
    assert plan.predicted["capacity_overload"] == pytest.approx(1.3535, abs=1e-3)


def test_relaxing_one_family_at_a_time_names_the_pins() -> None:
    # Host bytes are not in the arithmetic checks, so only relaxation can find this.
    cat = catalog(*_pins(2, size_mib=300))
    fl = fleet(pool("llama-70b", 1, base=SEVENTY, hbm_mib=2048, host_mib=400))
    problem = build_problem(
        cat, fl, demand({"pin-0": 1.0, "pin-1": 1.0}), settings=Settings(), valid_from=AT
    )
    reasons = explain_by_relaxing(problem.pools[0], time_limit_s=1.0)
    assert reasons == [
        "pool llama-70b: the pins cannot all hold within the pods' GPU slots and bytes; "
        "a plan exists without them: relax them or add pods"
    ]
    with pytest.raises(InfeasibleError, match="the pins cannot all hold"):
        solve(problem, options=FAST)


def test_unpinned_adapters_that_fit_nowhere_are_cold_not_infeasible() -> None:
    cat = catalog(adapter("big", base=SEVENTY, rank=128), adapter("ok", base=SEVENTY))
    fl = fleet(pool("llama-70b", 2, base=SEVENTY, max_lora_rank=64))
    problem = build_problem(
        cat, fl, demand({"big": 5.0, "ok": 1.0}), settings=Settings(), valid_from=AT
    )
    solution = solve(problem, options=FAST)
    assert AdapterId("big") not in solution.pools[0].assignment.hot
    assert AdapterId("ok") in solution.pools[0].assignment.hot


def test_pins_that_fit_the_pool_but_not_pod_by_pod_are_named() -> None:
    # 3 x 60 MiB fit 2 x 100 MiB of GPU adapter memory in total, but one per pod.
    cat = catalog(*[adapter(f"p{i}", base=SEVENTY, pinned=True, size_mib=60) for i in range(3)])
    fl = fleet(pool("llama-70b", 2, base=SEVENTY, hbm_mib=100))
    settings = Settings(planner=PlannerSettings(replicate_share=1.0))
    problem = build_problem(
        cat, fl, demand({"p0": 1.0, "p1": 1.0, "p2": 1.0}), settings=settings, valid_from=AT
    )
    with pytest.raises(InfeasibleError, match="pins do not fit pod by pod in pool llama-70b"):
        solve(problem, options=FAST)
