"""The scraper's parse thread (a ``/metrics`` page past ``PARSE_IN_THREAD_BYTES`` is
parsed there) ends with the router: ``Router.stop`` closes it, so a process that starts
and stops routers (the tests, an embedding) keeps no idle thread per router.

The pod answers through ``httpx.MockTransport``; the thread is waited for with a
bounded ``join``, never a sleep.
"""

from __future__ import annotations

import asyncio
import threading

import httpx

from placement.domain import Engine, PodId, PoolId
from placement.ports import PodMetrics
from placement.router import Router
from placement.router.live_pods import Upstream
from placement.router.scraping import PARSE_IN_THREAD_BYTES
from placement.router.sources import StaticPlanSource
from tests.router.conftest import MANUAL

#: How long a parse thread told to end may take to (it has nothing queued).
JOIN_S = 10.0

UPSTREAM = Upstream(pod=PodId("pod-0"), pool=PoolId("p"), url="http://pod-0",
                    engine=Engine.VLLM, served_model="base", max_loras=4,
                    max_cpu_loras=8)  # fmt: skip
HEAD = (
    'vllm:num_requests_running{engine="0"} 2\n'
    'vllm:num_requests_waiting{engine="0"} 5\n'
    'vllm:kv_cache_usage_perc{engine="0"} 0.375\n'
    "# TYPE vllm:lora_requests_info gauge\n"
)


def _big_page() -> bytes:
    lines = [
        f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="a{i}",'
        f'waiting_lora_adapters=""}} {i}\n'
        for i in range(PARSE_IN_THREAD_BYTES // 80 + 1)
    ]
    page = (HEAD + "".join(lines)).encode()
    assert len(page) > PARSE_IN_THREAD_BYTES
    return page


class OnePod:
    description = "one pod"

    async def upstreams(self) -> tuple[Upstream, ...]:
        return (UPSTREAM,)


def _answer(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/metrics":
        return httpx.Response(200, content=_big_page())
    return httpx.Response(200, json={"object": "list", "data": []})


def _parse_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("lorafleet-parse")}


def test_a_stopped_router_leaves_no_parse_thread_alive() -> None:
    # Before, the thread lived on, idle, until the process ended: one per router.
    before = _parse_threads()  # other tests' scrapers, never stopped, are not this one's

    async def start_and_stop() -> set[threading.Thread]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(_answer)) as http:
            router = Router(
                plan_source=StaticPlanSource(None),
                pod_source=OnePod(),
                engine_http=http,
                settings=MANUAL.router,
            )
            await router.start()  # its first scrape round parses the page in the thread
            try:
                assert router.topology.pods[UPSTREAM.pod].metrics.running == 2
                started = _parse_threads() - before
            finally:
                await router.stop()
            return started

    started = asyncio.run(start_and_stop())
    assert len(started) == 1  # the page was parsed there
    for thread in started:
        thread.join(JOIN_S)
    assert [t.name for t in started if t.is_alive()] == []


def test_a_scrape_after_stop_parses_in_a_new_thread_ended_by_the_next_stop() -> None:
    # close() leaves the scraper usable: a router started again scrapes as before.
    before = _parse_threads()

    async def twice() -> tuple[set[threading.Thread], bool]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(_answer)) as http:
            router = Router(
                plan_source=StaticPlanSource(None),
                pod_source=OnePod(),
                engine_http=http,
                settings=MANUAL.router,
            )
            await router.start()
            await router.stop()
            await router.start()
            try:
                state = router.topology.pods[UPSTREAM.pod]
                state.metrics = PodMetrics()  # what the first scrape read, forgotten
                await router.scrape_all()
                read = state.metrics.running == 2 and state.healthy
            finally:
                await router.stop()
            return _parse_threads() - before, read

    started, read = asyncio.run(twice())
    assert read
    for thread in started:
        thread.join(JOIN_S)
    assert [t.name for t in started if t.is_alive()] == []
