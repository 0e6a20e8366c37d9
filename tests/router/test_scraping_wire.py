"""The router's scrapes on aiohttp, at the wire: emulated pods on real sockets that stall,
refuse or answer badly, and a router (``router_for``) that scrapes them as it runs.

A stalled read is held by the pod until the test lets it go (a ``threading.Event``
released in ``finally``); the router's own timeouts (``scrape_timeout_s``,
``health_timeout_s``, ``load_timeout_s`` for a listing) end the wait, never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.adapters.http_engine import body_excerpt
from placement.adapters.vllm import VllmClient
from placement.domain import Engine, Fleet, PodId
from placement.emulator import (
    EmulatedFleet,
    PodConfig,
    listening_sockets,
    ports_of,
    serving_in_thread,
)
from placement.errors import EngineError, PermanentEngineError
from placement.ports import Registered
from placement.router.scrape_http import AiohttpScrapes, Fetched, listing_of

from .conftest import MANUAL, Running, router_for

#: Short read timeouts: a stalled scrape gives up within a fraction of a second.
QUICK = replace(
    MANUAL,
    router=replace(
        MANUAL.router, scrape_timeout_s=0.2, health_timeout_s=0.2, listing_every_scrapes=2
    ),
)


class Stall:
    """What the pods hold: ``paths[pod]`` are held until ``release``; ``answer[pod]``
    replaces a path's answer with ``(status, body)``."""

    def __init__(self) -> None:
        self.paths: dict[str, set[str]] = {}
        self.answers: dict[tuple[str, str], tuple[int, bytes]] = {}
        self.held = 0
        self._released = threading.Event()

    def release(self) -> None:
        self._released.set()

    async def wait(self) -> None:
        self.held += 1
        await asyncio.to_thread(self._released.wait)


class _Stalling:
    """ASGI middleware on an emulated pod: holds or replaces what ``Stall`` names."""

    def __init__(self, app: Any, *, pod: str, stall: Stall) -> None:
        self.app, self.pod, self.stall = app, pod, stall

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path in self.stall.paths.get(self.pod, set()):
                await self.stall.wait()
            answer = self.stall.answers.get((self.pod, path))
            if answer is not None:
                status, body = answer
                headers = [(b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


@contextlib.contextmanager
def stalling(
    n: int, *, engine: Engine = Engine.VLLM, **config: Any
) -> Iterator[tuple[Fleet, Stall]]:
    """``n`` emulated pods on real sockets, each behind ``_Stalling``."""
    sockets = listening_sockets(n)
    pod_config = replace(PodConfig(), engine=engine, **config)
    fleet = EmulatedFleet.start(n, engine=engine, ports=ports_of(sockets), config=pod_config)
    stall = Stall()
    for handle in fleet.handles:
        handle.app.add_middleware(_Stalling, pod=handle.name, stall=stall)
    with serving_in_thread(fleet.handles, sockets=sockets):
        try:
            yield fleet.domain(), stall
        finally:
            stall.release()  # before the pods stop: no request of theirs is left held


def _healthy(router: Running) -> list[str]:
    return [str(pod) for pod in router.get("/healthz")["healthy_pods"]]


def _pod_healthy(router: Running, pod: str) -> float | None:
    return router.registry.get_sample_value("lorafleet_pod_healthy", {"pod": pod})


def _left(caplog: pytest.LogCaptureFixture, pod: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"pod {pod} leaves the rotation")
    ]


def test_a_pod_stalling_its_metrics_leaves_after_two_timed_out_scrapes_and_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lorafleet.router")
    with stalling(2) as (fleet, stall), router_for(fleet, settings=QUICK) as router:
        assert _healthy(router) == ["pod-0", "pod-1"]
        stall.paths["pod-1"] = {"/metrics"}
        router.scrape()  # one slow answer may be the router's own loop: pod-1 stays
        assert stall.held == 1
        assert _healthy(router) == ["pod-0", "pod-1"]
        router.scrape()
        assert stall.held == 2
        assert _healthy(router) == ["pod-0"]
        assert _pod_healthy(router, "pod-1") == 0.0
        assert _left(caplog, "pod-1") == ["pod pod-1 leaves the rotation: scrapes timed out twice"]
        stall.paths.clear()
        stall.release()
        router.scrape()
        assert _healthy(router) == ["pod-0", "pod-1"]
        assert _pod_healthy(router, "pod-1") == 1.0


def test_an_sglang_pod_without_metrics_whose_health_stalls_leaves_on_health_timeouts() -> None:
    with (
        stalling(1, engine=Engine.SGLANG, sglang_metrics=False) as (fleet, stall),
        router_for(fleet, settings=QUICK) as router,
    ):
        router.scrape()  # not a listing round: /health is not asked
        assert _healthy(router) == ["pod-0"]  # judged by /health at start: it answered
        stall.paths["pod-0"] = {"/health"}
        router.scrape()  # a listing round: /health is asked, and stalls
        assert (stall.held, _healthy(router)) == (1, ["pod-0"])
        router.scrape()  # not a listing round, but the last probe was never answered
        assert (stall.held, _healthy(router)) == (2, [])


def test_a_listing_that_stalls_past_the_load_timeout_takes_the_pod_out_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lorafleet.router")
    quick_listing = replace(QUICK, router=replace(QUICK.router, load_timeout_s=0.2))
    with stalling(2) as (fleet, stall), router_for(fleet, settings=quick_listing) as router:
        stall.paths["pod-0"] = {"/v1/models"}
        router.scrape()  # the second scrape (start made the first): no listing
        assert stall.held == 0
        router.scrape()  # a listing round
        assert stall.held == 1
        assert _healthy(router) == ["pod-1"]
        assert _left(caplog, "pod-0") == [
            "pod pod-0 leaves the rotation: pod-0: GET /v1/models timed out"
        ]


@pytest.mark.parametrize(
    ("path", "status", "body", "said"),
    [
        ("/metrics", 500, b"boom", "pod-1: /metrics answered 500: boom"),
        ("/v1/models", 503, b'{"message": "busy"}', "pod-1: GET /v1/models answered 503: busy"),
        (
            "/v1/models",
            200,
            b"[1, 2]",
            "pod-1: /v1/models answered a body that is not a model list",
        ),
    ],
    ids=["metrics-500", "listing-503", "listing-not-a-list"],
)
def test_a_bad_answer_takes_the_pod_out_at_once_named(
    caplog: pytest.LogCaptureFixture, path: str, status: int, body: bytes, said: str
) -> None:
    caplog.set_level(logging.INFO, logger="lorafleet.router")
    with stalling(2) as (fleet, stall), router_for(fleet, settings=QUICK) as router:
        stall.answers["pod-1", path] = (status, body)
        router.scrape()  # start made the first scrape: not a listing round
        router.scrape()  # a listing round
        assert _healthy(router) == ["pod-0"]
        assert _left(caplog, "pod-1") == [f"pod pod-1 leaves the rotation: {said}"]


def test_a_pod_refusing_connections_leaves_at_once_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lorafleet.router")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused_url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
        with stalling(2) as (fleet, _):
            pools = tuple(
                replace(pool, pods=tuple(
                    replace(pod, url=refused_url) if pod.name == PodId("pod-1") else pod
                    for pod in pool.pods
                ))
                for pool in fleet.pools
            )  # fmt: skip
            with router_for(replace(fleet, pools=pools), settings=QUICK) as router:
                assert _healthy(router) == ["pod-0"]
                (said,) = _left(caplog, "pod-1")
                assert said.startswith("pod pod-1 leaves the rotation: pod-1: GET /metrics failed")


def test_a_stopped_router_closes_its_scrape_session() -> None:
    with stalling(1) as (fleet, _), router_for(fleet, settings=QUICK) as router:
        scrapes = router.router.scrape_http
        assert isinstance(scrapes, AiohttpScrapes)
        core = router.router
    assert core.scrape_http is None
    assert scrapes.closed


# --- the listing, read as the engine clients read it ---------------------------------

CARDS = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"id": st.sampled_from(["base", "a", "b", "c"])},
            optional={
                "parent": st.one_of(st.none(), st.sampled_from(["", "base", "other"])),
                "root": st.one_of(st.none(), st.sampled_from(["", "s3://x", "/p"])),
            },
        ),
        st.just({"id": 7}),
        st.just("card"),
    ),
    max_size=6,
)
BODIES: st.SearchStrategy[object] = st.one_of(
    CARDS.map(lambda cards: {"object": "list", "data": cards}),
    st.just({"data": "x"}),
    st.just({"nodata": []}),
    st.just([]),
)


def _by_client(status: int, body: bytes) -> Registered | str:
    async def read() -> Registered:
        def answer(request: httpx.Request) -> httpx.Response:
            return httpx.Response(status, content=body)

        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
            return await VllmClient(PodId("pod-9"), "http://pod-9", http=http).registered()

    try:
        return asyncio.run(read())
    except EngineError as exc:
        return f"{type(exc).__name__}: {exc}"


def _by_scrape(status: int, body: bytes) -> Registered | str:
    try:
        return listing_of(Fetched(status, body), pod="pod-9")
    except EngineError as exc:
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=60, deadline=None)
@given(
    body=st.one_of(
        BODIES.map(lambda b: json.dumps(b).encode()), st.text(max_size=8).map(str.encode)
    ),
    status=st.sampled_from([200, 200, 200, 404, 429, 500, 503]),
)
def test_the_scrapes_listing_reads_every_answer_as_the_engine_client_does(
    body: bytes, status: int
) -> None:
    scraped, read = _by_scrape(status, body), _by_client(status, body)
    if status == 200:
        assert scraped == read
        return
    # The same error; the scrape names the body by its one-line excerpt (a log line's).
    assert isinstance(read, str)
    said = f"answered {status}: "
    assert scraped == read[: read.index(said) + len(said)] + body_excerpt(status, body)


@pytest.mark.parametrize("body", [b"<html>", b"\x80\x81"], ids=["html", "not-utf8"])
def test_a_listing_that_is_not_json_is_a_permanent_error_naming_the_pod(body: bytes) -> None:
    # (VllmClient.registered raises UnicodeDecodeError on the second: left to its owner.)
    with pytest.raises(PermanentEngineError, match=r"^pod-9: /v1/models answered a body"):
        listing_of(Fetched(200, body), pod="pod-9")


def test_listing_every_scrape_reads_the_listing_on_every_scrape() -> None:
    every = replace(QUICK, router=replace(QUICK.router, listing_every_scrapes=1))
    with stalling(1) as (fleet, stall), router_for(fleet, settings=every) as router:
        stall.answers["pod-0", "/v1/models"] = (503, b"busy")
        router.scrape()  # N = 1: this scrape reads the listing too
        assert _healthy(router) == []
