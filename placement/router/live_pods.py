"""The live state of each pod the router reaches, and its pool's candidate index.

``Upstream`` is one pod as the router reaches it. ``LivePod`` is the mutable part per
pod: the last scrape, the router's own requests in flight, the ledger and the loads in
progress; a pod that stays in the fleet keeps its ``LivePod`` across topology swaps
(``router.state``).

Each pool keeps a ``PoolIndex``: which of its pods hold or load each adapter, its
least-queued pods and its least-KV pod, so that the picker hands a decision the few
candidates ``policies.candidates`` chooses instead of the whole pool. A ``LivePod``
updates its pool's holders itself when its ledger or its loads change; the scraper
refreshes the queue and KV rankings after each round.

No IO here: the scraper and the proxy fill these in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass

from yarl import URL

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.ports import PodMetrics
from placement.residency import Entry, engine_model
from placement.router.ledger import PodLedger
from placement.router.recent_rates import RecentRates
from policies import candidates as prefilter


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
        "_ended_since_asked",
        "busy",
        "ended_since_scrape",
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
        "seat_s",
        "seats",
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
        #: How many requests the pod's batch holds, as its scrapes show it: the running
        #: count of the last scrape with requests waiting (the batch was full: its
        #: ``max_num_seqs``, or what its KV cache admits), else the most seen running.
        #: A lower bound until the pod is seen full; 0 before the first scrape.
        self.seats = 0
        #: Moving average of how long the router's requests that ran here were in
        #: flight (sent to their last byte): how long one holds a seat of the batch.
        #: 0 until one is measured.
        self.seat_s = 0.0
        #: The router's requests in flight here, per engine-model entry each holds (its
        #: adapter's entry as it was sent; the name where the ledger had none): the
        #: engine evicts none of these while it has another choice (the ledger's
        #: ``busy``). By entry, as the engines count a batch (vLLM by id): after an
        #: unload and a reload of a name, the old entry's requests hold the old slot.
        self.busy: dict[Entry | AdapterId, int] = {}
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
        #: The adapters the last scrape showed running or waiting whose last request of
        #: the router's here has ended since the page was asked for: what it showed of
        #: them is gone (``picking.slot_taken``). At most the scrape's own adapters;
        #: renewed at each scrape.
        self.ended_since_scrape: set[str] = set()
        #: The adapters whose last request of the router's here ended since the page
        #: being read was asked for (``page_asked``); None: no page asked.
        self._ended_since_asked: set[str] | None = None
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
        self._note_victim()

    def _note_victim(self) -> None:
        #: When the adapter this pod would evict next (the ledger's engine model, the
        #: router's requests in flight busy) was last routed here.
        victim = self.ledger.next_victim(self.busy.keys())
        self.victim_last_used_s = 0.0 if victim is None else self.last_used_s.get(victim, 0.0)

    def note_use(self, adapter: AdapterId, now_s: float) -> None:
        """A request for ``adapter`` is sent here: the engine activates it."""
        self.ledger.activate(adapter, busy=self.busy.keys())
        self.last_used_s[adapter] = now_s
        self.recent.add(adapter, now_s)
        if len(self.last_used_s) > 4 * self.ledger.max_cpu_loras + 64:
            self.last_used_s = {a: self.last_used_s.get(a, 0.0) for a in self.ledger.active_view}
        self.sync()

    def begin(self, adapter: AdapterId | None = None) -> Entry | AdapterId | None:
        """A request (for ``adapter``, None: the base model) was sent to the pod; it
        holds its adapter's entry as the ledger has it now (after ``note_use``).
        Returns what it holds (the entry, else the name; None for the base model), for
        its ``end`` to release that, not another entry of the name."""
        self.inflight += 1
        if adapter is None:
            self._requeue()
            return None
        key: Entry | AdapterId = self.ledger.entry(adapter) or adapter
        busy = self.busy
        held = busy.get(key, 0)
        busy[key] = held + 1
        if not held:  # a key newly busy: the victim may change (else nothing it reads did)
            self._note_victim()
        self._requeue()
        return key

    def end(
        self,
        adapter: AdapterId | None = None,
        *,
        held: Entry | AdapterId | None = None,
        ran: bool = False,
        took_s: float | None = None,
    ) -> None:
        """A request ``begin`` counted left the pod. ``held``: what ``begin`` returned
        for it (the engines release the entry a request ran on, however the requests
        of a name end in turn); None: the name's entry in flight longest. ``ran``: the
        pod ran it to its end (the proxy saw its stream end), so its last step touched
        its entry in the engine's LRUs (``PodLedger.last_step``: its GPU slot on both
        engines, on vLLM its host-cache entry too), as the replay's
        ``FleetReplay._done`` does. False: it did not run here (refused, failed over).
        ``last_used_s`` keeps the request's arrival, as the replay's
        ``SimPod.last_used``: the victim's worth counts its idle time from its last
        request's arrival (a Poisson stream's last event; counting from the end
        measured worse, docs/benchmarks.md). ``took_s``: how long it was in flight, for
        ``seat_s`` (given for a request that ran)."""
        self.inflight -= 1
        if took_s is not None:
            seat_s = self.seat_s
            self.seat_s = took_s if seat_s == 0.0 else seat_s + 0.05 * (took_s - seat_s)
        if adapter is not None:
            key = held if held is not None else self._held_by(adapter)
            busy = self.busy
            left = busy.get(key, 1) - 1
            if left > 0:
                busy[key] = left  # in place: the order says who is in flight longest
            else:
                busy.pop(key, None)
                self._ended(adapter)
            if ran:
                self.ledger.last_step(key if isinstance(key, Entry) else self.ledger.entry(key))
            if ran or left <= 0:  # the LRU order or the busy keys moved: the victim may
                self._note_victim()
        self._requeue()

    def _ended(self, adapter: AdapterId) -> None:
        """The router's last request for ``adapter`` here ended: what the last scrape
        showed of it running or waiting is taken for the router's own, gone now.

        With other senders (``--workers``, a client beside the router) it may have been
        theirs: the reading then leans toward a free slot, as with the pricing off
        (``RouterSettings.price_slot_wait``), for the adapters they send too. Asking
        that every request the scrape counted be the router's (its running and waiting
        at most the router's in flight) lost the gain in its one live run on one router
        (docs/benchmarks.md); likely, not measured: the engines count a request
        admitted but not yet resumed in both, and requests end between the pod's
        answer and its reading."""
        if adapter in self.running_adapters or adapter in self.waiting_adapters:
            self.ended_since_scrape.add(adapter)
        asked = self._ended_since_asked
        if asked is not None:
            asked.add(adapter)

    def page_asked(self) -> None:
        """The scraper asks the pod for its ``/metrics`` now: a request of the router's
        that ends before the page is read still shows on it, running or waiting, and
        ``observe`` takes it for ended (before, it was cleared there, and read as
        running until the scrape after)."""
        self._ended_since_asked = set()

    def page_taken(self) -> None:
        """The page ``observe`` gets next was asked for elsewhere (another worker's
        scrape, ``PodScraper.take``): no end is carried to it, even from an own scrape
        of this pod that failed after its asking."""
        self._ended_since_asked = None

    def _held_by(self, adapter: AdapterId) -> Entry | AdapterId:
        """What a request for ``adapter`` that ends now held: the entry of the name in
        flight longest (the emulator's ``RunningEntries.longest``), else the name."""
        for key in self.busy:
            if key == adapter or (isinstance(key, Entry) and key.name == adapter):
                return key
        return adapter

    def _requeue(self) -> None:
        """Waiting and running at the pod: the last scrape's, plus what the router sent
        since, which runs at once in the seats the scrape left free (``seats``) and
        waits beyond them, as the engines admit it (vLLM's scheduler, the emulator's
        ``Seats``). Counting every request sent since the scrape as waiting read a burst
        to a warm pod as a queue it did not have, and spilled the burst's tail to a
        cold load elsewhere."""
        metrics = self.metrics
        sent = max(0, self.inflight - self.inflight_at_scrape)
        free = 0 if metrics.waiting else max(0, self.seats - metrics.running)
        admitted = min(sent, free)
        self.running = metrics.running + admitted
        self.queue_depth = metrics.waiting + sent - admitted

    def queue_len(self) -> float:
        return self.queue_depth

    def observe(self, metrics: PodMetrics) -> None:
        self.metrics = metrics
        self.inflight_at_scrape = self.inflight
        self.seats = metrics.running if metrics.waiting else max(self.seats, metrics.running)
        self.kv_usage = metrics.kv_usage
        self.running_adapters = metrics.running_adapters
        self.waiting_adapters = metrics.waiting_adapters
        asked, self._ended_since_asked = self._ended_since_asked, None
        running, waiting = self.running_adapters, self.waiting_adapters
        self.ended_since_scrape = {a for a in asked or () if a in running or a in waiting}
        self._requeue()
        self.sync()

    def wait_per_request_s(self) -> float | None:
        """How much longer each request waiting here makes a new one wait: a seat frees
        every ``seat_s / seats`` on average while the batch is full. None until both
        are measured."""
        if self.seats <= 0 or self.seat_s <= 0.0:
            return None
        return self.seat_s / self.seats

    def observe_ttfb(self, ms: float) -> None:
        self.service_ms += 0.1 * (ms - self.service_ms)


class PoolIndex:
    """A pool's indexes for the candidate pre-filter (``policies.candidates``).

    ``holders`` is kept current by the pods themselves (``LivePod.sync``, loads);
    ``refresh`` re-ranks the queues and KV use: the scraper calls it after a round and
    when a pod leaves the rotation. Between refreshes the least-queued few may be
    stale; the decision still reads their live queues.
    """

    __slots__ = (
        "holders",
        "least_kv",
        "least_queued",
        "per_request_s",
        "positions",
        "states",
        "width",
    )

    def __init__(self, states: tuple[LivePod, ...], *, width: int) -> None:
        self.states = states
        self.width = width
        self.positions = {state.pod_id: i for i, state in enumerate(states)}
        self.holders: dict[str, set[int]] = {}
        self.least_queued: tuple[int, ...] = ()
        self.least_kv: int | None = None
        #: The pool's measured wait per queued request (the median over its pods'
        #: ``wait_per_request_s``); None until a pod has measured one.
        self.per_request_s: float | None = None
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
        waits = sorted(w for w in (s.wait_per_request_s() for s in self.states) if w is not None)
        self.per_request_s = waits[len(waits) // 2] if waits else None

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
