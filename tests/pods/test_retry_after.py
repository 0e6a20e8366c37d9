"""A pod's ``Retry-After``: read at the wire, carried by the error, honoured by the executor.

The engine clients read RFC 9110's two forms (delta-seconds, an HTTP-date) into
``RetryableEngineError.retry_after_s`` and name what they cannot read without honouring
it; the executor waits at least that long before its next attempt, capped at
``ExecutorSettings.backoff_max_s``. The header crosses a real socket
(``tests.pods.wire_server``); the executor's ``sleep`` and ``rng`` are injected, so
nothing here waits on the wall clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime

import pytest

from placement.actuation.executor import Executor, Status, backoff_s
from placement.adapters.http_engine import retry_after_s
from placement.adapters.sglang import SglangClient
from placement.adapters.vllm import VllmClient
from placement.domain import AdapterId, Engine, Load, PodId
from placement.errors import EngineError, RetryableEngineError
from placement.settings import ExecutorSettings
from tests.pods.wire_server import Answer, WireServer, text

pytestmark = pytest.mark.anyio

TIMEOUT_S = 2.0
POD = PodId("pod-7")
#: RFC 9110's example date is "Sun, 06 Nov 1994 08:49:37 GMT": now is 7 s before it.
NOW_S = datetime(1994, 11, 6, 8, 49, 30, tzinfo=UTC).timestamp()
IMF_DATE = "Sun, 06 Nov 1994 08:49:37 GMT"
SEED = 7
PATHS = {
    Engine.VLLM: ("POST /v1/load_lora_adapter", "POST /v1/unload_lora_adapter"),
    Engine.SGLANG: ("POST /load_lora_adapter", "POST /unload_lora_adapter"),
}


# --- reading the header: RFC 9110 section 10.2.3 ------------------------------------------

READINGS = [
    pytest.param("0", 0.0, id="zero"),
    pytest.param("5", 5.0, id="delta-seconds"),
    pytest.param(" 5 ", 5.0, id="delta-seconds-with-spaces"),
    pytest.param("120", 120.0, id="two-minutes"),
    pytest.param("86400", 86400.0, id="a-day-is-the-most"),
    pytest.param("86401", None, id="over-a-day-absurd"),
    pytest.param("9" * 40, None, id="forty-digits-absurd"),
    pytest.param("-1", None, id="negative"),
    pytest.param("5.5", None, id="fraction"),
    pytest.param("1e3", None, id="exponent"),
    pytest.param("+5", None, id="signed"),
    pytest.param("\uff15", None, id="fullwidth-digit"),
    pytest.param("soon", None, id="words"),
    pytest.param("", None, id="empty"),
    pytest.param(IMF_DATE, 7.0, id="imf-date"),
    pytest.param("Sunday, 06-Nov-94 08:49:37 GMT", 7.0, id="rfc850-date"),
    pytest.param("Sun Nov  6 08:49:37 1994", 7.0, id="asctime-date-is-gmt"),
    pytest.param("Sun, 06 Nov 1994 08:49:37 -0000", 7.0, id="no-zone-is-gmt"),
    pytest.param("Sun, 06 Nov 1994 08:49:00 GMT", 0.0, id="date-past-is-now"),
    pytest.param("Thu, 01 Jan 1970 00:00:00 GMT", 0.0, id="epoch-is-now"),
    pytest.param("Mon, 06 Nov 1995 08:49:37 GMT", None, id="date-a-year-ahead-absurd"),
    pytest.param("Sun, 31 Feb 1994 08:49:37 GMT", None, id="no-such-day"),
    pytest.param("Sun, 06 Nov 1994 08:49:37 +2500", None, id="no-such-zone"),
    pytest.param("Sun, 06 Foo 1994 08:49:37 GMT", None, id="no-such-month"),
]


@pytest.mark.parametrize(("value", "wait_s"), READINGS)
def test_a_retry_after_reads_as_a_wait_or_as_none(value: str, wait_s: float | None) -> None:
    assert retry_after_s(value, now_s=NOW_S) == wait_s


# --- at the wire: the clients carry the wait and still name the header ------------------


@pytest.fixture
def server() -> Iterator[WireServer]:
    wire = WireServer().start()
    yield wire
    wire.stop()


def client_for(server: WireServer, engine: Engine) -> VllmClient | SglangClient:
    kind: type[VllmClient | SglangClient] = SglangClient if engine is Engine.SGLANG else VllmClient
    return kind(
        POD, server.url, served_model_name="base", timeout_s=TIMEOUT_S, wall_clock=lambda: NOW_S
    )


def busy(status: int, after: str | None) -> Answer:
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "text/plain"),)
    if after is not None:
        headers += (("Retry-After", after),)
    return Answer(status=status, body=b"busy", headers=headers)


async def failure_of(client: VllmClient | SglangClient, key: str) -> RetryableEngineError:
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "GET /v1/models": client.registered,
        PATHS[Engine.VLLM][0]: lambda: client.load(AdapterId("a"), lora_path="/p"),
        PATHS[Engine.SGLANG][0]: lambda: client.load(AdapterId("a"), lora_path="/p"),
        PATHS[Engine.VLLM][1]: lambda: client.unload(AdapterId("a")),
        PATHS[Engine.SGLANG][1]: lambda: client.unload(AdapterId("a")),
    }
    try:
        with pytest.raises(RetryableEngineError) as caught:
            await calls[key]()
    finally:
        await client.aclose()
    return caught.value


ANSWERS = [
    pytest.param(
        Engine.VLLM,
        0,
        busy(503, "5"),
        5.0,
        "answered 503: busy (Retry-After: 5)",
        id="vllm-load-503",
    ),
    pytest.param(
        Engine.VLLM,
        1,
        busy(429, IMF_DATE),
        7.0,
        f"(Retry-After: {IMF_DATE})",
        id="vllm-unload-429-date",
    ),
    pytest.param(
        Engine.VLLM, 0, busy(503, "soon"), None, "busy (Retry-After: soon)", id="vllm-garbage-named"
    ),
    pytest.param(
        Engine.VLLM, 0, busy(503, "-3"), None, "busy (Retry-After: -3)", id="vllm-negative-named"
    ),
    pytest.param(Engine.VLLM, 0, busy(503, None), None, "answered 503: busy", id="vllm-no-header"),
    pytest.param(
        Engine.SGLANG,
        0,
        busy(503, "5"),
        5.0,
        "answered 503: busy (Retry-After: 5)",
        id="sglang-load-503",
    ),
    pytest.param(
        Engine.SGLANG,
        1,
        busy(429, "2"),
        2.0,
        "answered 429: busy (Retry-After: 2)",
        id="sglang-unload-429",
    ),
    pytest.param(
        Engine.SGLANG,
        0,
        busy(502, "soon"),
        None,
        "busy (Retry-After: soon)",
        id="sglang-garbage-named",
    ),
]


@pytest.mark.parametrize(("engine", "which", "answer", "wait_s", "said"), ANSWERS)
async def test_a_pods_retry_after_crosses_the_wire_into_the_error(
    server: WireServer,
    engine: Engine,
    which: int,
    answer: Answer,
    wait_s: float | None,
    said: str,
) -> None:
    key = PATHS[engine][which]
    server.answers[key] = answer
    failure = await failure_of(client_for(server, engine), key)
    assert (failure.retry_after_s, failure.pod, failure.status) == (wait_s, POD, answer.status)
    assert said in str(failure)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
async def test_a_listing_refused_with_retry_after_carries_it(
    server: WireServer, engine: Engine
) -> None:
    server.answers["GET /v1/models"] = busy(503, "3")
    failure = await failure_of(client_for(server, engine), "GET /v1/models")
    assert failure.retry_after_s == 3.0 and "(Retry-After: 3)" in str(failure)


# --- the executor waits what the pod asked, within its own cap --------------------------

JITTER_S = random.Random(SEED).uniform(0.0, 0.2)  # the first draw, attempt 1, base 0.2

WAITS = [
    pytest.param(Engine.VLLM, "5", 10.0, 5.0, id="vllm-delta-seconds"),
    pytest.param(Engine.SGLANG, "5", 10.0, 5.0, id="sglang-delta-seconds"),
    pytest.param(Engine.VLLM, IMF_DATE, 10.0, 7.0, id="http-date"),
    pytest.param(Engine.VLLM, "3600", 5.0, 5.0, id="an-hour-capped-at-backoff-max"),
    pytest.param(Engine.VLLM, "0", 10.0, JITTER_S, id="zero-leaves-the-jitter"),
    pytest.param(Engine.VLLM, "soon", 10.0, JITTER_S, id="garbage-leaves-the-jitter"),
    pytest.param(Engine.VLLM, None, 10.0, JITTER_S, id="no-header-leaves-the-jitter"),
]


@pytest.mark.parametrize(("engine", "after", "max_s", "waited_s"), WAITS)
async def test_the_executor_waits_at_least_the_pods_retry_after_before_the_retry(
    server: WireServer, engine: Engine, after: str | None, max_s: float, waited_s: float
) -> None:
    key = PATHS[engine][0]
    server.answers[key] = busy(503, after)
    slept: list[float] = []

    async def sleep(delay_s: float) -> None:  # the pod is ready by the time we retry
        slept.append(delay_s)
        server.answers[key] = text(200, "Success")

    client = client_for(server, engine)
    settings = ExecutorSettings(max_attempts=3, backoff_base_s=0.2, backoff_max_s=max_s)
    executor = Executor(
        {POD: client},
        lora_paths={AdapterId("a"): "/p"},
        settings=settings,
        rng=random.Random(SEED),
        sleep=sleep,
    )
    try:
        (result,) = (
            await executor.run((Load(pod=POD, adapter=AdapterId("a"), reason="t"),))
        ).results
    finally:
        await client.aclose()
    assert (result.status, result.attempts) == (Status.DONE, 2), result.detail
    assert slept == [waited_s]
    assert server.seen == [key, key]


# --- backoff_s itself --------------------------------------------------------------------

SETTINGS = ExecutorSettings(backoff_base_s=1.0, backoff_max_s=4.0)


@pytest.mark.parametrize(
    ("attempt", "after_s", "expected_s"),
    [
        pytest.param(1, None, random.Random(SEED).uniform(0.0, 1.0), id="none-is-the-jitter"),
        pytest.param(1, 0.0, random.Random(SEED).uniform(0.0, 1.0), id="zero-is-the-jitter"),
        pytest.param(1, math.nan, random.Random(SEED).uniform(0.0, 1.0), id="nan-is-the-jitter"),
        pytest.param(1, 3.0, 3.0, id="longer-than-the-jitter-wins"),
        pytest.param(3, 1e-6, random.Random(SEED).uniform(0.0, 4.0), id="shorter-jitter-wins"),
        pytest.param(1, 3600.0, 4.0, id="capped-at-backoff-max"),
        pytest.param(1, math.inf, 4.0, id="infinity-capped"),
    ],
)
def test_backoff_is_the_longer_of_the_jitter_and_the_capped_retry_after(
    attempt: int, after_s: float | None, expected_s: float
) -> None:
    got = backoff_s(attempt, settings=SETTINGS, rng=random.Random(SEED), retry_after_s=after_s)
    assert got == expected_s


def test_a_retry_after_does_not_shift_the_jitter_of_later_retries() -> None:
    plain, told = random.Random(SEED), random.Random(SEED)
    backoff_s(1, settings=SETTINGS, rng=plain)
    backoff_s(1, settings=SETTINGS, rng=told, retry_after_s=3.0)
    assert backoff_s(2, settings=SETTINGS, rng=plain) == backoff_s(2, settings=SETTINGS, rng=told)


def test_a_retryable_error_made_without_a_wait_has_none() -> None:
    error = RetryableEngineError("busy", pod="p", status=503)
    assert isinstance(error, EngineError) and error.retry_after_s is None
