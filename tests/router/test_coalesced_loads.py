"""Coalesced cold loads that end without an answer from the pod: every waiter hears how
the load ended, and the pod's loads are empty again (the next request loads afresh).

The pod is an ``httpx.MockTransport`` behind the router's engine client: it holds a
load until the test lets it go, fails it with an error that is no engine's, cancels the
load's own task (the transport runs in it), or is never reached (the router stopped
before the load's first step). The router is driven at its interface
(``Router.load``, ``Router.stop``), as the proxy and the endpoint picker drive it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
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

POD = Upstream(
    pod=PodId("pod-0"),
    pool=PoolId("llama"),
    url="http://pod-0.test",
    engine=Engine.VLLM,
    served_model="llama",
    max_loras=2,
    max_cpu_loras=4,
)
ALPHA = AdapterId("alpha")

Answer = Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]


class OnePod:
    """The pod source: ``POD`` alone."""

    description = "one pod"

    async def upstreams(self) -> tuple[Upstream, ...]:
        return (POD,)


async def _router(answer: Answer) -> tuple[Router, LivePod, CollectorRegistry]:
    registry = CollectorRegistry()
    router = Router(
        plan_source=StaticPlanSource(None),
        pod_source=OnePod(),
        engine_http=httpx.AsyncClient(transport=httpx.MockTransport(answer)),
        adapters=AdapterInfo(sources={ALPHA: "s3://adapters/alpha"}),
        registry=registry,
    )
    await router.refresh_pods()
    return router, router.topology.pods[POD.pod], registry


async def _settled(tasks: Iterable[asyncio.Task[None]]) -> list[BaseException | None]:
    """What each task ended with, after letting the loop run a bounded number of turns
    (no clock): a task still waiting then is a waiter that heard nothing."""
    tasks = list(tasks)
    for _ in range(100):
        if all(task.done() for task in tasks):
            break
        await asyncio.sleep(0)
    undone = [task for task in tasks if not task.done()]
    for task in undone:
        task.cancel()
    assert not undone, f"{len(undone)} of {len(tasks)} waiters heard nothing of the load"
    return [task.exception() for task in tasks]


def _depth(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("lorafleet_load_queue_depth", {"pod": POD.pod})


@pytest.mark.anyio
async def test_a_router_stopped_mid_load_tells_every_waiter() -> None:
    arrived, release = asyncio.Event(), asyncio.Event()

    async def held(request: httpx.Request) -> httpx.Response:
        arrived.set()
        await release.wait()
        return httpx.Response(200)

    router, state, registry = await _router(held)
    try:
        waiters = [asyncio.create_task(router.load(state, ALPHA)) for _ in range(3)]
        await arrived.wait()
        await router.stop()
        outcomes = await _settled(waiters)
    finally:
        release.set()
    for outcome in outcomes:
        assert isinstance(outcome, RetryableEngineError)
        assert "pod-0" in str(outcome) and "alpha" in str(outcome) and "cancelled" in str(outcome)
    assert _depth(registry) == 0


async def _fails(request: httpx.Request) -> httpx.Response:
    raise RuntimeError("a fault that is no engine's")


async def _cancels_itself(request: httpx.Request) -> httpx.Response:
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    await asyncio.sleep(0)
    return httpx.Response(200)


@pytest.mark.parametrize(
    ("answer", "heard"),
    [(_fails, "RuntimeError: a fault that is no engine's"), (_cancels_itself, "cancelled")],
    ids=["error-not-an-engines", "task-cancelled"],
)
@pytest.mark.anyio
async def test_a_load_ended_without_an_answer_tells_every_waiter_and_the_next_loads_afresh(
    answer: Answer, heard: str
) -> None:
    answers = [answer]

    async def then_loaded(request: httpx.Request) -> httpx.Response:
        return await answers.pop(0)(request) if answers else httpx.Response(200)

    router, state, registry = await _router(then_loaded)
    waiters = [asyncio.create_task(router.load(state, ALPHA)) for _ in range(3)]
    for outcome in await _settled(waiters):
        assert isinstance(outcome, RetryableEngineError)
        assert "pod-0" in str(outcome) and "alpha" in str(outcome) and heard in str(outcome)
    assert _depth(registry) == 0
    # Nothing of the failed load is left: the next request's load goes to the pod.
    await router.load(state, ALPHA)
    assert state.ledger.is_listed(ALPHA)
    await router.stop()


@pytest.mark.anyio
async def test_a_load_cancelled_before_it_reached_the_pod_tells_its_waiter_and_leaves() -> None:
    reached: list[str] = []

    async def loaded(request: httpx.Request) -> httpx.Response:
        reached.append(request.url.path)
        return httpx.Response(200)

    router, state, registry = await _router(loaded)
    waiter = asyncio.create_task(router.load(state, ALPHA))
    await asyncio.sleep(0)  # the waiter's first step: the load's task made, not yet run
    await router.stop()
    [outcome] = await _settled([waiter])
    assert isinstance(outcome, RetryableEngineError) and "cancelled" in str(outcome)
    assert reached == [] and _depth(registry) == 0
    # The load left the pod's loads: the next request loads afresh, and is answered.
    await router.load(state, ALPHA)
    assert reached == ["/v1/load_lora_adapter"]
