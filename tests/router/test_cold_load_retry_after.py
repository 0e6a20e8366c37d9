"""A pod that refuses a cold load with a ``Retry-After`` is sent no other load until the
wait is over (capped at ``cold_loads.MAX_LOAD_HOLD_S``): a load asked of it meanwhile
fails at once with a ``RetryableEngineError`` naming the wait, as a failed load does
(the proxy and the endpoint picker try another pod), without reaching the pod.

The pod is ``tests.pods.wire_server`` over a real socket, answering the load with 503
and a Retry-After; the router is driven at its interface (``Router.load``) with its
``timer`` injected, so nothing waits on the wall clock. Through the proxy, two emulated
pods, the planned one refusing every load with a Retry-After of an hour.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.errors import RetryableEngineError
from placement.router import Router
from placement.router.adapter_info import AdapterInfo
from placement.router.cold_loads import MAX_LOAD_HOLD_S
from placement.router.sources import StaticPlanSource
from placement.router.state import LivePod, Upstream
from tests.pods.wire_server import Answer, WireServer, text

from .conftest import catalog_of, emulated, plan_of, router_for

LOAD = "POST /v1/load_lora_adapter"
ALPHA, BETA = AdapterId("alpha"), AdapterId("beta")


class Timer:
    """The router's timer, moved by the test."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class OnePod:
    description = "one pod"

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream

    async def upstreams(self) -> tuple[Upstream, ...]:
        return (self.upstream,)


@pytest.fixture
def server() -> Iterator[WireServer]:
    wire = WireServer().start()
    yield wire
    wire.stop()


def refused(after: str | None) -> Answer:
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "text/plain"),)
    if after is not None:
        headers += (("Retry-After", after),)
    return Answer(status=503, body=b"busy", headers=headers)


async def _router(server: WireServer, timer: Timer) -> tuple[Router, LivePod]:
    upstream = Upstream(
        pod=PodId("pod-0"),
        pool=PoolId("llama"),
        url=server.url,
        engine=Engine.VLLM,
        served_model="llama",
        max_loras=2,
        max_cpu_loras=4,
    )
    router = Router(
        plan_source=StaticPlanSource(None),
        pod_source=OnePod(upstream),
        engine_http=httpx.AsyncClient(),
        timer=timer,
        adapters=AdapterInfo(sources={ALPHA: "s3://a/alpha", BETA: "s3://a/beta"}),
        registry=CollectorRegistry(),
    )
    await router.refresh_pods()
    return router, router.topology.pods[upstream.pod]


async def _load_fails(router: Router, state: LivePod, adapter: AdapterId) -> str:
    with pytest.raises(RetryableEngineError) as failed:
        await router.load(state, adapter)
    return str(failed.value)


HOLDS = [
    pytest.param("5", 5.0, id="delta-seconds"),
    pytest.param("3600", MAX_LOAD_HOLD_S, id="an-hour-capped"),
]


@pytest.mark.parametrize(("after", "held_s"), HOLDS)
@pytest.mark.anyio
async def test_no_load_reaches_a_pod_before_its_retry_after_is_over(
    server: WireServer, after: str, held_s: float
) -> None:
    timer = Timer()
    router, state = await _router(server, timer)
    assert router.engine_http is not None
    try:
        server.answers[LOAD] = refused(after)
        assert "answered 503" in await _load_fails(router, state, ALPHA)
        server.answers[LOAD] = text(200, "Success")  # ready, but it asked us to wait
        timer.now_s += held_s - 0.5
        said = await _load_fails(router, state, BETA)  # another adapter: held back too
        assert "Retry-After" in said and "0.5 s more" in said
        assert server.seen.count(LOAD) == 1
        timer.now_s += 0.5  # the wait is over
        await router.load(state, ALPHA)
        assert state.ledger.is_listed(ALPHA)
        assert server.seen.count(LOAD) == 2
    finally:
        await router.engine_http.aclose()


@pytest.mark.parametrize("after", [None, "soon", "0"], ids=["no-header", "unreadable", "zero"])
@pytest.mark.anyio
async def test_a_refusal_without_a_wait_holds_nothing_back(
    server: WireServer, after: str | None
) -> None:
    timer = Timer()
    router, state = await _router(server, timer)
    assert router.engine_http is not None
    try:
        server.answers[LOAD] = refused(after)
        await _load_fails(router, state, ALPHA)
        server.answers[LOAD] = text(200, "Success")
        await router.load(state, ALPHA)  # at once: the pod asked for no wait
        assert server.seen.count(LOAD) == 2
    finally:
        await router.engine_http.aclose()


# --- through the proxy: the request goes to another pod, the held one is not asked ------


class _RefuseLoads:
    """ASGI middleware on one emulated pod: every load is answered 503 with a
    Retry-After of an hour (the router holds it ``MAX_LOAD_HOLD_S``), and counted."""

    def __init__(self, app: Any, *, refusals: list[str]) -> None:
        self.app, self.refusals = app, refusals

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/load_lora_adapter":
            await self.app(scope, receive, send)
            return
        self.refusals.append(scope["path"])
        headers = [(b"content-type", b"text/plain"), (b"retry-after", b"3600")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": b"busy"})


def test_a_pod_that_asked_to_wait_gets_no_load_and_its_requests_go_elsewhere() -> None:
    refusals: list[str] = []
    with emulated(2) as pods:
        held = next(h for h in pods.fleet.handles if h.name == "pod-0")
        held.app.add_middleware(_RefuseLoads, refusals=refusals)
        plan = plan_of({"alpha": ["pod-0"], "beta": ["pod-0"]})
        with router_for(pods.domain, plan=plan, catalog=catalog_of(["alpha", "beta"])) as router:
            client = router.client()
            for model in ("alpha", "beta"):
                assert client.completions.create(model=model, prompt="p", max_tokens=1).choices
        assert refusals == ["/v1/load_lora_adapter"]  # beta's load was not sent to pod-0
        assert pods.fleet.pod("pod-1").counters["requests"] == 2
