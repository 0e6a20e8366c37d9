"""Scraping one pod for the router: its health, its live load and its adapter listing.

``PodScraper.scrape`` reads a pod's ``/metrics`` (parsed as its engine writes them),
and now and then its ``/v1/models`` (to correct the ledger); a pod whose scrape fails
leaves the rotation (``mark_unhealthy``) until a good scrape. One pod's failure of any
kind is that pod's alone: it is logged with the pod's name and counted, and the caller
(``Router.scrape_all``, the scrape round) goes on with the other pods.

A line of a pod's ``/metrics`` that cannot be read costs that line, not the pod: it is
left out, the rest of the page read (``metrics_text.read_vllm_metrics``), counted in
``lorafleet_router_scrape_problems_total{pod,kind}`` at every scrape, and said in a
warning once an hour per pod and problem (the kind of line and the metric it names). A
broken line of a metric the router reads (queue, KV use, the LoRA series) fails the
scrape as any unreadable page does.

An SGLang pod started without ``--enable-metrics`` answers 404 on ``/metrics``: it stays
in the rotation, judged by ``/health``, with ``lorafleet_router_pod_metrics_missing``
set and one warning naming the pod and the flag.

The reads go through a ``ScrapeHttp`` (``router.scrape_http``): aiohttp in a running
router, the given httpx client where a test passes one. A read past its timeout
(``scrape_timeout_s``, ``health_timeout_s``) counts a failure, and two in a row take
the pod out; a listing past ``load_timeout_s``, or any other failure, takes it out at
once.

With ``--workers N`` only worker 0 scrapes; the others ``take`` its reports of each pod
and ``take_listing`` its listings (``router.shared_scrapes``), as their own scrape
would have applied them.

Must not schedule rounds or swap the topology: that is ``router.core``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from placement.adapters.metrics_text import SkippedLine, read_sglang_metrics, read_vllm_metrics
from placement.adapters.sglang import metrics_missing_message
from placement.clock import Clock
from placement.domain import AdapterId, Engine, PodId
from placement.errors import EngineError, RetryableEngineError
from placement.metrics import FleetMetrics
from placement.ports import PodMetrics
from placement.router.live_pods import LivePod
from placement.router.metrics import RouterMetrics
from placement.router.scrape_http import (
    MAX_LISTING_BYTES,
    ScrapeHttp,
    ScrapeTimeoutError,
    listing_of,
)
from placement.settings import RouterSettings

log = logging.getLogger("lorafleet.router")

#: A problem of a pod's ``/metrics`` (a kind of line, the metric it names) is said again
#: after this long (clock seconds), if it lasts: once per scrape would flood the log.
RETELL_PROBLEM_S = 3600.0
#: At most this many problems of one pod said within ``RETELL_PROBLEM_S``: a page of
#: changing garbage names a new metric every line. Every line is counted all the same.
MAX_TOLD_PROBLEMS = 8


class PodReportLike(Protocol):
    """Another worker's scrape of a pod (``router.scrape_files.PodReport``)."""

    @property
    def fresh(self) -> bool: ...
    @property
    def healthy(self) -> bool: ...
    @property
    def why(self) -> str: ...
    @property
    def metrics_missing(self) -> bool: ...
    @property
    def metrics(self) -> PodMetrics: ...


class ScrapeShare(Protocol):
    """How a router worker shares its scrape rounds (``router.shared_scrapes``)."""

    def follow(self, states: Sequence[LivePod]) -> list[LivePod]:
        """Before a round: learn what others scraped; the pods to scrape here."""
        ...

    def publish(self, states: Sequence[LivePod], fresh: Sequence[bool]) -> None:
        """After a round over ``states``: share it (``fresh``: which succeeded)."""
        ...


class PodScraper:
    """Scrapes one pod at a time for a router, with the router's settings, metrics and
    clock. ``http`` gives what the pods are read with (the router's, made at its
    start)."""

    def __init__(
        self,
        *,
        settings: RouterSettings,
        metrics: RouterMetrics,
        fleet_metrics: FleetMetrics,
        clock: Clock,
        http: Callable[[], ScrapeHttp],
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.fleet_metrics = fleet_metrics
        self.clock = clock
        self._http = http
        #: Whether this router records the pods' residency (stays and evictions, from
        #: its ledger after each scrape). Of N workers only one does: every worker sees
        #: the same evictions, and ``/metrics`` sums the counters over the workers.
        self.observes_residency = True
        #: Keep each listing read in ``listings_read`` (the scrape publisher drains it).
        self.keeps_listings = False
        self.listings_read: dict[PodId, Mapping[AdapterId, str]] = {}
        #: Why each pod last left the rotation.
        self.why: dict[PodId, str] = {}
        #: The problems of each pod's ``/metrics`` said, and when (clock seconds).
        self._told: dict[PodId, dict[tuple[str, str], float]] = {}

    async def scrape(self, state: LivePod, *, listing: bool) -> bool:
        """Scrape ``state``'s pod once (with its ``/v1/models`` too when ``listing``, when
        it is out of the rotation, or when its listing is due), and judge its health.
        True: the scrape succeeded (the pod's metrics are this round's)."""
        upstream = state.upstream
        try:
            text = await self._metrics_text(state)
            if text is None:  # SGLang without --enable-metrics: /health decides
                await self._probe_health(state, due=listing or not state.healthy)
                state.observe(PodMetrics())
            else:
                sglang = upstream.engine is Engine.SGLANG
                read = (read_sglang_metrics if sglang else read_vllm_metrics)(
                    text, pod=upstream.pod
                )
                self._note_skipped(upstream.pod, read.skipped)
                state.observe(read.metrics)
            if listing or not state.healthy or state.listing_due:
                await self._read_listing(state)
        except ScrapeTimeoutError:
            # A slow answer may be our own loop being busy: two in a row take it out.
            state.failures += 1
            if state.failures >= 2:
                self.mark_unhealthy(state, "scrapes timed out twice")
            return False
        except EngineError as exc:
            self.mark_unhealthy(state, str(exc) or type(exc).__name__)
            return False
        except Exception as exc:  # anything else is this pod's alone: the round goes on
            log.warning(
                "scraping pod %s raised %s: %s",
                upstream.pod,
                type(exc).__name__,
                exc,
                exc_info=True,
            )
            self.metrics.loop_errors.labels(loop="scrape", error=type(exc).__name__).inc()
            self.mark_unhealthy(state, f"{type(exc).__name__}: {exc}")
            return False
        self._scraped(state)
        return True

    def take(self, state: LivePod, report: PodReportLike) -> None:
        """Apply another worker's scrape of ``state``'s pod, as this scrape would have."""
        if not report.fresh:
            if not report.healthy:
                self.mark_unhealthy(state, report.why or "the scraping worker says so")
            return
        if report.metrics_missing != state.metrics_missing:
            state.metrics_missing = report.metrics_missing
            label = 1 if report.metrics_missing else 0
            self.metrics.metrics_missing.labels(pod=state.upstream.pod).set(label)
        state.observe(report.metrics)
        self._scraped(state)

    def take_listing(self, state: LivePod, adapters: Mapping[AdapterId, str]) -> None:
        """Apply another worker's read of ``state``'s pod's ``/v1/models``."""
        state.listing_due = False
        state.ledger.reconcile_listing(adapters)
        state.sync()

    def _note_skipped(self, pod: PodId, skipped: tuple[SkippedLine, ...]) -> None:
        """Count the lines of ``pod``'s page left out; say each problem of it (its kind
        and the metric it names) once per ``RETELL_PROBLEM_S``, and no more than
        ``MAX_TOLD_PROBLEMS`` of them at a time."""
        if not skipped:
            return
        now_s = self.clock()
        told = {
            problem: said_s
            for problem, said_s in self._told.get(pod, {}).items()
            if now_s - said_s < RETELL_PROBLEM_S
        }
        self._told[pod] = told
        for line in skipped:
            self.metrics.scrape_problems.labels(pod=pod, kind=line.kind).inc()
            problem = (line.kind, line.metric)
            if problem in told or len(told) >= MAX_TOLD_PROBLEMS:
                continue
            told[problem] = now_s
            log.warning(
                "pod %s: /metrics %s; left out, the rest of the page read "
                "(lorafleet_router_scrape_problems_total{kind=%r})",
                pod,
                line,
                line.kind,
            )

    def _scraped(self, state: LivePod) -> None:
        """A good scrape of ``state``'s pod: it is in the rotation."""
        upstream = state.upstream
        if not state.healthy:
            log.info("pod %s is back", upstream.pod)
        state.healthy = True
        state.failures = 0
        if self.observes_residency:
            self.fleet_metrics.observe_gpu(
                upstream.pod, state.ledger.active_view, now_s=self.clock()
            )
        self.metrics.pod_healthy.labels(pod=upstream.pod).set(1)
        self.metrics.queue_depth.labels(pod=upstream.pod).set(state.queue_len())

    def mark_unhealthy(self, state: LivePod, why: str) -> None:
        if state.healthy:
            log.warning("pod %s leaves the rotation: %s", state.upstream.pod, why)
        self.why[state.upstream.pod] = why
        state.healthy = False
        state.failures += 1
        if state.index is not None:
            state.index.refresh()  # the least-KV pod must be a healthy one
        # A pod out of the rotation may come back empty: its adapters' stays end here.
        if self.observes_residency:
            self.fleet_metrics.pod_emptied(state.upstream.pod, now_s=self.clock())
        self.metrics.pod_healthy.labels(pod=state.upstream.pod).set(0)

    async def _metrics_text(self, state: LivePod) -> str | None:
        """The pod's ``/metrics`` text; None for an SGLang pod without the route."""
        upstream = state.upstream
        timeout_s = self.settings.scrape_timeout_s
        answer = await self._http().get(
            upstream.url, "/metrics", pod=upstream.pod, timeout_s=timeout_s
        )
        missing = answer.status == 404 and upstream.engine is Engine.SGLANG
        if missing != state.metrics_missing:
            state.metrics_missing = missing
            state.health_probed = False
            self.metrics.metrics_missing.labels(pod=upstream.pod).set(1 if missing else 0)
            if missing:  # once per pod, until its /metrics comes back
                log.warning(metrics_missing_message(upstream.pod))
        if missing:
            return None
        if answer.status != 200:
            raise EngineError(
                f"/metrics answered {answer.status}: {answer.message()}", pod=upstream.pod
            )
        return answer.text

    async def _probe_health(self, state: LivePod, *, due: bool) -> None:
        """Judge a pod without ``/metrics`` by ``/health``: on listing rounds and while
        it is out of the rotation (SGLang's ``/health`` runs a one-token generation, so
        not every scrape); in between, its answering 404 shows the server is up."""
        if not due and state.health_probed:
            return
        upstream = state.upstream
        timeout_s = self.settings.health_timeout_s
        # Until it answers, the pod is not probed: a probe that timed out is asked
        # again at the next scrape, so two in a row take it out (a hung /health, as a
        # stuck generation would leave it, must not pass for a healthy pod).
        state.health_probed = False
        answer = await self._http().get(
            upstream.url, "/health", pod=upstream.pod, timeout_s=timeout_s
        )
        state.health_probed = True
        if answer.status != 200:
            raise EngineError(
                f"/health answered {answer.status}: {answer.message()}", pod=upstream.pod
            )

    async def _read_listing(self, state: LivePod) -> None:
        """The pod's ``/v1/models``, read into the ledger. Its timeout is a load's, as
        the engine clients' (a slow listing takes the pod out, as their errors do)."""
        upstream = state.upstream
        try:
            answer = await self._http().get(
                upstream.url,
                "/v1/models",
                pod=upstream.pod,
                timeout_s=self.settings.load_timeout_s,
                max_bytes=MAX_LISTING_BYTES,
            )
        except ScrapeTimeoutError:
            raise RetryableEngineError("GET /v1/models timed out", pod=upstream.pod) from None
        registered = listing_of(answer, pod=upstream.pod)
        if self.keeps_listings:
            self.listings_read[upstream.pod] = registered.adapters
        state.listing_due = False
        state.ledger.reconcile_listing(registered.adapters)
        state.sync()
