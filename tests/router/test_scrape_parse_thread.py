"""A big ``/metrics`` page is parsed off the router's event loop: past
``PARSE_IN_THREAD_BYTES`` the scraper parses it in a thread of its own while the loop
serves on, and applies the reading to the pod on the loop, as the inline parse of a
small page does. A pod gone, or the topology swapped, while the parse runs is handled as
a slow read is; a scrape cancelled meanwhile ends at once and applies nothing.

The pods answer through ``httpx.MockTransport``. What runs where is seen by a parse
that notes its thread and waits (on a ``threading.Event``, set from the loop) until a
task on the loop has advanced: never by the wall clock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import CollectorRegistry

from placement.adapters.metrics_text import read_vllm_metrics
from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.metrics import FleetMetrics
from placement.ports import PodMetrics
from placement.router import scraping
from placement.router.live_pods import LivePod, Upstream
from placement.router.metrics import RouterMetrics
from placement.router.scrape_http import HttpxScrapes
from placement.router.scraping import PARSE_IN_THREAD_BYTES, PodScraper
from placement.settings import RouterSettings

#: How long a held parse waits for the loop before it gives up (and its test fails):
#: only reached when the parse holds the loop itself.
GIVE_UP_S = 10.0

VLLM_HEAD = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0"} 2\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0"} 5\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{engine="0"} 0.375\n'
    "# TYPE vllm:lora_requests_info gauge\n"
)
SGLANG_PAGE = (
    "sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n"
    "sglang:lora_pool_slots_used 2\nsglang:lora_pool_slots_total 4\n"
)
BROKEN = 'vllm:e2e_request_latency_seconds_bucket{le="0.1" 7\n'


def _vllm_page(size: int, *, broken: bool = False) -> bytes:
    """A vLLM page of at least ``size`` bytes: its ``lora_requests_info`` series grown
    (the latest names adapter ``a``), with one line the parser refuses if ``broken``."""
    lines = [
        f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="old-{i}",'
        f'waiting_lora_adapters="w-{i}"}} {i}\n'
        for i in range(size // 90 + 1)
    ]
    latest = 'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",'
    lines.insert(len(lines) // 2, latest + f'waiting_lora_adapters="b"}} {len(lines) + 1}\n')
    if broken:
        lines.insert(len(lines) // 3, BROKEN)
    return (VLLM_HEAD + "".join(lines)).encode()


def _sglang_page(size: int) -> bytes:
    """An SGLang page of at least ``size`` bytes (a histogram the router does not read)."""
    buckets = "".join(f'sglang:e2e_latency_bucket{{le="{i}"}} {i}\n' for i in range(size // 30))
    return (SGLANG_PAGE + "# TYPE sglang:e2e_latency histogram\n" + buckets).encode()


BIG = PARSE_IN_THREAD_BYTES + 1


@dataclass
class Pod:
    """One pod, its scraper and what its ``/metrics`` answers."""

    page: bytes
    engine: Engine = Engine.VLLM
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.upstream = Upstream(pod=PodId("pod-0"), pool=PoolId("p"), url="http://pod-0",
                                 engine=self.engine, served_model="base", max_loras=4,
                                 max_cpu_loras=8)  # fmt: skip
        self.state = LivePod(self.upstream)

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, content=self.page)
        return httpx.Response(200, json={"object": "list", "data": []})

    def scraper(self, http: httpx.AsyncClient) -> PodScraper:
        return PodScraper(
            settings=RouterSettings(),
            metrics=RouterMetrics(self.registry, max_adapter_labels=16),
            fleet_metrics=FleetMetrics(self.registry),
            clock=time.time,
            http=lambda: HttpxScrapes(http),
        )

    def problems(self, kind: str) -> float | None:
        return self.registry.get_sample_value(
            "lorafleet_router_scrape_problems_total", {"pod": "pod-0", "kind": kind}
        )


def _scrape(pod: Pod, *, run: Callable[[PodScraper], object] | None = None) -> bool:
    """One scrape of ``pod`` on a fresh loop (its metrics only: no listing due)."""

    async def scrape() -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(pod.answer)) as http:
            pod.state.listing_due = False
            return await pod.scraper(http).scrape(pod.state, listing=False)

    return asyncio.run(scrape())


def _seen(state: LivePod) -> tuple[object, ...]:
    """What a scrape leaves of a pod in the router."""
    return (
        state.metrics,
        state.running,
        state.kv_usage,
        state.running_adapters,
        state.waiting_adapters,
        state.healthy,
        state.failures,
        state.metrics_missing,
    )


@pytest.mark.parametrize(
    ("engine", "page"),
    [
        (Engine.VLLM, _vllm_page(BIG)),
        (Engine.VLLM, _vllm_page(BIG, broken=True)),
        (Engine.SGLANG, _sglang_page(BIG)),
    ],
    ids=["vllm", "vllm-broken-line", "sglang"],
)
def test_a_big_page_parsed_in_the_thread_leaves_the_pod_as_the_inline_parse_does(
    monkeypatch: pytest.MonkeyPatch, engine: Engine, page: bytes
) -> None:
    assert len(page) > PARSE_IN_THREAD_BYTES
    threaded = Pod(page, engine=engine)
    assert _scrape(threaded)
    monkeypatch.setattr(scraping, "PARSE_IN_THREAD_BYTES", len(page))  # inline, as before
    inline = Pod(page, engine=engine)
    assert _scrape(inline)
    assert _seen(threaded.state) == _seen(inline.state)
    assert threaded.state.metrics != PodMetrics()  # read, not left as it was
    assert threaded.problems("sample") == inline.problems("sample")
    if engine is Engine.VLLM:
        metrics = threaded.state.metrics
        assert (metrics.running, metrics.waiting, metrics.kv_usage) == (2, 5, 0.375)
        assert metrics.running_adapters == frozenset({AdapterId("a")})
        assert metrics.waiting_adapters == frozenset({AdapterId("b")})


class HeldParse:
    """The scraper's parse, held until a task on the loop has advanced ``ticks`` times
    since it began: it notes the thread it ran in and the ticks it saw."""

    def __init__(self, real: Callable[..., object], *, ticks: int = 3) -> None:
        self.real, self.ticks = real, ticks
        self.threads: list[int] = []
        self.started = threading.Event()
        self.advanced = threading.Event()
        self.finished = threading.Event()
        self.counted = 0
        self.seen: list[int] = []

    def __call__(self, text: str, *, pod: str) -> object:
        self.threads.append(threading.get_ident())
        self.started.set()
        try:
            self.advanced.wait(GIVE_UP_S)
            self.seen.append(self.counted)
            return self.real(text, pod=pod)
        finally:
            self.finished.set()

    async def count(self) -> None:
        """The loop's other work: counts its turns once the parse has begun."""
        while True:
            if self.started.is_set():
                self.counted += 1
                if self.counted >= self.ticks:
                    self.advanced.set()
            await asyncio.sleep(0)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldParse]:
    parse = HeldParse(read_vllm_metrics)
    monkeypatch.setattr(scraping, "read_vllm_metrics", parse)
    yield parse
    parse.advanced.set()  # a parse still held lets go


def test_while_a_big_page_is_parsed_the_loop_runs_its_other_tasks(held: HeldParse) -> None:
    # Before, the parse ran on the loop: nothing else ran until it ended, seconds for a
    # page near the 8 MiB cap (three times that with one bad line).
    pod = Pod(_vllm_page(BIG))

    async def scrape() -> tuple[bool, int]:
        counting = asyncio.create_task(held.count())
        try:
            async with httpx.AsyncClient(transport=httpx.MockTransport(pod.answer)) as http:
                pod.state.listing_due = False
                return await pod.scraper(http).scrape(pod.state, listing=False), (
                    threading.get_ident()
                )
        finally:
            counting.cancel()

    scraped, loop_thread = asyncio.run(scrape())
    assert scraped
    assert held.seen and held.seen[0] >= held.ticks  # the loop ran on during the parse
    assert held.threads and held.threads[0] != loop_thread
    assert pod.state.running_adapters == {"a"}  # applied (on the loop, after the parse)


def test_a_small_page_is_parsed_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []

    def parse(text: str, *, pod: str) -> object:
        threads.append(threading.get_ident())
        return read_vllm_metrics(text, pod=pod)

    monkeypatch.setattr(scraping, "read_vllm_metrics", parse)
    pod = Pod(_vllm_page(4096))
    assert len(pod.page) <= PARSE_IN_THREAD_BYTES
    assert _scrape(pod)
    assert threads == [threading.main_thread().ident]  # asyncio.run's loop is this thread's
    assert pod.state.metrics.running == 2


async def _until(event: threading.Event) -> None:
    """Until ``event`` is set (from the parse's thread), the loop serving meanwhile."""
    assert await asyncio.to_thread(event.wait, GIVE_UP_S), "the parse never began"


def test_a_scrape_cancelled_mid_parse_ends_at_once_and_applies_nothing(
    held: HeldParse,
) -> None:
    # Router.stop cancels the scrape loop: its task must end without waiting for the
    # parse, and the reading the parse gives later must land nowhere.
    pod = Pod(_vllm_page(BIG))
    before = _seen(pod.state)

    async def cancel_mid_parse() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(pod.answer)) as http:
            pod.state.listing_due = False
            scraper = pod.scraper(http)
            scrape = asyncio.create_task(scraper.scrape(pod.state, listing=False))
            await _until(held.started)
            scrape.cancel()
            with pytest.raises(asyncio.CancelledError):
                await scrape
            assert not held.finished.is_set()  # ended while the parse still ran
            held.advanced.set()
            # Until the parse's thread has handed its reading on (its future done, the
            # loop's callback queued), then the turns in which it would land.
            await asyncio.to_thread(scraper._parsing.shutdown, wait=True)
            for _ in range(10):
                await asyncio.sleep(0)

    asyncio.run(cancel_mid_parse())
    assert _seen(pod.state) == before


def test_a_loop_closed_mid_parse_leaves_the_parse_to_end_on_its_own(
    held: HeldParse, caplog: pytest.LogCaptureFixture
) -> None:
    # The process stops with a parse running: asyncio.run cancels the scrape and closes
    # the loop; the parse ends later and hands its reading to no one, without error (a
    # callback that raised would be logged by concurrent.futures, or asyncio's).
    pod = Pod(_vllm_page(BIG))
    in_flight: list[asyncio.Task[bool]] = []
    scrapers: list[PodScraper] = []

    async def stop_mid_parse() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(pod.answer))
        pod.state.listing_due = False
        scrapers.append(pod.scraper(http))
        in_flight.append(asyncio.create_task(scrapers[0].scrape(pod.state, listing=False)))
        await _until(held.started)  # returns with the scrape in flight

    with caplog.at_level(logging.DEBUG):
        asyncio.run(stop_mid_parse())
        held.advanced.set()
        scrapers[0]._parsing.shutdown(wait=True)  # the parse and its future's callbacks done
    assert held.finished.is_set()
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert problems == [], [r.getMessage() for r in problems]
    assert in_flight[0].cancelled()
    assert pod.state.metrics == PodMetrics()


def test_a_pod_gone_from_the_topology_mid_parse_is_handled_as_a_slow_read(
    held: HeldParse,
) -> None:
    # As with a pod whose /metrics answers slowly: the reading lands on the LivePod the
    # scrape began with, one no longer in the topology, and nothing else is touched.
    pod = Pod(_vllm_page(BIG))

    async def swap_mid_parse() -> tuple[bool, set[PodId]]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(pod.answer)) as http:
            pod.state.listing_due = False
            scraper = pod.scraper(http)
            scrape = asyncio.create_task(scraper.scrape(pod.state, listing=False))
            await _until(held.started)
            scraper.keep_only(())  # the topology's swap, on the loop, mid-parse
            held.advanced.set()
            return await scrape, set(scraper.why)

    scraped, why = asyncio.run(swap_mid_parse())
    assert scraped and why == set()
    assert pod.state.running_adapters == {"a"}
