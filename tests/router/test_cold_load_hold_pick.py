"""The picker is told of a Retry-After hold: a pod whose loads are held back is left out
of the pick for a request it would have to load an adapter for, so the hold costs the
request neither an attempt nor a retry; with only held pods left, the answer is 503
naming the hold, with a Retry-After of the hold's remaining seconds (rounded up).

Before, a held pod was picked as any other and refused the load at once: one of the
request's two attempts and one ``lorafleet_upstream_retries`` spent, so one failure on
the fallback pod gave 502 with a third pod free, and a one-pod pool answered 503 "no
healthy pod" with ``Retry-After: 1`` while the hold ran on.

Emulated pods on real sockets, each load gated by a ``LoadGate`` (passed through, or
answered 503 with a Retry-After, or 500); through the proxy (``router_for``) and
through the endpoint picker (``picker_for``); and at ``ColdLoads.held_for`` over
``httpx.MockTransport`` (a load held open on an event), which pods a request is kept
from. The router's timer is the test's (``Timer``), so the hold's end moves only when
the test moves it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.errors import RetryableEngineError
from placement.router import Router
from placement.router.adapter_info import AdapterInfo
from placement.router.sources import StaticPlanSource
from placement.router.state import LivePod, Upstream

from .conftest import Pods, catalog_of, emulated, plan_of, router_for
from .test_cold_load_retry_after import ALPHA, BETA, OnePod, Timer
from .test_endpoint_picker import completion, endpoint, picker_for

MODELS = ("alpha", "beta", "gamma")
GAMMA = AdapterId("gamma")
RETRIES = "lorafleet_upstream_retries_total"


@dataclass
class LoadGate:
    """What each pod answers a load with: absent, the pod's own answer; else the status
    and the Retry-After (None: no header). ``asked`` counts the loads each pod was sent."""

    refusals: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    asked: dict[str, int] = field(default_factory=dict)


class _GateLoads:
    """ASGI middleware on one emulated pod: its loads go through the ``LoadGate``."""

    def __init__(self, app: Any, *, pod: str, gate: LoadGate) -> None:
        self.app, self.pod, self.gate = app, pod, gate

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/load_lora_adapter":
            await self.app(scope, receive, send)
            return
        self.gate.asked[self.pod] = self.gate.asked.get(self.pod, 0) + 1
        refusal = self.gate.refusals.get(self.pod)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, after = refusal
        headers = [(b"content-type", b"text/plain")]
        if after is not None:
            headers.append((b"retry-after", after.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"busy"})


@pytest.fixture
def gated() -> Iterator[tuple[Pods, LoadGate]]:
    yield from _gated(3)


@pytest.fixture
def gated_one() -> Iterator[tuple[Pods, LoadGate]]:
    yield from _gated(1)


def _gated(n: int) -> Iterator[tuple[Pods, LoadGate]]:
    gate = LoadGate()
    with emulated(n) as pods:
        for handle in pods.fleet.handles:
            handle.app.add_middleware(_GateLoads, pod=handle.name, gate=gate)
        yield pods, gate


def _timed(router: Router) -> Timer:
    """The router's timer made the test's (what the holds are measured by)."""
    timer = Timer()
    router.timer = timer
    return timer


def _retries(router: Router) -> float:
    return router.metrics.registry.get_sample_value(RETRIES) or 0.0


# --- three pods: the held planned pod is not tried ------------------------------------


def test_a_cold_request_skips_the_held_planned_pod_on_its_first_attempt(
    gated: tuple[Pods, LoadGate],
) -> None:
    pods, gate = gated
    gate.refusals["pod-0"] = (503, "3600")  # held MAX_LOAD_HOLD_S
    plan = plan_of({model: ["pod-0"] for model in MODELS})
    with router_for(pods.domain, plan=plan, catalog=catalog_of(MODELS)) as running:
        _timed(running.router)
        client = running.client()
        assert client.completions.create(model="alpha", prompt="p", max_tokens=1).choices
        assert _retries(running.router) == 1  # the pod's own 503: a real attempt
        for model in ("beta", "gamma"):
            assert client.completions.create(model=model, prompt="p", max_tokens=1).choices
        assert _retries(running.router) == 1  # the hold cost beta and gamma nothing
    assert gate.asked["pod-0"] == 1
    assert pods.fleet.pod("pod-0").counters["requests"] == 0


def test_one_failed_fallback_leaves_the_third_pod_not_a_502(
    gated: tuple[Pods, LoadGate],
) -> None:
    pods, gate = gated
    gate.refusals["pod-0"] = (503, "3600")
    plan = plan_of({model: ["pod-0"] for model in MODELS})
    with router_for(pods.domain, plan=plan, catalog=catalog_of(MODELS)) as running:
        _timed(running.router)
        client = running.client()
        assert client.completions.create(model="alpha", prompt="p", max_tokens=1).choices
        [first] = set(gate.asked) - {"pod-0"}  # where alpha was loaded and served
        # Now that pod fails every load (no Retry-After: no hold).
        gate.refusals[first] = (500, None)
        for model in ("beta", "gamma"):
            assert client.completions.create(model=model, prompt="p", max_tokens=1).choices
        # Each retry is a pod that failed a load the router sent it, none the hold's.
        failures = gate.asked[first] - 1  # alpha's load there went through
        assert _retries(running.router) == 1 + failures
    [third] = {"pod-1", "pod-2"} - {first}
    assert pods.fleet.pod(third).counters["requests"] == 2  # beta's and gamma's
    assert gate.asked["pod-0"] == 1


# --- one pod: 503 naming the hold, Retry-After its remaining seconds -------------------


def _post(url: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "p", "max_tokens": 1}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=10.0)


def test_a_one_pod_pool_answers_503_naming_the_hold_with_its_wait(
    gated_one: tuple[Pods, LoadGate],
) -> None:
    pods, gate = gated_one
    with router_for(pods.domain, catalog=catalog_of(MODELS)) as running:
        timer = _timed(running.router)
        assert _post(running.url, "gamma").status_code == 200  # loaded before the hold
        gate.refusals["pod-0"] = (503, "20")
        refused = _post(running.url, "alpha")  # the pod's own 503 begins the hold
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "20"
        message = refused.json()["error"]["message"]
        assert "pod-0 for 20.0 s more" in message and "Retry-After" in message
        timer.now_s += 12.5
        held = _post(running.url, "beta")
        assert held.status_code == 503
        assert held.headers["retry-after"] == "8"  # 7.5 s left, rounded up
        assert "pod-0 for 7.5 s more" in held.json()["error"]["message"]
        assert _retries(running.router) == 1  # alpha's one attempt, beta none
        assert _post(running.url, "gamma").status_code == 200  # held, not for gamma
        assert gate.asked["pod-0"] == 2  # gamma's load, alpha's: beta's was never sent
        timer.now_s += 7.5  # the hold is over
        del gate.refusals["pod-0"]
        assert _post(running.url, "beta").status_code == 200
    assert gate.asked["pod-0"] == 3


def test_the_hold_is_a_503_with_its_wait_at_least_one_second(
    gated_one: tuple[Pods, LoadGate],
) -> None:
    pods, gate = gated_one
    with router_for(pods.domain, catalog=catalog_of(MODELS)) as running:
        timer = _timed(running.router)
        gate.refusals["pod-0"] = (429, "2")
        assert _post(running.url, "alpha").headers["retry-after"] == "2"
        timer.now_s += 1.95
        held = _post(running.url, "beta")
        assert (held.status_code, held.headers["retry-after"]) == (503, "1")


# --- through the endpoint picker ----------------------------------------------------


def _immediate(outcome: Any) -> tuple[int, dict[str, bytes], str]:
    response = outcome.immediate
    headers = {h.header.key: h.header.raw_value for h in response.headers.set_headers}
    return response.status.code, headers, json.loads(response.body)["error"]["message"]


def test_the_endpoint_picker_skips_the_held_planned_pod(
    gated: tuple[Pods, LoadGate],
) -> None:
    pods, gate = gated
    gate.refusals["pod-0"] = (503, "3600")
    plan = plan_of({model: ["pod-0"] for model in MODELS})
    with picker_for(pods.domain, plan=plan, catalog=catalog_of(MODELS)) as picking:
        _timed(picking.router)
        assert picking.send(completion("alpha")).status == 200
        assert picking.metric(RETRIES) == 1
        outcomes = [picking.send(completion(model)) for model in ("beta", "gamma")]
        assert picking.metric(RETRIES) == 1
    assert [o.status for o in outcomes] == [200, 200]
    assert endpoint(pods, "pod-0") not in {o.endpoints[0] for o in outcomes}
    assert gate.asked["pod-0"] == 1


def test_the_endpoint_picker_answers_503_naming_the_hold(
    gated_one: tuple[Pods, LoadGate],
) -> None:
    pods, gate = gated_one
    with picker_for(pods.domain, catalog=catalog_of(MODELS)) as picking:
        timer = _timed(picking.router)
        gate.refusals["pod-0"] = (503, "20")
        status, headers, message = _immediate(picking.send(completion("alpha")))
        assert (status, headers["retry-after"]) == (503, b"20")
        timer.now_s += 12.5
        status, headers, message = _immediate(picking.send(completion("beta")))
        assert (status, headers["retry-after"]) == (503, b"8")
        assert "pod-0 for 7.5 s more" in message
        assert picking.metric(RETRIES) == 1
    assert gate.asked["pod-0"] == 1


# --- which held pods a request is kept from: only those it would send a load ---------


async def _load_refused(router: Router, state: LivePod, adapter: AdapterId) -> None:
    with pytest.raises(RetryableEngineError):
        await router.load(state, adapter)


@pytest.mark.anyio
async def test_a_held_pod_loading_or_holding_the_adapter_is_not_held_for_it() -> None:
    """At ``ColdLoads.held_for``, over ``httpx.MockTransport``: a pod held while it loads
    alpha (its load waits on an event) and holds gamma stays a candidate for both, and
    for the base model; it is held for beta until the wait is over."""
    release = asyncio.Event()

    async def pod(request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["lora_name"]
        if name == ALPHA:
            await release.wait()
        if name in (ALPHA, GAMMA):
            return httpx.Response(200, text="Success")
        return httpx.Response(503, text="busy", headers={"Retry-After": "20"})

    upstream = Upstream(
        pod=PodId("pod-0"),
        pool=PoolId("llama"),
        url="http://pod-0.test",
        engine=Engine.VLLM,
        served_model="llama",
        max_loras=4,
        max_cpu_loras=8,
    )
    timer = Timer()
    sources = {name: f"s3://a/{name}" for name in (ALPHA, BETA, GAMMA)}
    async with httpx.AsyncClient(transport=httpx.MockTransport(pod)) as http:
        router = Router(
            plan_source=StaticPlanSource(None),
            pod_source=OnePod(upstream),
            engine_http=http,
            timer=timer,
            adapters=AdapterInfo(sources=sources),
            registry=CollectorRegistry(),
        )
        await router.refresh_pods()
        state = router.topology.pods[upstream.pod]
        await router.load(state, GAMMA)
        loading = asyncio.create_task(router.load(state, ALPHA))
        await asyncio.sleep(0)  # one turn: the load has begun and is waited on
        assert ALPHA in state.loading
        await _load_refused(router, state, BETA)  # the pod's 503 begins the hold
        held_for = router.cold_loads.held_for
        topology = router.topology
        assert held_for(topology, BETA) == {"pod-0": 20.0}
        assert held_for(topology, ALPHA) == {}  # loading it: its requests wait on that
        assert held_for(topology, GAMMA) == {}  # holds it: no load is sent
        assert held_for(topology, AdapterId("llama")) == {}  # the base model: no load
        timer.now_s += 20.0
        assert held_for(topology, BETA) == {}
        assert router.cold_loads.holds() == {}
        release.set()
        await loading
        assert state.ledger.is_listed(ALPHA)
