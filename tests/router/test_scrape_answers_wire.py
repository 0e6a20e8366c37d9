"""The router's scrapes against bad answers at the wire: emulated pods on real sockets
whose ``/metrics``, ``/health`` or ``/v1/models`` a test replaces (``Scripted``), scraped
by a running router over aiohttp, and ``AiohttpScrapes`` against raw HTTP
(``tests.pods.wire_server``).

An error answer is named by its status and a short one-line excerpt of its body; a body
is read up to the scrape's cap: a ``/metrics`` page past it is read from its head when
what the router reads is whole there, else the pod is judged by ``/health`` (counted,
said once, never taken out for it), and a listing past it is refused; a ``/metrics``
line that cannot be read costs that line (left out, counted, said once), not the pod,
unless it is a line of a metric the router reads, or nothing the router reads is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from placement.domain import Engine, Fleet, PodId
from placement.emulator import (
    EmulatedFleet,
    PodConfig,
    listening_sockets,
    ports_of,
    serving_in_thread,
)
from placement.errors import PermanentEngineError
from placement.router.scrape_http import (
    MAX_METRICS_BYTES,
    AiohttpScrapes,
    Fetched,
    HttpxScrapes,
    listing_of,
)
from tests.pods.wire_server import Answer, WireServer

from .conftest import MANUAL, Running, router_for

QUICK = replace(MANUAL, router=replace(MANUAL.router, scrape_timeout_s=2.0, health_timeout_s=2.0))


class Scripted:
    """What the pods answer instead of their own: ``answers[pod, path]`` is ``(status,
    body)``; a body in ``chunked`` is sent in 64 KiB pieces without a Content-Length."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, bytes]] = {}
        self.chunked: set[tuple[str, str]] = set()


class _Scripting:
    """ASGI middleware on an emulated pod: answers what ``Scripted`` names."""

    def __init__(self, app: Any, *, pod: str, scripted: Scripted) -> None:
        self.app, self.pod, self.scripted = app, pod, scripted

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        key = (self.pod, scope.get("path", ""))
        answer = self.scripted.answers.get(key) if scope["type"] == "http" else None
        if answer is None:
            await self.app(scope, receive, send)
            return
        status, body = answer
        if key not in self.scripted.chunked:
            headers = [(b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await send({"type": "http.response.start", "status": status, "headers": []})
        for start in range(0, len(body), 65536):
            piece = body[start : start + 65536]
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


@contextlib.contextmanager
def scripted_pods(
    n: int, *, engine: Engine = Engine.VLLM, **config: Any
) -> Iterator[tuple[Fleet, Scripted]]:
    sockets = listening_sockets(n)
    pod_config = replace(PodConfig(), engine=engine, **config)
    fleet = EmulatedFleet.start(n, engine=engine, ports=ports_of(sockets), config=pod_config)
    scripted = Scripted()
    for handle in fleet.handles:
        handle.app.add_middleware(_Scripting, pod=handle.name, scripted=scripted)
    with serving_in_thread(fleet.handles, sockets=sockets):
        yield fleet.domain(), scripted


def _healthy(router: Running) -> list[str]:
    return [str(pod) for pod in router.get("/healthz")["healthy_pods"]]


def _said(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(start)]


@pytest.fixture(autouse=True)
def _router_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lorafleet.router")


# --- error answers, named by their bodies --------------------------------------------

NGINX = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>\n"
TRACEBACK = b'Traceback (most recent call last):\n  File "engine.py"\nRuntimeError: dead\n'


@pytest.mark.parametrize(
    ("path", "status", "body", "said"),
    [
        (
            "/metrics",
            502,
            NGINX,
            "/metrics answered 502: 502 Bad Gateway (an HTML page: a proxy in front of the pod?)",
        ),
        (
            "/metrics",
            500,
            TRACEBACK,
            '/metrics answered 500: Traceback (most recent call last): File "engine.py" '
            "RuntimeError: dead",
        ),
        ("/metrics", 500, b"", "/metrics answered 500: (empty body)"),
        (
            "/metrics",
            500,
            b"x" * 5000,
            f"/metrics answered 500: {'x' * 200}... (5000 bytes in all)",
        ),
        (
            "/v1/models",
            500,
            b'{"message": "\\u001b[31mengine\\r\\nfailed"}',
            "GET /v1/models answered 500: [31mengine failed",
        ),
    ],
    ids=["metrics-html-page", "metrics-traceback", "metrics-empty", "metrics-long", "listing-ansi"],
)
def test_an_error_answer_is_named_by_its_status_and_a_one_line_excerpt_of_its_body(
    caplog: pytest.LogCaptureFixture, path: str, status: int, body: bytes, said: str
) -> None:
    with scripted_pods(2) as (fleet, scripted), router_for(fleet, settings=QUICK) as router:
        scripted.answers["pod-1", path] = (status, body)
        router.scrape()  # start made the first scrape: not a listing round
        router.scrape()
        router.scrape()
        router.scrape()  # the listing round (every 4th)
        assert _healthy(router) == ["pod-0"]
        assert _said(caplog, "pod pod-1 leaves") == [
            f"pod pod-1 leaves the rotation: pod-1: {said}"
        ]


def test_an_sglang_pod_without_metrics_whose_health_fails_is_named_by_its_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        scripted_pods(1, engine=Engine.SGLANG, sglang_metrics=False) as (fleet, scripted),
        router_for(fleet, settings=QUICK) as router,
    ):
        scripted.answers["pod-0", "/health"] = (503, b"<title>Service\n Unavailable</title>")
        for _ in range(4):  # /health is asked on the listing round
            router.scrape()
        assert _healthy(router) == []
        assert _said(caplog, "pod pod-0 leaves") == [
            "pod pod-0 leaves the rotation: pod-0: /health answered 503: Service Unavailable "
            "(an HTML page: a proxy in front of the pod?)"
        ]


# --- bodies past the cap -------------------------------------------------------------

PAGE = (
    '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 1\n'
    '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n'
)
SGLANG_PAGE = (
    '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 1\n'
    '# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name="m"} 0.25\n'
)


LORA = "# TYPE vllm:lora_requests_info gauge\n"
WHOLE = (
    PAGE
    + 'vllm:num_requests_waiting{engine="0"} 3\n'
    + LORA
    + "".join(
        f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="{name}",'
        f'waiting_lora_adapters=""}} {stamp}\n'
        for name, stamp in (("old", 1.0), ("a", 2.0))
    )
)


def _over_the_cap(prefix: str, series: str) -> bytes:
    """``prefix``, then ``series`` lines (one family) until the page is past the cap."""
    lines = [series.format(i) for i in range(MAX_METRICS_BYTES // len(series) + 1)]
    return (prefix + "\n".join(lines) + "\n").encode()


def _too_large(router: Running, pod: str) -> float | None:
    return router.registry.get_sample_value(
        "lorafleet_router_scrape_problems_total", {"pod": pod, "kind": "too_large"}
    )


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_page_past_the_cap_is_read_from_its_head_when_what_the_router_reads_is_whole_there(
    caplog: pytest.LogCaptureFixture, chunked: bool
) -> None:
    # A page past the cap used to take the pod out at every scrape, until it restarted.
    histogram = 'vllm:e2e_request_latency_seconds_bucket{{le="{0}"}} 1'
    page = _over_the_cap(WHOLE + "# TYPE vllm:e2e_request_latency_seconds histogram\n", histogram)
    with scripted_pods(2) as (fleet, scripted), router_for(fleet, settings=QUICK) as router:
        scripted.answers["pod-1", "/metrics"] = (200, page)
        if chunked:
            scripted.chunked.add(("pod-1", "/metrics"))
        router.scrape()
        router.scrape()
        assert _healthy(router) == ["pod-0", "pod-1"]
        metrics = router.router.topology.pods[PodId("pod-1")].metrics
        assert (metrics.running, metrics.waiting, metrics.kv_usage) == (1, 3, 0.25)
        assert (metrics.running_adapters, metrics.max_loras) == (frozenset({"a"}), 4)
        assert _too_large(router, "pod-1") == 2.0  # one a scrape
        missing = {"pod": "pod-1"}
        assert router.registry.get_sample_value(
            "lorafleet_router_pod_metrics_missing", missing
        ) in (None, 0.0)
        assert _said(caplog, "pod pod-1: /metrics is over") == [
            f"pod pod-1: /metrics is over {MAX_METRICS_BYTES} bytes: read its first bytes, "
            "which hold whole the metrics the router reads; the rest left unread "
            "(lorafleet_router_scrape_problems_total{kind='too_large'})"
        ]


@pytest.mark.parametrize("health", [200, 503], ids=["health-ok", "health-503"])
def test_a_page_whose_lora_series_go_past_the_cap_leaves_the_pod_judged_by_health(
    caplog: pytest.LogCaptureFixture, health: int
) -> None:
    # vllm:lora_requests_info, a series per adapter mix ever run, is what grows.
    series = (
        'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="a{0}",'
        'waiting_lora_adapters=""}} 1.0'
    )
    page = _over_the_cap(PAGE + 'vllm:num_requests_waiting{engine="0"} 3\n' + LORA, series)
    with scripted_pods(2) as (fleet, scripted), router_for(fleet, settings=QUICK) as router:
        scripted.answers["pod-1", "/metrics"] = (200, page)
        if health != 200:
            scripted.answers["pod-1", "/health"] = (health, b"engine dead")
        router.scrape()
        router.scrape()
        if health == 200:
            assert _healthy(router) == ["pod-0", "pod-1"]
            assert router.router.topology.pods[PodId("pod-1")].metrics.running == 0
        else:
            assert _healthy(router) == ["pod-0"]
            assert _said(caplog, "pod pod-1 leaves") == [
                "pod pod-1 leaves the rotation: pod-1: /health answered 503: engine dead"
            ]
        missing = {"pod": "pod-1"}
        gauge = "lorafleet_router_pod_metrics_missing"
        assert router.registry.get_sample_value(gauge, missing) == 1.0
        assert _too_large(router, "pod-1") == 2.0
        assert _said(caplog, "pod pod-1: /metrics is over") == [
            f"pod pod-1: /metrics is over {MAX_METRICS_BYTES} bytes: the metrics the router "
            "reads are not all whole within them: the pod stays in the rotation judged by "
            "/health, its load unknown (lorafleet_router_pod_metrics_missing 1) "
            "(lorafleet_router_scrape_problems_total{kind='too_large'})"
        ]
        scripted.answers["pod-1", "/metrics"] = (200, WHOLE.encode())  # the pod restarted
        scripted.answers.pop(("pod-1", "/health"), None)
        router.scrape()
        router.scrape()
        assert _healthy(router) == ["pod-0", "pod-1"]
        assert router.registry.get_sample_value(gauge, missing) == 0.0
        assert router.router.topology.pods[PodId("pod-1")].metrics.running == 1


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_a_body_past_the_cap_is_read_up_to_it_whatever_its_length_says(client: str) -> None:
    # A Content-Length past the cap was refused unread by aiohttp alone; httpx read on.
    server = WireServer().start()
    try:
        server.answers["GET /metrics"] = Answer(body=b"x" * 5000)
        server.answers["GET /v1/models"] = Answer(body=b"y" * 5000)

        async def scrape() -> tuple[Fetched, Fetched]:
            http = httpx.AsyncClient()
            scrapes = AiohttpScrapes() if client == "aiohttp" else HttpxScrapes(http)
            try:
                page = await scrapes.get(
                    server.url, "/metrics", pod="pod-9", timeout_s=5.0, max_bytes=1000
                )
                listing = await scrapes.get(
                    server.url, "/v1/models", pod="pod-9", timeout_s=5.0, max_bytes=1000
                )
            finally:
                await scrapes.close()
                await http.aclose()
            return page, listing

        page, listing = asyncio.run(scrape())
        assert page == Fetched(200, b"x" * 1000, cut=True)
        with pytest.raises(PermanentEngineError) as raised:
            listing_of(listing, pod="pod-9")
        assert str(raised.value) == (
            "pod-9: GET /v1/models answered 200 with a body over 1000 bytes: not read past them"
        )
    finally:
        server.stop()


# --- a page with lines the router cannot read ----------------------------------------

WAITING = 'vllm:num_requests_waiting{engine="0"} 3\n'
BROKEN = 'vllm:e2e_request_latency_seconds_bucket{le="0.1" 7'


def test_a_line_the_router_does_not_read_is_left_out_counted_said_once_and_the_pod_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    page = PAGE + "<!-- proxy banner -->\n" + BROKEN + "\n" + WAITING
    with scripted_pods(2) as (fleet, scripted), router_for(fleet, settings=QUICK) as router:
        scripted.answers["pod-1", "/metrics"] = (200, page.encode())
        router.scrape()
        router.scrape()
        assert _healthy(router) == ["pod-0", "pod-1"]
        metrics = router.router.topology.pods[PodId("pod-1")].metrics
        assert (metrics.running, metrics.waiting, metrics.kv_usage) == (1, 3, 0.25)
        problems = {"pod": "pod-1", "kind": "sample"}
        total = "lorafleet_router_scrape_problems_total"
        assert router.registry.get_sample_value(total, problems) == 4.0  # 2 lines, 2 scrapes
        assert _said(caplog, "pod pod-1: /metrics") == [
            "pod pod-1: /metrics line 5 ('<!-- proxy banner -->'): invalid metric name:"
            "<!-- proxy banner -->; left out, the rest of the page read "
            "(lorafleet_router_scrape_problems_total{kind='sample'})",
            f"pod pod-1: /metrics line 6 ({BROKEN!r}): could not convert string to float: "
            "'{le=\"0.1\"'; left out, the rest of the page read "
            "(lorafleet_router_scrape_problems_total{kind='sample'})",
        ]
        assert "lorafleet_router_scrape_problems_total" in router.get("/metrics")


@pytest.mark.parametrize(
    ("engine", "line", "said"),
    [
        (
            Engine.VLLM,
            'vllm:kv_cache_usage_perc{engine="1" 0.9',
            "line 5 ('vllm:kv_cache_usage_perc{engine=\"1\" 0.9'), a line of "
            "vllm:kv_cache_usage_perc the router reads: could not convert string to float",
        ),
        (
            Engine.VLLM,
            'vllm:lora_requests_info{running_lora_adapters="a} 1',
            "line 5 ('vllm:lora_requests_info{running_lora_adapters=\"a} 1'), a line of "
            "vllm:lora_requests_info the router reads: ",
        ),
        (
            Engine.SGLANG,
            "sglang:num_queue_reqs two",
            "line 5 ('sglang:num_queue_reqs two'), a line of sglang:num_queue_reqs the router "
            "reads: could not convert string to float",
        ),
    ],
    ids=["vllm-kv-usage", "vllm-lora-info", "sglang-queue"],
)
def test_a_broken_line_of_a_metric_the_router_reads_takes_the_pod_out_named(
    caplog: pytest.LogCaptureFixture, engine: Engine, line: str, said: str
) -> None:
    page = (SGLANG_PAGE if engine is Engine.SGLANG else PAGE) + line + "\n"
    with (
        scripted_pods(2, engine=engine) as (fleet, scripted),
        router_for(fleet, settings=QUICK) as router,
    ):
        scripted.answers["pod-1", "/metrics"] = (200, page.encode())
        router.scrape()
        assert _healthy(router) == ["pod-0"]
        (left,) = _said(caplog, "pod pod-1 leaves")
        assert left.startswith(
            f"pod pod-1 leaves the rotation: pod-1: unreadable /metrics text at {said}"
        )


def test_a_page_with_nothing_the_router_reads_left_takes_the_pod_out_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with scripted_pods(2) as (fleet, scripted), router_for(fleet, settings=QUICK) as router:
        scripted.answers["pod-1", "/metrics"] = (200, NGINX)  # a proxy's page, as a 200
        router.scrape()
        assert _healthy(router) == ["pod-0"]
        (left,) = _said(caplog, "pod pod-1 leaves")
        assert left.startswith(
            "pod pod-1 leaves the rotation: pod-1: unreadable /metrics text: 1 line refused "
            "(the first at line 1 ('<html><head><title>502 Bad Gateway</title>"
        )
        assert left.endswith("not a metrics page?")


def test_a_problem_gone_for_a_scrape_is_forgotten_and_said_again_when_it_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Before, a pod's problems said were kept until it had new bad lines (or for good).
    broken = (PAGE + BROKEN + "\n" + WAITING).encode()
    with scripted_pods(2) as (fleet, scripted), router_for(fleet, settings=QUICK) as router:
        scripted.answers["pod-1", "/metrics"] = (200, broken)
        router.scrape()
        scripted.answers["pod-1", "/metrics"] = (200, (PAGE + WAITING).encode())
        router.scrape()
        scripted.answers["pod-1", "/metrics"] = (200, broken)
        router.scrape()
        router.scrape()
        assert _healthy(router) == ["pod-0", "pod-1"]
        said = _said(caplog, "pod pod-1: /metrics line 5")
        assert len(said) == 2, said  # once, then again after the clean page: not at each


def test_a_megabyte_line_is_said_and_kept_as_why_cut_with_a_marker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    left_out = "vllm:e2e_" + "x" * 1_000_000 + ' {le="0.1" 7'
    read = "vllm:num_requests_running_" + "x" * 1_000_000 + '{e="0" 1'
    with scripted_pods(3) as (fleet, scripted), router_for(fleet, settings=QUICK) as router:
        scripted.answers["pod-1", "/metrics"] = (200, (PAGE + left_out + "\n").encode())
        scripted.answers["pod-2", "/metrics"] = (200, (PAGE + read + "\n").encode())
        router.scrape()
        assert _healthy(router) == ["pod-0", "pod-1"]
        (told,) = _said(caplog, "pod pod-1: /metrics line 5")
        (left,) = _said(caplog, "pod pod-2 leaves")
        assert len(told) < 600 and len(left) < 1000
        assert "x" * 94 + "... (1000026 characters in all) the router reads: " in left
        assert "x" * 111 + "... (1000021 characters in all)')" in told
        assert len(router.router.scraper.why[PodId("pod-2")]) < 1000


def test_a_pod_that_leaves_the_topology_leaves_nothing_kept_for_it() -> None:
    # Before, why a pod left the rotation and the problems said of its page were kept
    # for every pod ever seen: a fleet that churns pods grew them without end.
    left_out = (PAGE + BROKEN + "\n" + WAITING).encode()
    read = (PAGE + 'vllm:kv_cache_usage_perc{engine="1" 0.9\n').encode()
    with scripted_pods(3) as (fleet, scripted), router_for(fleet, settings=QUICK) as router:
        scripted.answers["pod-1", "/metrics"] = (200, left_out)
        scripted.answers["pod-2", "/metrics"] = (200, read)
        router.scrape()
        core = router.router
        scraper = core.scraper
        assert PodId("pod-2") in scraper.why and scraper._told.get(PodId("pod-1"))
        kept = tuple(s.upstream for s in core.topology.pods.values() if s.pod_id == "pod-0")
        core._swap(kept, core.topology.plan)
        assert set(scraper.why) | set(scraper._told) <= {PodId("pod-0")}
