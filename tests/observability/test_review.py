"""Plan review: what a plan changes per pod and per adapter, budgets, and the reasons."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.domain import AdapterId, Fleet, PodId, Tier
from placement.plan import Plan
from placement.review.diff import (
    AdapterReview,
    PlanReview,
    PodReview,
    human_bytes,
    review_plan,
)
from tests import factories
from tests.factories import MIB, make_plan

NAMES = ["a", "b", "c", "d", "e"]
CATALOG = factories.catalog(*map(factories.adapter, NAMES))  # 50 MiB each


def one_pod(
    *, max_loras: int = 2, max_cpu_loras: int = 4, hbm_mib: int = 200, capacity_rps: float = 2.0
) -> Fleet:
    """pod-0: two GPU slots, four host slots, 200 MiB for adapters on the GPU, 2 rps."""
    return factories.fleet(
        factories.pool(
            "base",
            1,
            pod_prefix="pod",
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            hbm_mib=hbm_mib,
            capacity_rps=capacity_rps,
        )
    )


def pod(review: PlanReview, name: str) -> PodReview:
    return next(p for p in review.pods if p.pod == PodId(name))


def adapter(review: PlanReview, name: str) -> AdapterReview:
    return next(a for a in review.adapters if a.adapter == AdapterId(name))


def test_changes_per_pod_with_bytes_moved() -> None:
    before = make_plan({"pod-0": ["a", "b"], "pod-1": ["c"]}, {"pod-0": ["d"]}, plan_id="a")
    after = make_plan({"pod-0": ["a", "d"], "pod-1": ["e"]}, {"pod-0": ["b"]}, plan_id="b")
    review = review_plan(after, against=before, catalog=CATALOG)
    zero, one = pod(review, "pod-0"), pod(review, "pod-1")
    assert zero.loads == () and zero.unloads == ()
    assert zero.promoted == ("d",) and zero.demoted == ("b",)
    assert zero.bytes_moved == 50 * MIB  # the host-to-GPU copy of d
    assert one.loads == ("e",) and one.unloads == ("c",)
    assert one.bytes_moved == 50 * MIB
    assert (review.loads, review.unloads, review.bytes_moved) == (1, 1, 100 * MIB)
    assert review.against_id == "a" and review.plan_id == "b"
    assert adapter(review, "c").tier is Tier.COLD and adapter(review, "c").before is Tier.HOT
    assert adapter(review, "d").changed and not adapter(review, "a").changed


def test_without_a_base_every_registration_is_a_load_and_bytes_need_a_catalog() -> None:
    plan = make_plan({"pod-0": ["a"]}, {"pod-0": ["b"]})
    review = review_plan(plan)
    assert pod(review, "pod-0").loads == ("a", "b")
    assert review.bytes_moved is None
    assert human_bytes(review.bytes_moved) == "-"
    assert adapter(review, "a").before is None and not adapter(review, "a").changed


def test_same_plan_changes_nothing() -> None:
    plan = make_plan({"pod-0": ["a", "b"], "pod-1": ["a"]}, {"pod-1": ["c"]})
    review = review_plan(plan, against=plan, catalog=CATALOG)
    assert not any(p.changed for p in review.pods)
    assert not any(a.changed for a in review.adapters)
    assert review.bytes_moved == 0


@pytest.mark.parametrize(
    ("fleet_args", "expected"),
    [
        ({}, []),
        ({"max_loras": 1}, ["pod-0: hot adapters 2 exceed GPU slots 1"]),
        ({"max_cpu_loras": 2}, ["pod-0: registered adapters 3 exceed host slots 2"]),
        (
            {"hbm_mib": 80},
            ["pod-0: GPU adapter bytes 104857600 exceed hbm_adapter_bytes 83886080"],
        ),
    ],
    ids=["fits", "slots", "host-slots", "hbm-bytes"],
)
def test_budget_warnings(fleet_args: dict[str, int], expected: list[str]) -> None:
    plan = make_plan({"pod-0": ["a", "b"]}, {"pod-0": ["c"]})
    review = review_plan(plan, fleet=one_pod(**fleet_args))
    assert list(review.warnings) == expected
    assert pod(review, "pod-0").budget is not None


def test_pods_missing_from_the_fleet_and_capacity() -> None:
    plan = make_plan({"pod-0": ["a", "b", "c", "d", "e"], "pod-9": ["a"]})
    review = review_plan(plan, fleet=one_pod(max_loras=8, max_cpu_loras=8, hbm_mib=1000))
    assert "pod-9: in the plan but not in the fleet" in review.warnings
    assert "pod-0: expected 2.5 rps exceed capacity_rps 2" in review.warnings


def test_reasons_name_pins_replication_min_replicas_and_groups() -> None:
    plan = make_plan(
        {"pod-0": ["a", "b", "c"], "pod-1": ["a", "b"]},
        pinned={"pod-0": ["a"], "pod-1": ["a"]},
    )
    special = factories.catalog(
        factories.adapter("a"),
        factories.adapter("b", min_replicas=2),
        factories.adapter("c", group="doc-pipeline", pinned=True),
        factories.adapter("d"),
        factories.adapter("e"),
    )
    review = review_plan(plan, catalog=special)
    assert adapter(review, "a").reasons == ("pinned on pod-0, pod-1", "replicated on 2 pods")
    assert adapter(review, "b").reasons == ("min_replicas 2", "replicated on 2 pods")
    assert adapter(review, "c").reasons == ("pinned in the catalog", "pipeline group doc-pipeline")
    assert adapter(review, "a").why == "hot: a is busy"


def test_adapters_are_ordered_hot_then_warm_then_cold() -> None:
    before = make_plan({"pod-0": ["e"]}, plan_id="a")
    after = make_plan({"pod-0": ["a"], "pod-1": ["b", "a"]}, {"pod-1": ["c"]})
    review = review_plan(after, against=before)
    assert [a.adapter for a in review.adapters] == ["a", "b", "c", "e"]
    assert review.tiers() == {Tier.HOT: 2, Tier.WARM: 1, Tier.COLD: 1}


placements = st.dictionaries(
    st.sampled_from(["pod-0", "pod-1", "pod-2"]),
    st.lists(st.sampled_from(NAMES), unique=True, max_size=4),
    max_size=3,
)


@given(placements, placements)
def test_loads_and_unloads_turn_the_old_registrations_into_the_new(
    old: dict[str, list[str]], new: dict[str, list[str]]
) -> None:
    # Split each pod's adapters: the first half hot, the rest warm.
    def plan_of(layout: dict[str, list[str]], plan_id: str) -> Plan:
        hot = {p: names[: len(names) // 2 + 1] for p, names in layout.items() if names}
        warm = {p: names[len(names) // 2 + 1 :] for p, names in layout.items() if names}
        return make_plan(hot, warm, plan_id=plan_id)

    before, after = plan_of(old, "a"), plan_of(new, "b")
    review = review_plan(after, against=before, catalog=CATALOG)
    for entry in review.pods:
        held = set(before.pods[entry.pod].registered) if entry.pod in before.pods else set()
        wanted = set(after.pods[entry.pod].registered) if entry.pod in after.pods else set()
        assert (held - set(entry.unloads)) | set(entry.loads) == wanted
        assert set(entry.loads).isdisjoint(entry.unloads)
        assert entry.bytes_moved == 50 * MIB * (len(entry.loads) + len(entry.promoted))


@pytest.mark.parametrize(
    ("count", "text"),
    [(None, "-"), (512, "512 B"), (50 * 2**20, "50.0 MiB"), (3 * 2**30, "3.0 GiB")],
)
def test_human_bytes(count: int | None, text: str) -> None:
    assert human_bytes(count) == text
