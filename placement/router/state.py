"""What the router knows: the pods, their live state, the plan, swapped as one value.

``Topology`` is immutable and replaced by reference when the pods or the plan change,
so a request sees one consistent view without a lock (the swap is atomic under one
event loop). Each pod's mutable part is a ``LivePod`` (``router.live_pods``, with the
pools' ``PoolIndex``); a pod that stays in the fleet keeps its ``LivePod`` across swaps,
and every topology shares one ``RecentRates`` (``router.recent_rates``).

``Upstream`` and ``LivePod`` are importable from here too: most of the router names
them next to ``Topology``.

No IO here: the scraper, the plan watcher and the proxy fill these in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from placement.domain import AdapterId, Engine, Fleet, PodId, PoolId, Tier
from placement.plan import Plan
from placement.router.live_pods import LivePod, PoolIndex, Upstream
from placement.router.recent_rates import RecentRates
from policies import candidates as prefilter
from policies.hashing import HashRing, build_ring

__all__ = [
    "LEAST_QUEUED",
    "LivePod",
    "PoolView",
    "Topology",
    "Upstream",
    "build_topology",
    "upstreams_from_fleet",
]

#: Least-queued pods that join each decision's candidates besides holders and named pods.
LEAST_QUEUED = prefilter.DEFAULT_LEAST_QUEUED


@dataclass(frozen=True, kw_only=True)
class PoolView:
    pool: PoolId
    served_model: str
    engine: Engine
    pods: tuple[PodId, ...]
    #: The same pods' live states, in the same order (what the policy scans).
    states: tuple[LivePod, ...]
    ring: HashRing
    #: Who holds what, and the least-queued pods: the candidate pre-filter's indexes.
    index: PoolIndex


@dataclass(frozen=True, kw_only=True)
class Topology:
    """The pods by pool, the plan (or None: hashing only) and the lookups both give."""

    pools: Mapping[PoolId, PoolView]
    pods: Mapping[PodId, LivePod]
    plan: Plan | None
    #: Which pool serves an adapter: from the plan, else from the catalog.
    adapter_pool: Mapping[AdapterId, PoolId]
    #: A request naming a base model (no adapter) goes to that pool.
    base_pool: Mapping[str, PoolId]
    #: Per planned adapter, its pods (hot ones, else warm ones) and the share of its
    #: traffic each takes, restricted to pods the router knows.
    weights: Mapping[AdapterId, Mapping[str, float]]
    served: tuple[AdapterId, ...] = field(default=())
    #: The requests the router sent lately, per adapter (its pods count in it).
    recent: RecentRates = field(default_factory=RecentRates)

    def pool_of(self, model: str) -> PoolView | None:
        """The pool a request's ``model`` belongs to, or None when no pool fits."""
        pool_id = self.adapter_pool.get(AdapterId(model)) or self.base_pool.get(model)
        if pool_id is None and len(self.pools) == 1:
            pool_id = next(iter(self.pools))
        if pool_id is None:
            pool_id = self._listing_pool(AdapterId(model))
        return None if pool_id is None else self.pools.get(pool_id)

    def _listing_pool(self, adapter: AdapterId) -> PoolId | None:
        for state in self.pods.values():
            if state.ledger.is_listed(adapter):
                return state.upstream.pool
        return None


def upstreams_from_fleet(fleet: Fleet) -> tuple[Upstream, ...]:
    return tuple(
        Upstream(
            pod=pod.name,
            pool=pool.name,
            url=pod.url.rstrip("/"),
            engine=pool.engine,
            served_model=pool.served_model_name,
            max_loras=pod.max_loras,
            max_cpu_loras=pod.max_cpu_loras,
        )
        for pool in fleet.pools
        for pod in pool.pods
    )


def build_topology(
    upstreams: Iterable[Upstream],
    plan: Plan | None,
    *,
    previous: Mapping[PodId, LivePod] | None = None,
    adapter_pools: Mapping[AdapterId, PoolId] | None = None,
) -> Topology:
    """A fresh view, keeping the live state of pods that were already known."""
    previous = previous or {}
    # One count of recent requests for the router, carried from pod to pod.
    carried = next((state.recent for state in previous.values()), None)
    recent = RecentRates() if carried is None else carried
    pods: dict[PodId, LivePod] = {}
    for upstream in upstreams:
        old = previous.get(upstream.pod)
        pods[upstream.pod] = (
            old
            if old is not None and old.upstream == upstream
            else LivePod(upstream, recent=recent)
        )
    pools = _pool_views(pods)
    adapter_pool = dict(adapter_pools or {})
    weights: dict[AdapterId, Mapping[str, float]] = {}
    if plan is not None:
        _read_plan(plan, pods, adapter_pool, weights)
    return Topology(
        pools=MappingProxyType(pools),
        pods=MappingProxyType(pods),
        plan=plan,
        adapter_pool=MappingProxyType(adapter_pool),
        base_pool=MappingProxyType({view.served_model: view.pool for view in pools.values()}),
        weights=MappingProxyType(weights),
        served=tuple(sorted(weights)),
        recent=recent,
    )


def _pool_views(pods: Mapping[PodId, LivePod]) -> dict[PoolId, PoolView]:
    members: dict[PoolId, list[Upstream]] = {}
    for state in pods.values():
        members.setdefault(state.upstream.pool, []).append(state.upstream)
    views = {}
    for pool, ups in members.items():
        states = tuple(pods[u.pod] for u in sorted(ups, key=lambda u: u.pod))
        views[pool] = PoolView(
            pool=pool,
            served_model=ups[0].served_model,
            engine=ups[0].engine,
            pods=tuple(sorted(u.pod for u in ups)),
            states=states,
            ring=build_ring(u.pod for u in ups),
            index=PoolIndex(states, width=LEAST_QUEUED),
        )
    return views


def _read_plan(
    plan: Plan,
    pods: Mapping[PodId, LivePod],
    adapter_pool: dict[AdapterId, PoolId],
    weights: dict[AdapterId, Mapping[str, float]],
) -> None:
    for adapter, entry in plan.adapters.items():
        known: dict[str, float] = {p: w for p, w in entry.pods.items() if p in pods}
        if not known or entry.tier is Tier.COLD:
            continue
        adapter_pool.setdefault(adapter, pods[PodId(next(iter(known)))].upstream.pool)
        if entry.tier is Tier.WARM or sum(known.values()) <= 0.0:
            known = dict.fromkeys(known, 1.0)
        weights[adapter] = MappingProxyType(known)
    for pod_id, pod_plan in plan.pods.items():
        state = pods.get(pod_id)
        if state is not None:
            state.ledger.seed(
                hot=pod_plan.hot, warm=pod_plan.warm, pinned=pod_plan.pinned, plan_id=plan.id
            )
            state.sync()
