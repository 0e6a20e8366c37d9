"""The router's running state: the topology, the background loops, the loads in flight.

Owns the periodic work: scraping every pod's ``/metrics`` (health and live load),
reading each pod's ``/v1/models`` now and then (to correct the ledger), watching the
plan source and the pod source, and flushing the request log. The plan or the pods
change by building a new ``Topology`` and swapping one reference. The scrape round
over the pods is here; one pod's scrape is ``router.scraping``'s (``PodScraper``).

Each loop only waits and calls one round: ``scrape_all``, ``refresh_plan``,
``refresh_pods``, the log's ``flush``. Tests call those rounds themselves, with the
HTTP client to the pods (``engine_http``) and the ``clock`` injected, instead of
sleeping through intervals. The loops run under ``router.loops.Supervisor``: a round
that raises is logged, counted and backed off, never the end of its loop; within a
scrape round, one pod's failure of any kind is that pod's alone (logged with its name,
counted, the pod out of the rotation until a good scrape) and the other pods are
scraped all the same. ``problems`` says what fails the health check (a loop that
ended or is stuck) and ``not_ready`` what keeps the router out of a Service (no plan
yet where one is expected, no healthy pod).

The coalesced cold loads are ``router.cold_loads``'s (``Router.load`` waits on one).

Must not parse client requests or answer them: that is ``router.asgi``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping

import httpx
from prometheus_client import CollectorRegistry

from placement.adapters.http_engine import engine_http_client
from placement.adapters.sglang import SglangClient
from placement.adapters.vllm import VllmClient
from placement.clock import Clock
from placement.domain import AdapterId, Engine
from placement.errors import PlanError
from placement.metrics import FleetMetrics
from placement.plan import Plan
from placement.router.adapter_info import AdapterInfo
from placement.router.cold_loads import ColdLoads
from placement.router.loops import Sleep, Supervisor
from placement.router.metrics import RouterMetrics
from placement.router.picking import Picker
from placement.router.reqlog import RequestLogger, RequestLogSink
from placement.router.scrape_http import AiohttpScrapes, HttpxScrapes, ScrapeHttp
from placement.router.scraping import PodScraper, ScrapeShare
from placement.router.sources import PlanSource, PodSource
from placement.router.state import LivePod, Topology, Upstream, build_topology
from placement.router.upstream import Upstreams
from placement.router.warmups import WarmupMetrics
from placement.settings import LoadCostSettings, RouterSettings

#: ``AdapterInfo`` lives in ``router.adapter_info``; its callers import it from here too.
__all__ = ["AdapterInfo", "Router"]

log = logging.getLogger("lorafleet.router")


class Router:
    """Everything the ASGI app needs, wired by the entry point.

    ``engine_http`` reaches the pods for scrapes, listings and loads (absolute URLs, so
    one client, or one test transport, serves the fleet); without one the router makes
    its own at ``start`` for loads, scrapes on an aiohttp session of its own
    (``AiohttpScrapes``), closes both at ``stop``, and never closes one it was given.
    ``clock`` gives the epoch seconds the router decides and stamps by (a request's
    arrival in the log, when an adapter was last routed, residencies); ``timer`` only
    measures latencies (time to first byte) and times the loops' rounds (a round stuck
    past ``loop_stall_s``). Client requests are proxied through an upstream client of
    the router's own (``router.upstream``), opened by ``start``. ``plan_expected``: a
    plan source was given and the policy follows it, so the router is not ready until
    it has read a plan.
    ``sleep`` is what the loops wait with (tests pass their own).
    """

    def __init__(
        self,
        *,
        plan_source: PlanSource,
        pod_source: PodSource,
        engine_http: httpx.AsyncClient | None = None,
        clock: Clock = time.time,
        timer: Clock = time.perf_counter,
        settings: RouterSettings | None = None,
        load_cost: LoadCostSettings | None = None,
        registry: CollectorRegistry | None = None,
        request_log: RequestLogSink | None = None,
        adapters: AdapterInfo | None = None,
        plan_expected: bool = False,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.settings = settings or RouterSettings()
        self.adapters = adapters or AdapterInfo()
        self.plan_source = plan_source
        self.pod_source = pod_source
        self.plan_expected = plan_expected
        registry = registry if registry is not None else CollectorRegistry()
        self.metrics = RouterMetrics(registry, max_adapter_labels=self.settings.max_adapter_labels)
        #: The thrashing signals (residency, adapters on slots) from the ledger.
        self.fleet_metrics = FleetMetrics(registry)
        #: Class warm-ups sent (``router.warmups``, under ``class_priority``).
        self.warmup_metrics = WarmupMetrics(registry)
        # The picker weighs a load's victim by its idle time on its pod by the router's
        # clock (as the replay does), and by its class under class_priority.
        self.picker = Picker(
            settings=self.settings,
            load_cost=load_cost or LoadCostSettings(),
            adapter_bytes=self.adapters.size_bytes,
            adapter_classes=self._classes(self.adapters),
            clock=clock,
        )
        self.request_log = RequestLogger(
            request_log,
            flush_interval_s=self.settings.log_flush_s,
            metrics=self.metrics,
            max_pending_rows=self.settings.max_pending_log_rows,
        )
        self.clock = clock
        self.timer = timer
        self.supervisor = Supervisor(
            metrics=self.metrics,
            timer=timer,
            backoff_max_s=self.settings.loop_backoff_max_s,
            stall_s=self.settings.loop_stall_s,
            sleep=sleep,
        )
        self.topology: Topology = build_topology((), None)
        self.plan_error: str | None = "no plan read yet"
        self.unplanned: Counter[AdapterId] = Counter()
        self.session: Upstreams | None = None
        self.engine_http = engine_http
        self._owns_engine_http = engine_http is None
        #: What the scrapes read the pods with: the given client's, else made by start.
        self.scrape_http: ScrapeHttp | None = (
            HttpxScrapes(engine_http) if engine_http is not None else None
        )
        self.scraper = PodScraper(
            settings=self.settings,
            metrics=self.metrics,
            fleet_metrics=self.fleet_metrics,
            clock=clock,
            http=self._scrape_http,
        )
        #: With ``--workers N``: worker 0 publishes its scrapes, the others follow them
        #: (``router.shared_scrapes``); None: this router scrapes every pod itself.
        self.scrape_share: ScrapeShare | None = None
        self._scrapes = 0
        self.cold_loads = ColdLoads(self)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the upstream session, read plan and pods once, start the loops."""
        # One pool of keep-alive connections per pod, reused by every request; no
        # Accept-Encoding is sent: the answer's bytes pass through as the pod wrote them.
        self.session = Upstreams(
            timeout_s=self.settings.upstream_timeout_s,
            connect_timeout_s=self.settings.connect_timeout_s,
            keepalive_s=self.settings.upstream_keepalive_s,
            max_connections=self.settings.max_connections,
        )
        if self.engine_http is None:
            # One client for every engine call (scrapes, listings, loads): a new httpx
            # client costs tens of milliseconds of CPU building its TLS context.
            self.engine_http = engine_http_client(
                max_connections=self.settings.max_connections,
                keepalive_s=self.settings.upstream_keepalive_s,
            )
        if self.scrape_http is None:
            self.scrape_http = AiohttpScrapes()
        settings, supervisor = self.settings, self.supervisor
        loops = (
            ("pods", settings.pods_poll_s, f"pod source {self.pod_source.description}",
             self.refresh_pods),
            ("plan", settings.plan_poll_s, f"plan source {self.plan_source.description}",
             self.refresh_plan),
            ("scrape", settings.scrape_interval_s, "the pods' /metrics", self.scrape_all),
        )  # fmt: skip
        # The first rounds run now, supervised as every later one: a pod source or a
        # plan source failing at start is a loop's failure, not a router that will not
        # start (it starts not ready, and the loop retries).
        for name, every_s, concerning, round_ in loops:
            health = supervisor.start_health(name, every_s=every_s, concerning=concerning)
            await supervisor.run_round(health, round_)
        for name, _, _, round_ in loops:
            supervisor.start(supervisor.loops[name], round_)
        flush = supervisor.start_health(
            "log", every_s=settings.log_flush_s, concerning=self.request_log.description
        )
        supervisor.start(flush, self.request_log.flush)

    async def stop(self) -> None:
        """End the loops and the loads in flight (their waiters told so), then close the
        request log, the scraper's parse thread and the clients, whatever any of them
        raised: the log is closed in every case."""
        try:
            try:
                await self.supervisor.stop()
            finally:
                await self.cold_loads.cancel()
        finally:
            try:
                await self.request_log.close()
            finally:
                await self._close_clients()

    async def _close_clients(self) -> None:
        self.scraper.close()  # its parse thread: the scrape loop has ended by now
        try:
            if self.session is not None:
                await self.session.close()
        finally:
            self.session = None
            try:
                if self._owns_engine_http and self.scrape_http is not None:
                    scrapes, self.scrape_http = self.scrape_http, None
                    await scrapes.close()
            finally:
                if self._owns_engine_http and self.engine_http is not None:
                    http, self.engine_http = self.engine_http, None
                    await http.aclose()

    def problems(self) -> list[str]:
        """What fails the health check: a loop that ended, or one stuck in a round."""
        return self.supervisor.problems()

    def not_ready(self) -> list[str]:
        """Why the router should get no traffic yet (empty: ready)."""
        reasons = self.problems()
        if self.plan_expected and self.topology.plan is None:
            reasons.append(f"no plan yet: {self.plan_error or 'none read'}")
        if not any(state.healthy for state in self.topology.pods.values()):
            reasons.append("no healthy pod")
        return reasons

    def knows(self, model: str) -> bool:
        """Whether ``model`` names something the router knows: a served base model, an
        adapter of the catalog or of the plan, or one a pod lists."""
        topology, adapter = self.topology, AdapterId(model)
        if model in topology.base_pool or adapter in topology.adapter_pool:
            return True
        if self.adapters.source_of(adapter) is not None:
            return True
        plan = topology.plan
        if plan is not None and adapter in plan.adapters:
            return True
        return any(state.ledger.is_listed(adapter) for state in topology.pods.values())

    # -- plan and pods ---------------------------------------------------------------

    async def refresh_plan(self) -> None:
        """One poll of the plan source: swap in a new plan if it has one, keep the last
        good one if it fails. The plan loop calls this every ``plan_poll_s``."""
        try:
            plan = await self.plan_source.poll()
        except Exception as exc:
            if not isinstance(exc, PlanError):  # a fault of ours or of the source's client
                self.plan_error = f"{self.plan_source.description}: {type(exc).__name__}: {exc}"
                self.metrics.plan_ok.set(1 if self.topology.plan is not None else 0)
                raise
            if self.plan_error != str(exc):
                kept = "keeping the last good plan" if self.topology.plan else "routing by hashing"
                log.warning("plan unusable (%s): %s", kept, exc)
            self.plan_error = str(exc)
            self.metrics.plan_ok.set(1 if self.topology.plan is not None else 0)
            return
        self.plan_error = None
        if plan is not None:
            self._swap(self.topology_upstreams(), plan)
            log.info("routing by plan %s", plan.id)
        self.metrics.plan_ok.set(1 if self.topology.plan is not None else 0)

    async def refresh_pods(self) -> None:
        """One read of the pod source; the topology changes only if the pods did."""
        upstreams = await self.pod_source.upstreams()
        if upstreams != self.topology_upstreams():
            self._swap(upstreams, self.topology.plan)

    def use_adapters(self, adapters: AdapterInfo) -> None:
        """A new catalog's facts (its file changed): sources, sizes and pools from now on."""
        self.adapters = adapters
        self.picker.use_catalog(adapters.size_bytes, self._classes(adapters))
        self._swap(self.topology_upstreams(), self.topology.plan)

    def _classes(self, adapters: AdapterInfo) -> Mapping[AdapterId, float]:
        """The class weights the picker keeps apart: none unless ``class_priority``."""
        return adapters.classes if self.settings.class_priority else {}

    def topology_upstreams(self) -> tuple[Upstream, ...]:
        return tuple(state.upstream for state in self.topology.pods.values())

    def _swap(self, upstreams: tuple[Upstream, ...], plan: Plan | None) -> None:
        self.topology = build_topology(
            upstreams, plan, previous=self.topology.pods, adapter_pools=self.adapters.pools
        )
        for state in self.topology.pods.values():
            self.fleet_metrics.pod_slots(state.upstream.pod, slots=state.max_loras)
        self.scraper.keep_only(self.topology.pods.keys())

    # -- scraping --------------------------------------------------------------------

    async def scrape_all(self) -> None:
        """One scrape of every pod's ``/metrics`` (every ``listing_every_scrapes``-th
        one, and each one of a pod out of the rotation, also reads ``/v1/models``). The
        scrape loop calls this every ``scrape_interval_s``."""
        self._scrapes += 1
        # The first scrape and every Nth after it (N = 1: every scrape).
        listing = (self._scrapes - 1) % self.settings.listing_every_scrapes == 0
        states = list(self.topology.pods.values())
        share = self.scrape_share
        if share is not None:  # a follower scrapes only what the publisher's files lack
            states = share.follow(states)
        fresh = await asyncio.gather(
            *(self.scraper.scrape(state, listing=listing) for state in states)
        )
        if share is not None:
            share.publish(states, fresh)
        for view in self.topology.pools.values():
            view.index.refresh()  # the queues and KV use the pre-filter ranks

    def mark_unhealthy(self, state: LivePod, why: str) -> None:
        """Take ``state``'s pod out of the rotation until a good scrape, saying ``why``."""
        self.scraper.mark_unhealthy(state, why)

    def _engine_http(self) -> httpx.AsyncClient:
        assert self.engine_http is not None, "pass engine_http, or start() the router"
        return self.engine_http

    def _scrape_http(self) -> ScrapeHttp:
        assert self.scrape_http is not None, "pass engine_http, or start() the router"
        return self.scrape_http

    def engine_client(self, upstream: Upstream) -> VllmClient | SglangClient:
        kind = SglangClient if upstream.engine is Engine.SGLANG else VllmClient
        return kind(
            upstream.pod,
            upstream.url,
            served_model_name=upstream.served_model,
            http=self._engine_http(),
            timeout_s=self.settings.load_timeout_s,
        )

    # -- coalesced loads (router.cold_loads) ------------------------------------------

    def needs_load(self, state: LivePod, adapter: AdapterId) -> bool:
        """The pod does not know the adapter and the catalog (or the source template)
        says where to load it from."""
        return not state.ledger.is_listed(adapter) and self.adapters.source_of(adapter) is not None

    async def load(self, state: LivePod, adapter: AdapterId) -> None:
        """Load ``adapter`` on the pod once, however many requests wait for it
        (``ColdLoads.load``: every waiter hears how the load ended)."""
        await self.cold_loads.load(state, adapter)
