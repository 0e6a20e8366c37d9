"""A scrape still in flight when its pod leaves the topology adds nothing back to what
the scraper keeps per pod (why it left the rotation, the problems said of its page, the
listing read for the other workers, its series on ``/metrics``) once ``keep_only``
pruned it at the swap: a fleet
that churns pods keeps no trace of them, however slow their last answer. Nor does a
scrape put back in the rotation a pod taken out while it was in flight.

The pod answers through ``httpx.MockTransport``, holding its answer on an
``asyncio.Event`` the test sets once the pod is gone: never the wall clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import CollectorRegistry

from placement.domain import Engine, PodId, PoolId
from placement.metrics import FleetMetrics
from placement.router.live_pods import LivePod, Upstream
from placement.router.metrics import RouterMetrics
from placement.router.scrape_http import HttpxScrapes
from placement.router.scraping import PARSE_IN_THREAD_BYTES, PodScraper
from placement.settings import RouterSettings

POD = PodId("pod-0")
UPSTREAM = Upstream(pod=POD, pool=PoolId("p"), url="http://pod-0", engine=Engine.VLLM,
                    served_model="base", max_loras=4, max_cpu_loras=8)  # fmt: skip
PAGE = (
    'vllm:num_requests_running{engine="0"} 2\n'
    'vllm:num_requests_waiting{engine="0"} 5\n'
    'vllm:kv_cache_usage_perc{engine="0"} 0.375\n'
    "# TYPE vllm:lora_requests_info gauge\n"
    'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a",'
    'waiting_lora_adapters=""} 1\n'
)
BAD_LINE = 'vllm:e2e_request_latency_seconds_bucket{le="0.1" 7\n'
LISTING = {
    "object": "list",
    "data": [{"id": "base", "object": "model"}, {"id": "a", "object": "model", "parent": "base"}],
}


def _big(page: str) -> str:
    """``page`` grown past ``PARSE_IN_THREAD_BYTES`` (parsed in the scraper's thread)."""
    filler = "".join(
        f'vllm:spare_total{{n="{i}"}} {i}\n' for i in range(PARSE_IN_THREAD_BYTES // 24)
    )
    return page + "# TYPE vllm:spare_total counter\n" + filler


@dataclass(frozen=True)
class Case:
    """What the pod answers; which path it holds until the pod is gone."""

    metrics: httpx.Response
    held_path: str = "/metrics"
    listing: bool = False


CASES = {
    # The problems said of its page (a line left out).
    "bad-line": Case(httpx.Response(200, text=PAGE + BAD_LINE)),
    "bad-line-parsed-in-thread": Case(httpx.Response(200, text=_big(PAGE + BAD_LINE))),
    # Why it left the rotation.
    "metrics-500": Case(httpx.Response(500, text="engine dead")),
    # The listing kept for the other workers (``keeps_listings``).
    "listing": Case(httpx.Response(200, text=PAGE), held_path="/v1/models", listing=True),
}


def _scraper(http: httpx.AsyncClient) -> PodScraper:
    registry = CollectorRegistry()
    scraper = PodScraper(
        settings=RouterSettings(),
        metrics=RouterMetrics(registry, max_adapter_labels=16),
        fleet_metrics=FleetMetrics(registry),
        clock=time.time,
        http=lambda: HttpxScrapes(http),
    )
    scraper.keeps_listings = True
    return scraper


def _kept_of(scraper: PodScraper, pod: PodId) -> dict[str, object]:
    tables: dict[str, Mapping[PodId, object]] = {
        "why": scraper.why,
        "told": scraper._told,
        "listings": scraper.listings_read,
    }
    return {name: table[pod] for name, table in tables.items() if pod in table}


async def _scrape_across_a_swap(case: Case, *, leaves: bool) -> dict[str, object]:
    """One scrape of the pod, its answer held while the topology swaps (without the pod
    when ``leaves``); what the scraper keeps of the pod after it ends (with ``series``:
    whether ``/metrics`` has a series of it)."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == case.held_path:
            asked.set()
            await release.wait()
        if request.url.path == "/metrics":
            return case.metrics
        return httpx.Response(200, json=LISTING)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        scraper = _scraper(http)
        scraper.keep_only((POD,))
        state = LivePod(UPSTREAM)
        state.listing_due = False
        scrape = asyncio.create_task(scraper.scrape(state, listing=case.listing))
        await asyncio.wait_for(asked.wait(), 10.0)  # bounds a broken test, never waited out
        scraper.keep_only(() if leaves else (POD,))  # the topology's swap, mid-scrape
        release.set()
        await scrape
        kept = _kept_of(scraper, POD)
        if f'pod="{POD}"' in scraper.metrics.render().decode():
            kept["series"] = True
        return kept


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_scrape_ending_after_its_pod_left_keeps_nothing_of_it(case: Case) -> None:
    # Before, the scrape's bookkeeping after its await wrote the pod back in.
    assert asyncio.run(_scrape_across_a_swap(case, leaves=True)) == {}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_scrape_of_a_pod_still_there_keeps_what_it_says(case: Case) -> None:
    # The same scrapes with the pod kept: each does write its table (the check above
    # is not vacuous).
    assert asyncio.run(_scrape_across_a_swap(case, leaves=False)) != {}


async def _scrape_while_taken_out(*, taken_out: bool) -> tuple[bool, bool]:
    """One scrape of a healthy pod, its /metrics answer held while (when ``taken_out``)
    a proxied request's failure takes the pod out; what the scrape returned, and whether
    the pod is in the rotation after it."""
    asked, release = asyncio.Event(), asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            asked.set()
            await release.wait()
            return httpx.Response(200, text=_big(PAGE))
        return httpx.Response(200, json=LISTING)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        scraper = _scraper(http)
        state = LivePod(UPSTREAM)
        state.listing_due = False
        scrape = asyncio.create_task(scraper.scrape(state, listing=False))
        await asyncio.wait_for(asked.wait(), 10.0)  # bounds a broken test, never waited out
        if taken_out:
            scraper.mark_unhealthy(state, "ConnectError: the proxied request failed")
        release.set()
        scraped = await scrape
        return scraped, state.healthy


def test_a_pod_taken_out_while_its_scrape_was_in_flight_stays_out() -> None:
    # Before, the page asked for before the failure put the pod back at once (for a page
    # parsed in the scraper's thread, seconds after the failure).
    assert asyncio.run(_scrape_while_taken_out(taken_out=True)) == (False, False)
    assert asyncio.run(_scrape_while_taken_out(taken_out=False)) == (True, True)
