"""What the router knows: the pods, their live state, the plan, swapped as one value.

``Topology`` is immutable and replaced by reference when the pods or the plan change,
so a request sees one consistent view without a lock (the swap is atomic under one
event loop). ``LivePod`` is the mutable part per pod: the last scrape, the router's
own requests in flight, the ledger and the loads in progress; a pod that stays in
the fleet keeps its ``LivePod`` across swaps.

Each pool keeps a ``PoolIndex``: which of its pods hold or load each adapter, its
least-queued pods and its least-KV pod, so that the picker hands a decision the few
candidates ``policies.candidates`` chooses instead of the whole pool. A ``LivePod``
updates its pool's holders itself when its ledger or its loads change; the scraper
refreshes the queue and KV rankings after each round.

``RecentRates`` counts the requests the router sends, per adapter, over the last 20
minutes: the recent rate that caps a victim's forecast (``VictimWorth.rate``), one
counter shared by every pod of every topology.

No IO here: the scraper, the plan watcher and the proxy fill these in.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from yarl import URL

from placement.domain import AdapterId, Engine, Fleet, PodId, PoolId, Tier
from placement.plan import Plan
from placement.ports import PodMetrics
from placement.residency import engine_model
from placement.router.ledger import PodLedger
from policies import candidates as prefilter
from policies.hashing import HashRing, build_ring

#: Least-queued pods that join each decision's candidates besides holders and named pods.
LEAST_QUEUED = prefilter.DEFAULT_LEAST_QUEUED


#: The window of the recent rate: the replay's (``placement.sim.planning.RECENT_S``).
RECENT_WINDOW_S = 1200.0


class RecentRates(Mapping[str, float]):
    """Each adapter's rate (req/s, over the fleet) as the router sent its requests in
    the last ``window_s``, counted in buckets of ``slice_s``, as of the last request
    counted. Read as a mapping (absent: no request in the window) at each decision;
    ``add`` is O(1) but for the bucket that falls out of the window."""

    __slots__ = ("_buckets", "_first_s", "_last_s", "_totals", "slice_s", "span")

    def __init__(self, *, window_s: float = RECENT_WINDOW_S, slice_s: float = 60.0) -> None:
        if slice_s <= 0 or window_s < slice_s:
            raise ValueError(f"recent rates: a bucket of {slice_s} s must be within {window_s} s")
        self.slice_s = slice_s
        #: Buckets kept: the current one and those within the window before it.
        self.span = math.ceil(window_s / slice_s)
        self._buckets: deque[tuple[int, dict[str, int]]] = deque()
        self._totals: dict[str, int] = {}
        self._first_s = math.inf
        self._last_s = -math.inf

    def add(self, adapter: str, now_s: float) -> None:
        """A request for ``adapter`` was sent at ``now_s`` (the router's clock)."""
        bucket = math.floor(now_s / self.slice_s)
        buckets = self._buckets
        if not buckets or bucket > buckets[-1][0]:
            buckets.append((bucket, {}))
            self._expire(bucket)
        counts = buckets[-1][1]  # a clock that stepped back counts in the newest bucket
        counts[adapter] = counts.get(adapter, 0) + 1
        self._totals[adapter] = self._totals.get(adapter, 0) + 1
        self._first_s = min(self._first_s, now_s)
        self._last_s = max(self._last_s, now_s)

    def _expire(self, bucket: int) -> None:
        totals, oldest = self._totals, bucket - self.span + 1
        while self._buckets[0][0] < oldest:
            for adapter, count in self._buckets.popleft()[1].items():
                left = totals[adapter] - count
                if left > 0:
                    totals[adapter] = left
                else:
                    del totals[adapter]

    def _span_s(self) -> float:
        """Seconds the counts cover: from the oldest bucket kept (or the first request,
        if later) to the last request; at least one bucket."""
        start_s = max(self._first_s, self._buckets[0][0] * self.slice_s)
        return max(self.slice_s, self._last_s - start_s)

    def __getitem__(self, adapter: str) -> float:
        return self._totals[adapter] / self._span_s()

    def get(self, adapter: str, default: float = 0.0) -> float:  # type: ignore[override]
        count = self._totals.get(adapter)
        return default if count is None else count / self._span_s()

    def __iter__(self) -> Iterator[str]:
        return iter(self._totals)

    def __len__(self) -> int:
        return len(self._totals)


@dataclass(frozen=True, kw_only=True, slots=True)
class Upstream:
    """One pod as the router reaches it."""

    pod: PodId
    pool: PoolId
    url: str
    engine: Engine
    #: The pool's served base model: SGLang needs ``<base>:<adapter>`` as the model.
    served_model: str
    max_loras: int
    max_cpu_loras: int


class LivePod:
    """The live, mutable state of one pod.

    It is also ``policies.routing.PodLike`` as plain attributes, kept current as the
    state changes, so that a routing decision over 64 pods reads fields, not
    properties, and copies nothing.
    """

    __slots__ = (
        "busy",
        "failures",
        "free_slots",
        "gpu_adapters",
        "gpu_util",
        "health_probed",
        "healthy",
        "held",
        "held_version",
        "index",
        "inflight",
        "inflight_at_scrape",
        "kv_usage",
        "last_used_s",
        "ledger",
        "listing_due",
        "loading",
        "max_loras",
        "metrics",
        "metrics_missing",
        "pod_id",
        "position",
        "queue_depth",
        "recent",
        "registered",
        "running",
        "running_adapters",
        "service_ms",
        "upstream",
        "urls",
        "victim_last_used_s",
        "waiting_adapters",
    )

    def __init__(self, upstream: Upstream, *, recent: RecentRates | None = None) -> None:
        self.upstream = upstream
        #: The router's recent rates, which every request sent here counts in.
        self.recent = RecentRates() if recent is None else recent
        self.ledger = PodLedger(
            engine_model(upstream.engine),
            max_loras=upstream.max_loras,
            max_cpu_loras=upstream.max_cpu_loras,
        )
        #: Unknown pods are given the benefit of the doubt until the first scrape.
        self.healthy = True
        self.failures = 0
        self.metrics = PodMetrics()
        #: SGLang without --enable-metrics: ``/metrics`` answers 404, ``/health`` decides.
        self.metrics_missing = False
        #: Whether ``/health`` was asked since ``/metrics`` went missing.
        self.health_probed = False
        #: Read ``/v1/models`` at the next scrape: someone else loaded an adapter here.
        self.listing_due = False
        self.inflight = 0
        self.inflight_at_scrape = 0
        #: The router's requests in flight here per adapter: the engine evicts none of
        #: these while it has another choice (the ledger's ``busy``).
        self.busy: dict[AdapterId, int] = {}
        #: Moving average of time to first byte, the per-request service estimate.
        self.service_ms = 50.0
        #: Adapters being brought onto this pod, each with the future its waiters share.
        self.loading: dict[AdapterId, asyncio.Future[None]] = {}
        #: When each adapter was last routed here, on the router's clock.
        self.last_used_s: dict[AdapterId, float] = {}
        #: The pod's URL per path, parsed once (the proxy's upstream calls reuse them).
        self.urls: dict[str, URL] = {}
        # policies.routing.PodLike:
        self.pod_id: str = upstream.pod
        self.max_loras = self.ledger.max_loras
        #: Live views of the ledger's LRUs (least recently used first), not copies.
        self.gpu_adapters: Collection[str] = self.ledger.active_view
        self.registered: Collection[str] = self.ledger.registered_view
        self.gpu_util = 0.0  # neither engine exports it; scorers that use it see an idle GPU
        self.queue_depth = 0
        self.running = 0
        self.kv_usage = 0.0
        self.running_adapters: Collection[str] = frozenset()
        self.waiting_adapters: Collection[str] = frozenset()
        self.free_slots = self.max_loras
        self.victim_last_used_s = 0.0
        #: The pool's index this pod reports its adapters to, its position there, and
        #: what it reported (host RAM, GPU and loading), as of the ledger's version.
        self.index: PoolIndex | None = None
        self.position = 0
        self.held: frozenset[str] = frozenset()
        self.held_version = -1

    def url_of(self, path: str) -> URL:
        """``path`` on this pod, parsed once per path."""
        url = self.urls.get(path)
        if url is None:
            url = self.urls[path] = URL(self.upstream.url + path)
        return url

    def attach(self, index: PoolIndex, position: int) -> None:
        """Report to ``index`` (a new topology's) from now on, at ``position``."""
        self.index, self.position = index, position
        self.held, self.held_version = frozenset(), -1
        self._reindex()

    def _reindex(self) -> None:
        index = self.index
        if index is None:
            return
        self.held_version = self.ledger.version
        now = frozenset(self.registered).union(self.gpu_adapters, self.loading)
        if now == self.held:
            return
        for adapter in self.held - now:
            index.drop(adapter, self.position)
        for adapter in now - self.held:
            index.add(adapter, self.position)
        self.held = now

    def start_loading(self, adapter: AdapterId, done: asyncio.Future[None]) -> None:
        self.loading[adapter] = done
        self._reindex()

    def stop_loading(self, adapter: AdapterId) -> None:
        if self.loading.pop(adapter, None) is not None:
            self._reindex()

    def sync(self) -> None:
        """Recompute the fields derived from the ledger; call after changing it."""
        if self.ledger.version != self.held_version:
            self._reindex()
        self.free_slots = self.ledger.free_slots()
        victim = next(iter(self.gpu_adapters), None)
        #: When the adapter this pod would evict next was last routed here.
        self.victim_last_used_s = (
            0.0 if victim is None else self.last_used_s.get(AdapterId(victim), 0.0)
        )

    def note_use(self, adapter: AdapterId, now_s: float) -> None:
        """A request for ``adapter`` is sent here: the engine activates it."""
        self.ledger.activate(adapter, busy=self.busy.keys())
        self.last_used_s[adapter] = now_s
        self.recent.add(adapter, now_s)
        if len(self.last_used_s) > 4 * self.ledger.max_cpu_loras + 64:
            self.last_used_s = {a: self.last_used_s.get(a, 0.0) for a in self.ledger.active_view}
        self.sync()

    def begin(self, adapter: AdapterId | None = None) -> None:
        """A request (for ``adapter``, None: the base model) was sent to the pod."""
        self.inflight += 1
        if adapter is not None:
            self.busy[adapter] = self.busy.get(adapter, 0) + 1
        self._requeue()

    def end(self, adapter: AdapterId | None = None) -> None:
        self.inflight -= 1
        if adapter is not None:
            left = self.busy.pop(adapter, 1) - 1
            if left > 0:
                self.busy[adapter] = left
        self._requeue()

    def _requeue(self) -> None:
        #: Waiting at the pod: the last scrape, plus what the router sent since.
        self.queue_depth = self.metrics.waiting + max(0, self.inflight - self.inflight_at_scrape)

    def queue_len(self) -> float:
        return self.queue_depth

    def observe(self, metrics: PodMetrics) -> None:
        self.metrics = metrics
        self.inflight_at_scrape = self.inflight
        self.running = metrics.running
        self.kv_usage = metrics.kv_usage
        self.running_adapters = metrics.running_adapters
        self.waiting_adapters = metrics.waiting_adapters
        self._requeue()
        self.sync()

    def observe_ttfb(self, ms: float) -> None:
        self.service_ms += 0.1 * (ms - self.service_ms)


class PoolIndex:
    """A pool's indexes for the candidate pre-filter (``policies.candidates``).

    ``holders`` is kept current by the pods themselves (``LivePod.sync``, loads);
    ``refresh`` re-ranks the queues and KV use: the scraper calls it after a round and
    when a pod leaves the rotation. Between refreshes the least-queued few may be
    stale; the decision still reads their live queues.
    """

    __slots__ = ("holders", "least_kv", "least_queued", "positions", "states", "width")

    def __init__(self, states: tuple[LivePod, ...], *, width: int) -> None:
        self.states = states
        self.width = width
        self.positions = {state.pod_id: i for i, state in enumerate(states)}
        self.holders: dict[str, set[int]] = {}
        self.least_queued: tuple[int, ...] = ()
        self.least_kv: int | None = None
        for i, state in enumerate(states):
            state.attach(self, i)
        self.refresh()

    def add(self, adapter: str, position: int) -> None:
        held = self.holders.get(adapter)
        if held is None:
            self.holders[adapter] = {position}
        else:
            held.add(position)

    def drop(self, adapter: str, position: int) -> None:
        held = self.holders.get(adapter)
        if held is not None:
            held.discard(position)
            if not held:
                del self.holders[adapter]

    def refresh(self) -> None:
        self.least_queued = prefilter.least_queued(self.states, count=self.width)
        self.least_kv = prefilter.least_kv(self.states)

    def candidates(self, adapter: str, named: Collection[str] = ()) -> list[LivePod]:
        """The pods a decision for ``adapter`` needs, in pool order; ``named``: pods it
        must see (the plan's, the ring's owners)."""
        return prefilter.candidates(
            self.states,
            holders=self.holders.get(adapter, ()),
            least_queued=self.least_queued,
            least_kv=self.least_kv,
            named=named,
            positions=self.positions,
        )


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
