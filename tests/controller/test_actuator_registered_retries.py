"""``EngineActuator.registered`` (the preload and watchdog ticks' listing of each pod)
retries a retryable failure as ``apply``'s listings do: up to ``LIST_ATTEMPTS`` tries,
the executor's backoff between them (at least the pod's Retry-After, capped), with the
actuator's own ``rng`` and ``sleep``. A permanent failure is not retried.

Each pod is ``tests.pods.wire_server`` over a real socket; the injected ``sleep`` lets
the pod come right between two tries, so nothing waits on the wall clock.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import httpx
import pytest

from placement.actuation.apply import LIST_ATTEMPTS
from placement.controller.live_ports import EngineActuator
from placement.domain import AdapterId, PodId
from placement.settings import ExecutorSettings, Settings
from tests.factories import catalog, fleet, pool
from tests.pods.wire_server import Answer, WireServer, text

pytestmark = pytest.mark.anyio

MODELS = "GET /v1/models"
LISTING = {
    "object": "list",
    "data": [
        {"id": "base", "object": "model", "root": "base", "parent": None},
        {"id": "a0", "object": "model", "root": "/adapters/a0", "parent": "base"},
    ],
}
SETTINGS = Settings(executor=ExecutorSettings(backoff_base_s=0.2, backoff_max_s=5.0))


@pytest.fixture
def server() -> Iterator[WireServer]:
    wire = WireServer().start()
    yield wire
    wire.stop()


def listed() -> Answer:
    return Answer(body=json.dumps(LISTING).encode())


async def _registered(
    server: WireServer, *, comes_right_after: int
) -> tuple[dict[PodId, frozenset[AdapterId] | None], list[float]]:
    """The pod answers 503 (Retry-After 2) until ``comes_right_after`` sleeps."""
    server.answers[MODELS] = Answer(
        status=503, body=b"busy", headers=(("Content-Type", "text/plain"), ("Retry-After", "2"))
    )
    slept: list[float] = []

    async def sleep(delay_s: float) -> None:
        slept.append(delay_s)
        if len(slept) >= comes_right_after:
            server.answers[MODELS] = listed()

    pods = fleet(pool("llama", 1, served_model="base", urls=[server.url]))
    async with httpx.AsyncClient() as http:
        actuator = EngineActuator(
            catalog=catalog(), http=http, settings=SETTINGS, rng=random.Random(7), sleep=sleep
        )
        present = await actuator.registered(pods)
    return dict(present), slept


async def test_a_pod_that_fails_once_then_answers_is_listed(server: WireServer) -> None:
    present, slept = await _registered(server, comes_right_after=1)
    assert present == {PodId("llama-0"): frozenset({AdapterId("a0")})}
    assert slept == [2.0]  # the pod's Retry-After, within backoff_max_s
    assert server.seen == [MODELS, MODELS]


async def test_a_pod_that_keeps_failing_is_none_after_the_listings_tries(
    server: WireServer,
) -> None:
    present, slept = await _registered(server, comes_right_after=LIST_ATTEMPTS + 1)
    assert present == {PodId("llama-0"): None}
    assert len(slept) == LIST_ATTEMPTS - 1
    assert server.seen == [MODELS] * LIST_ATTEMPTS


async def test_a_permanent_failure_is_not_retried(server: WireServer) -> None:
    server.answers[MODELS] = text(200, "not a model list")
    pods = fleet(pool("llama", 1, served_model="base", urls=[server.url]))
    slept: list[float] = []

    async def sleep(delay_s: float) -> None:
        slept.append(delay_s)

    async with httpx.AsyncClient() as http:
        actuator = EngineActuator(
            catalog=catalog(), http=http, settings=SETTINGS, rng=random.Random(7), sleep=sleep
        )
        present = await actuator.registered(pods)
    assert dict(present) == {PodId("llama-0"): None}
    assert (slept, server.seen) == ([], [MODELS])
