"""Plan review: what a plan changes against another, per pod and per adapter, and why.

Owns the comparison an operator reads before applying a plan (``lorafleet review``
and ``lorafleet diff``): per pod the loads, unloads, promotions to the GPU and
demotions, the bytes they move, slots and bytes used against the pod's budget and
the traffic it takes against its capacity; per adapter its tier and replicas before
and after and the reasons (the solver's line of why, pins, replication, pipeline
group); the plan's predicted hit rate and the solver's quality; and warnings where a
plan breaks a budget the fleet file gives.

Pure: plans, fleet and catalog in, a ``PlanReview`` out; no IO, no clock. The
terminal tables are ``placement.cli.review_cmds``, the HTML report
``placement.review.report``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from placement.domain import Adapter, AdapterId, Catalog, Fleet, PodId, Tier
from placement.plan import Plan, PodPlan, SolverReport

_TIER_ORDER = {Tier.HOT: 0, Tier.WARM: 1, Tier.COLD: 2}


@dataclass(frozen=True, kw_only=True)
class Budget:
    """A pod's limits from the fleet file."""

    slots: int
    cpu_slots: int
    hbm_bytes: int
    host_bytes: int
    capacity_rps: float


@dataclass(frozen=True, kw_only=True)
class PodReview:
    pod: PodId
    hot: tuple[AdapterId, ...]
    warm: tuple[AdapterId, ...]
    #: Newly registered in host RAM (a load from storage).
    loads: tuple[AdapterId, ...]
    #: No longer registered.
    unloads: tuple[AdapterId, ...]
    #: Warm before, hot now: a host-to-GPU copy.
    promoted: tuple[AdapterId, ...]
    #: Hot before, warm now: the GPU slot is freed, the host copy kept.
    demoted: tuple[AdapterId, ...]
    #: Bytes of the loads plus the promotions; None without a catalog to size them.
    bytes_moved: int | None
    hbm_bytes_used: int
    host_bytes_used: int
    expected_rps: float
    budget: Budget | None

    @property
    def changed(self) -> bool:
        return bool(self.loads or self.unloads or self.promoted or self.demoted)


@dataclass(frozen=True, kw_only=True)
class AdapterReview:
    adapter: AdapterId
    tier: Tier
    #: None when there is no plan to compare against.
    before: Tier | None
    pods: Mapping[PodId, float]
    before_pods: tuple[PodId, ...]
    reasons: tuple[str, ...]
    why: str

    @property
    def replicas(self) -> int:
        return len(self.pods)

    @property
    def changed(self) -> bool:
        return self.before is not None and (
            self.before is not self.tier or set(self.before_pods) != set(self.pods)
        )


@dataclass(frozen=True, kw_only=True)
class PlanReview:
    plan_id: str
    against_id: str | None
    pods: tuple[PodReview, ...]
    adapters: tuple[AdapterReview, ...]
    predicted: Mapping[str, float]
    before_predicted: Mapping[str, float] | None
    solver: SolverReport
    warnings: tuple[str, ...] = field(default=())

    @property
    def loads(self) -> int:
        return sum(len(pod.loads) for pod in self.pods)

    @property
    def unloads(self) -> int:
        return sum(len(pod.unloads) for pod in self.pods)

    @property
    def bytes_moved(self) -> int | None:
        moved = [pod.bytes_moved for pod in self.pods]
        return None if any(b is None for b in moved) else sum(b or 0 for b in moved)

    def tiers(self) -> dict[Tier, int]:
        counts = dict.fromkeys(Tier, 0)
        for adapter in self.adapters:
            counts[adapter.tier] += 1
        return counts


def budgets_of(fleet: Fleet) -> dict[PodId, Budget]:
    return {
        pod.name: Budget(
            slots=pod.max_loras,
            cpu_slots=pod.max_cpu_loras,
            hbm_bytes=pod.hbm_adapter_bytes,
            host_bytes=pod.host_adapter_bytes,
            capacity_rps=pod.capacity_rps,
        )
        for pod in fleet.pods
    }


def review_plan(
    plan: Plan,
    *,
    against: Plan | None = None,
    fleet: Fleet | None = None,
    catalog: Catalog | None = None,
) -> PlanReview:
    """Review ``plan``; with ``against``, what it changes from that plan."""
    budgets = budgets_of(fleet) if fleet is not None else {}
    sizes = {a.name: a.size_bytes for a in catalog.adapters} if catalog is not None else None
    empty = PodPlan()
    pod_ids = sorted(set(plan.pods) | (set(against.pods) if against is not None else set()))
    pods = tuple(
        _pod_review(
            pod_id,
            plan.pods.get(pod_id, empty),
            against.pods.get(pod_id, empty) if against is not None else empty,
            budget=budgets.get(pod_id),
            sizes=sizes,
        )
        for pod_id in pod_ids
    )
    adapters = _adapter_reviews(plan, against, catalog)
    return PlanReview(
        plan_id=plan.id,
        against_id=against.id if against is not None else None,
        pods=pods,
        adapters=adapters,
        predicted=plan.predicted,
        before_predicted=against.predicted if against is not None else None,
        solver=plan.solver,
        warnings=tuple(_warnings(plan, pods, fleet)),
    )


def _pod_review(
    pod_id: PodId,
    after: PodPlan,
    before: PodPlan,
    *,
    budget: Budget | None,
    sizes: Mapping[AdapterId, int] | None,
) -> PodReview:
    registered_before, registered_after = set(before.registered), set(after.registered)
    loads = tuple(a for a in after.registered if a not in registered_before)
    promoted = tuple(a for a in after.hot if a in before.warm)
    moved: int | None = None
    if sizes is not None:
        moved = sum(sizes.get(a, 0) for a in loads + promoted)
    return PodReview(
        pod=pod_id,
        hot=after.hot,
        warm=after.warm,
        loads=loads,
        unloads=tuple(a for a in before.registered if a not in registered_after),
        promoted=promoted,
        demoted=tuple(a for a in after.warm if a in before.hot),
        bytes_moved=moved,
        hbm_bytes_used=after.hbm_bytes_used,
        host_bytes_used=after.host_bytes_used,
        expected_rps=after.expected_rps,
        budget=budget,
    )


def _adapter_reviews(
    plan: Plan, against: Plan | None, catalog: Catalog | None
) -> tuple[AdapterReview, ...]:
    by_name = {a.name: a for a in catalog.adapters} if catalog is not None else {}
    names = set(plan.adapters) | (set(against.adapters) if against is not None else set())
    pinned_on = _pinned_pods(plan)
    reviews = []
    for name in names:
        entry = plan.adapters.get(name)
        tier = plan.tier_of(name)
        pods = entry.pods if entry is not None else MappingProxyType({})
        before_entry = against.adapters.get(name) if against is not None else None
        reviews.append(
            AdapterReview(
                adapter=name,
                tier=tier,
                before=against.tier_of(name) if against is not None else None,
                pods=pods,
                before_pods=tuple(sorted(before_entry.pods)) if before_entry is not None else (),
                reasons=_reasons(tier, len(pods), by_name.get(name), pinned_on.get(name, ())),
                why=plan.why.get(name, ""),
            )
        )
    return tuple(
        sorted(reviews, key=lambda r: (_TIER_ORDER[r.tier], -r.replicas, not r.changed, r.adapter))
    )


def _pinned_pods(plan: Plan) -> dict[AdapterId, tuple[PodId, ...]]:
    pinned: dict[AdapterId, list[PodId]] = {}
    for pod_id, pod in sorted(plan.pods.items()):
        for adapter in pod.pinned:
            pinned.setdefault(adapter, []).append(pod_id)
    return {adapter: tuple(pods) for adapter, pods in pinned.items()}


def _reasons(
    tier: Tier, replicas: int, adapter: Adapter | None, pinned_pods: tuple[PodId, ...]
) -> tuple[str, ...]:
    """The rules behind a placement that a person may question, beyond the forecast."""
    reasons = []
    if pinned_pods:
        reasons.append(f"pinned on {', '.join(pinned_pods)}")
    elif adapter is not None and adapter.is_pinned:
        reasons.append("pinned in the catalog")
    hot = tier is Tier.HOT
    if adapter is not None and hot and 1 < adapter.min_replicas >= replicas:
        reasons.append(f"min_replicas {adapter.min_replicas}")
    if hot and replicas > 1:
        reasons.append(f"replicated on {replicas} pods")
    if adapter is not None and adapter.group:
        reasons.append(f"pipeline group {adapter.group}")
    return tuple(reasons)


def _warnings(plan: Plan, pods: tuple[PodReview, ...], fleet: Fleet | None) -> list[str]:
    if fleet is None:
        return []
    known = {pod.name for pod in fleet.pods}
    found = [f"{p}: in the plan but not in the fleet" for p in sorted(set(plan.pods) - known)]
    for pod in pods:
        found.extend(_over_budget(pod))
    return found


def _over_budget(pod: PodReview) -> list[str]:
    budget = pod.budget
    if budget is None:
        return []
    checks = [
        (len(pod.hot), budget.slots, "hot adapters", "GPU slots"),
        (len(pod.hot) + len(pod.warm), budget.cpu_slots, "registered adapters", "host slots"),
        (pod.hbm_bytes_used, budget.hbm_bytes, "GPU adapter bytes", "hbm_adapter_bytes"),
        (pod.host_bytes_used, budget.host_bytes, "host adapter bytes", "host_adapter_bytes"),
    ]
    found = [
        f"{pod.pod}: {what} {used} exceed {limit_name} {limit}"
        for used, limit, what, limit_name in checks
        if used > limit
    ]
    if pod.expected_rps > budget.capacity_rps:
        found.append(
            f"{pod.pod}: expected {pod.expected_rps:.3g} rps exceed capacity_rps "
            f"{budget.capacity_rps:.3g}"
        )
    return found


def share(used: float, limit: float) -> float | None:
    """``used`` as a fraction of ``limit``; None without a limit."""
    return used / limit if limit > 0 else None


def human_bytes(count: int | None) -> str:
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
