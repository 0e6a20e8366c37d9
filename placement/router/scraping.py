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
scrape as any unreadable page does. A pod's problems said are forgotten at its first
scrape with none (said again if they come back) and, for pods no longer scraped (gone
from the topology), once they are older than ``RETELL_PROBLEM_S``.

A ``/metrics`` page past ``MAX_METRICS_BYTES`` never takes a pod out (vLLM's
``vllm:lora_requests_info`` keeps a series per adapter mix the pod ever ran, so a busy
pod's page grows until it restarts): it is read up to the cap, and its head read if the
metrics the router reads lie whole in it (``metrics_text.read_vllm_head``); else the
pod is read as one without ``/metrics`` (below: judged by ``/health``, its load
unknown). Either way each scrape counts it in
``lorafleet_router_scrape_problems_total{pod,kind="too_large"}``, and a warning says
which, once per pod an hour (and at once when it turns from one to the other).

A page of more than ``PARSE_IN_THREAD_BYTES`` is parsed in a thread of the scraper's
own (``read_page``, one page at a time), so that a bloated or broken page never stalls
the event loop, and with it every proxied request, for the seconds its parse takes; a
smaller one (the normal case) is parsed on the loop. Either way the reading is applied
to the pod's state on the loop, after the parse: a pod gone from the topology, or a
topology swapped, while it ran is handled as a slow read of the page is (the reading
lands on the ``LivePod`` the scrape began with), and a scrape cancelled meanwhile
applies nothing (the thread finishes its page and the reading is dropped). The thread
ends with ``close`` (``Router.stop``).

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

import asyncio
import functools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from placement.adapters.metrics_text import (
    ReadMetrics,
    SkippedLine,
    read_sglang_head,
    read_sglang_metrics,
    read_vllm_head,
    read_vllm_metrics,
)
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
    MAX_METRICS_BYTES,
    Fetched,
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
#: A ``/metrics`` page of more bytes than this is parsed in the scraper's thread, not on
#: the event loop. prometheus_client's parser (Python, a character at a time) takes some
#: 0.3 µs a byte: 64 KiB stalls the loop, and every proxied request with it, ~20 ms, a
#: page at the 8 MiB cap ~3 s, and three times that with one line it cannot read (the
#: lenient reading's three passes). In the thread the loop still waits for the GIL, up
#: to its switch interval (5 ms) a turn, so a page parsed in less (~16 KiB) gains
#: nothing there, and up to 64 KiB (a vLLM page with its histograms is tens of KiB) too
#: little for a thread hop (~80 µs of CPU, and GIL hand-offs) per pod 4 times a second.
PARSE_IN_THREAD_BYTES = 64 * 1024


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
        #: When ``_told`` was last swept of what is past telling (clock seconds).
        self._swept_s = clock()
        #: The pods of the topology (``keep_only``; None until first given: every pod).
        #: A scrape that ends after its pod left writes nothing in the tables above.
        self._kept: frozenset[PodId] | None = None
        #: Where pages past ``PARSE_IN_THREAD_BYTES`` are parsed: one thread (started at
        #: the first such page), one page at a time; a second would only take the GIL
        #: from the loop more often. Its thread ends at ``close`` (the router's stop).
        self._parsing = _parse_thread()

    def close(self) -> None:
        """End the parse thread (``Router.stop``): it is told to end, not waited for. A
        page it is parsing is finished and its reading dropped (its scrape is cancelled
        by then); one queued is never parsed. A later big page starts a new thread."""
        parsing, self._parsing = self._parsing, _parse_thread()
        parsing.shutdown(wait=False, cancel_futures=True)

    def keep_only(self, pods: Collection[PodId]) -> None:
        """Forget what is kept per pod (why it left the rotation, the problems said,
        its series on ``/metrics``: ``RouterMetrics.keep_pods``,
        ``FleetMetrics.pods_left``) for pods no longer in the topology: a fleet that
        churns pods keeps no trace. A scrape of one of them still in flight (its read or
        parse awaited across the topology's swap) adds nothing back when it ends."""
        kept = frozenset(pods)
        left = (self._kept or frozenset()) - kept
        self._kept = kept
        for table in (self.why, self._told, self.listings_read):
            for pod in [pod for pod in table if pod not in pods]:
                del table[pod]
        self.metrics.keep_pods(kept)
        self.fleet_metrics.pods_left(left)

    def _keeps(self, pod: PodId) -> bool:
        """Whether ``pod`` is in the topology, so what is kept per pod may name it."""
        return self._kept is None or pod in self._kept

    async def scrape(self, state: LivePod, *, listing: bool) -> bool:
        """Scrape ``state``'s pod once (with its ``/v1/models`` too when ``listing``, when
        it is out of the rotation, or when its listing is due), and judge its health.
        True: the scrape succeeded (the pod's metrics are this round's)."""
        upstream = state.upstream
        self._sweep_told()
        failures = state.failures
        try:
            read = await self._read_metrics(state)
            if read is None:  # no /metrics, or its figures past the cap: /health decides
                await self._probe_health(state, due=listing or not state.healthy)
                state.observe(PodMetrics())
            else:
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
        if not state.healthy and state.failures > failures:
            # Taken out while this scrape was in flight (a proxied request failed there,
            # the gateway fell back from it): that is newer than the page, which was
            # asked for before it; the next scrape brings the pod back if it is well.
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
            if self._keeps(state.upstream.pod):
                self.metrics.metrics_missing.labels(pod=state.upstream.pod).set(label)
        state.page_taken()  # asked for by another worker, when this one cannot tell
        state.observe(report.metrics)
        self._scraped(state)

    def take_listing(self, state: LivePod, adapters: Mapping[AdapterId, str]) -> None:
        """Apply another worker's read of ``state``'s pod's ``/v1/models``."""
        state.listing_due = False
        state.ledger.reconcile_listing(adapters)
        state.sync()

    def _note_skipped(
        self, pod: PodId, skipped: tuple[SkippedLine, ...], *, cut: bool = False
    ) -> None:
        """Count the lines of ``pod``'s page left out; say each problem of it (its kind
        and the metric it names) once per ``RETELL_PROBLEM_S``, and no more than
        ``MAX_TOLD_PROBLEMS`` of them at a time. A page without any forgets those said
        (but for its being past the cap, when ``cut``)."""
        if not skipped:
            told = self._told.pop(pod, None)
            kept = {k: said_s for k, said_s in (told or {}).items() if cut and k[0] == "too_large"}
            if kept:
                self._told[pod] = kept
            return
        told = self._told_now(pod)
        for line in skipped:
            self.metrics.scrape_problems.labels(pod=pod, kind=line.kind).inc()
            problem = (line.kind, line.metric)
            if problem in told or len(told) >= MAX_TOLD_PROBLEMS:
                continue
            told[problem] = self.clock()
            log.warning(
                "pod %s: /metrics %s; left out, the rest of the page read "
                "(lorafleet_router_scrape_problems_total{kind=%r})",
                pod,
                line,
                line.kind,
            )

    def _told_now(self, pod: PodId) -> dict[tuple[str, str], float]:
        """``pod``'s problems said within ``RETELL_PROBLEM_S``, to add to."""
        now_s = self.clock()
        told = {
            problem: said_s
            for problem, said_s in self._told.get(pod, {}).items()
            if now_s - said_s < RETELL_PROBLEM_S
        }
        self._told[pod] = told
        return told

    def _sweep_told(self) -> None:
        """Once per ``RETELL_PROBLEM_S``: forget the problems past telling, of every pod
        (a pod gone from the topology is scraped no more, and forgotten so)."""
        now_s = self.clock()
        if now_s - self._swept_s < RETELL_PROBLEM_S:
            return
        self._swept_s = now_s
        for pod, told in list(self._told.items()):
            kept = {k: said_s for k, said_s in told.items() if now_s - said_s < RETELL_PROBLEM_S}
            if kept:
                self._told[pod] = kept
            else:
                del self._told[pod]

    def _note_too_large(self, pod: PodId, *, head_read: bool) -> None:
        """Count a page past the cap; say it once per pod an hour, and at once when its
        head stops (or starts) holding what the router reads."""
        self.metrics.scrape_problems.labels(pod=pod, kind="too_large").inc()
        told = self._told_now(pod)
        how, other = ("head", "health") if head_read else ("health", "head")
        if ("too_large", how) in told:
            return
        told.pop(("too_large", other), None)
        told[("too_large", how)] = self.clock()
        if head_read:
            outcome = (
                "read its first bytes, which hold whole the metrics the router reads; "
                "the rest left unread"
            )
        else:
            outcome = (
                "the metrics the router reads are not all whole within them: the pod stays "
                "in the rotation judged by /health, its load unknown "
                "(lorafleet_router_pod_metrics_missing 1)"
            )
        log.warning(
            "pod %s: /metrics is over %d bytes: %s "
            "(lorafleet_router_scrape_problems_total{kind='too_large'})",
            pod,
            MAX_METRICS_BYTES,
            outcome,
        )

    def _scraped(self, state: LivePod) -> None:
        """A good scrape of ``state``'s pod: it is in the rotation."""
        upstream = state.upstream
        if not state.healthy:
            log.info("pod %s is back", upstream.pod)
        state.healthy = True
        state.failures = 0
        if not self._keeps(upstream.pod):
            return  # it left the topology during the scrape: no series of it come back
        if self.observes_residency:
            self.fleet_metrics.observe_gpu(
                upstream.pod, state.ledger.active_view, now_s=self.clock()
            )
        self.metrics.pod_healthy.labels(pod=upstream.pod).set(1)
        self.metrics.queue_depth.labels(pod=upstream.pod).set(state.queue_len())

    def mark_unhealthy(self, state: LivePod, why: str) -> None:
        if state.healthy:
            log.warning("pod %s leaves the rotation: %s", state.upstream.pod, why)
        kept = self._keeps(state.upstream.pod)
        if kept:
            self.why[state.upstream.pod] = why
        state.healthy = False
        state.failures += 1
        if state.index is not None:
            state.index.refresh()  # the least-KV pod must be a healthy one
        if not kept:
            return  # it left the topology: no series of it come back
        # A pod out of the rotation may come back empty: its adapters' stays end here.
        if self.observes_residency:
            self.fleet_metrics.pod_emptied(state.upstream.pod, now_s=self.clock())
        self.metrics.pod_healthy.labels(pod=state.upstream.pod).set(0)

    async def _read_metrics(self, state: LivePod) -> ReadMetrics | None:
        """The pod's ``/metrics``, read; None for an SGLang pod without the route, or a
        page past the cap whose head does not hold what the router reads."""
        upstream = state.upstream
        timeout_s = self.settings.scrape_timeout_s
        state.page_asked()
        answer = await self._http().get(
            upstream.url, "/metrics", pod=upstream.pod, timeout_s=timeout_s
        )
        if answer.status == 404 and upstream.engine is Engine.SGLANG:
            self._metrics_missing(state, metrics_missing_message(upstream.pod))
            return None
        if answer.status != 200:
            self._metrics_missing(state, None)
            raise EngineError(
                f"/metrics answered {answer.status}: {answer.message()}", pod=upstream.pod
            )
        read = await self._read_page(
            answer, pod=upstream.pod, sglang=upstream.engine is Engine.SGLANG
        )
        # A page past the cap without its figures: _note_too_large said so, once is enough.
        self._metrics_missing(state, "" if read is None else None)
        return read

    async def _read_page(self, answer: Fetched, *, pod: PodId, sglang: bool) -> ReadMetrics | None:
        """A page read whole, or from its head when cut (None: not all there); parsed in
        the scraper's thread past ``PARSE_IN_THREAD_BYTES``, what it says noted here."""
        if len(answer.body) <= PARSE_IN_THREAD_BYTES:
            read = read_page(answer, pod=pod, sglang=sglang)
        else:
            parse = functools.partial(read_page, answer, pod=pod, sglang=sglang)
            read = await asyncio.get_running_loop().run_in_executor(self._parsing, parse)
        if not self._keeps(pod):  # gone while it was read: nothing to say of its page
            return read
        if answer.cut:
            self._note_too_large(pod, head_read=read is not None)
        if read is not None:
            self._note_skipped(pod, read.skipped, cut=answer.cut)
        return read

    def _metrics_missing(self, state: LivePod, said: str | None) -> None:
        """Whether the pod's load is unknown (``said``, a warning to say as it starts,
        not None): then ``/health`` judges it, asked at the next scrape."""
        missing = said is not None
        if missing == state.metrics_missing:
            return
        state.metrics_missing = missing
        state.health_probed = False
        if self._keeps(state.upstream.pod):
            self.metrics.metrics_missing.labels(pod=state.upstream.pod).set(1 if missing else 0)
        if said:  # once per pod, until its /metrics comes back
            log.warning(said)

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
        if self.keeps_listings and self._keeps(upstream.pod):
            self.listings_read[upstream.pod] = registered.adapters
        state.listing_due = False
        state.ledger.reconcile_listing(registered.adapters)
        state.sync()


def _parse_thread() -> ThreadPoolExecutor:
    """The scraper's parse thread: started at its first page, not before."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="lorafleet-parse")


def read_page(answer: Fetched, *, pod: PodId, sglang: bool) -> ReadMetrics | None:
    """A ``/metrics`` answer read as its engine writes it: whole, or from its head when cut
    (None: what the router reads is not all there). Pure: it may run in any thread."""
    if not answer.cut:
        return (read_sglang_metrics if sglang else read_vllm_metrics)(answer.text, pod=pod)
    return (read_sglang_head if sglang else read_vllm_head)(answer.text, pod=pod)
