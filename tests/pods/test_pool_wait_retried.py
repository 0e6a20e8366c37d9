"""A call that waits for a free connection in the client's pool past its pool timeout
(httpx.PoolTimeout) is a plain ``RetryableEngineError``, not an ``EngineTimeoutError``:
the pod said nothing, the client's own pool was full (the controller's client keeps
httpx's default of 100 connections, so a fleet over 100 pods waits there), and the tick
listings, which do not retry a timeout, retry it. Connect and read timeouts stay
``EngineTimeoutError``.

A real pool of one connection over a real socket (``tests.pods.wire_server``): the one
connection is held by a streamed answer the test has not read, so the engine's call
waits in the pool (``httpx.MockTransport`` has no pool to wait in).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from placement.adapters.http_engine import HttpEngine
from placement.domain import PodId
from placement.errors import EngineTimeoutError, RetryableEngineError
from tests.pods.wire_server import Answer, WireServer

pytestmark = pytest.mark.anyio

TIMEOUT_S = 0.3
MODELS = "GET /v1/models"
LISTING = {"object": "list", "data": [{"id": "base", "object": "model", "root": "base"}]}


@pytest.fixture
def wire() -> Iterator[WireServer]:
    server = WireServer().start()
    server.answers[MODELS] = Answer(body=json.dumps(LISTING).encode())
    yield server
    server.stop()


async def test_a_call_that_waits_for_the_pool_past_its_timeout_is_retryable(
    wire: WireServer,
) -> None:
    limits = httpx.Limits(max_connections=1)
    async with httpx.AsyncClient(limits=limits) as http:
        engine = HttpEngine(PodId("pod-0"), wire.url, http=http, timeout_s=TIMEOUT_S)
        async with http.stream("GET", wire.url + "/v1/models"):  # holds the one connection
            with pytest.raises(RetryableEngineError) as caught:
                await engine.call("GET", "/v1/models")
        assert not isinstance(caught.value, EngineTimeoutError)
        assert caught.value.pod == PodId("pod-0")
        # With the connection back, the same call goes through.
        answer = await engine.call("GET", "/v1/models")
    assert answer.json() == LISTING
    assert wire.seen == [MODELS, MODELS]  # the waiting call never reached the pod
