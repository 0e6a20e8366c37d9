"""A ``Retry-After`` sent twice: honoured when every value reads to the same wait.

RFC 9110 makes the header a singleton, but a proxy that repeats it means one wait. It
comes as one value joined with commas (``"5, 5"``, as httpx's ``get`` and aiohttp's
``get`` join it) or as several (``get_list``, ``getall``); an HTTP-date's own comma
does not split it. Values that differ, or one that cannot be read, give no wait (None),
as an unreadable header does. At the wire the pod answers the header twice over a real
socket (``tests.pods.wire_server``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime

import pytest

from placement.actuation.executor import Executor, Status
from placement.adapters.http_engine import retry_after_s
from placement.adapters.vllm import VllmClient
from placement.domain import AdapterId, Load, PodId
from placement.errors import RetryableEngineError
from placement.settings import ExecutorSettings
from tests.pods.wire_server import Answer, WireServer, text

pytestmark = pytest.mark.anyio

POD = PodId("pod-7")
#: RFC 9110's example date is "Sun, 06 Nov 1994 08:49:37 GMT": now is 7 s before it.
NOW_S = datetime(1994, 11, 6, 8, 49, 30, tzinfo=UTC).timestamp()
IMF = "Sun, 06 Nov 1994 08:49:37 GMT"
RFC850 = "Sunday, 06-Nov-94 08:49:37 GMT"
ASCTIME = "Sun Nov  6 08:49:37 1994"
LOAD = "POST /v1/load_lora_adapter"

READINGS = [
    pytest.param("5, 5", 5.0, id="joined-same-delta"),
    pytest.param("5,5", 5.0, id="joined-no-space"),
    pytest.param("5, 5, 5", 5.0, id="joined-three-times"),
    pytest.param("5,", 5.0, id="an-empty-piece-is-no-value"),
    pytest.param("5, 6", None, id="joined-differing"),
    pytest.param("5, soon", None, id="joined-one-unreadable"),
    pytest.param(f"{IMF}, {IMF}", 7.0, id="joined-same-imf-date"),
    pytest.param(f"{RFC850}, {RFC850}", 7.0, id="joined-same-rfc850-date"),
    pytest.param(f"{ASCTIME}, {ASCTIME}", 7.0, id="joined-same-asctime-date"),
    pytest.param(f"{IMF}, 7", 7.0, id="a-date-and-the-same-seconds"),
    pytest.param(f"{IMF}, 5", None, id="a-date-and-other-seconds"),
    pytest.param(IMF, 7.0, id="one-date-is-not-split"),
    pytest.param(["5", "5"], 5.0, id="two-values-same"),
    pytest.param([IMF, IMF], 7.0, id="two-date-values-same"),
    pytest.param(["5", "6"], None, id="two-values-differing"),
    pytest.param(["5, 5", "5"], 5.0, id="values-themselves-joined"),
    pytest.param(["5", "86401"], None, id="one-absurd"),
    pytest.param([], None, id="no-values"),
    pytest.param(["5", ""], 5.0, id="an-empty-second-line-is-no-value"),
    pytest.param(["", " "], None, id="only-empty-values"),
]


@pytest.mark.parametrize(("value", "wait_s"), READINGS)
def test_a_doubled_retry_after_reads_as_one_wait_only_when_every_value_agrees(
    value: str | Sequence[str], wait_s: float | None
) -> None:
    assert retry_after_s(value, now_s=NOW_S) == wait_s


@pytest.fixture
def server() -> Iterator[WireServer]:
    wire = WireServer().start()
    yield wire
    wire.stop()


def doubled(*afters: str) -> Answer:
    headers = (("Content-Type", "text/plain"), *(("Retry-After", after) for after in afters))
    return Answer(status=503, body=b"busy", headers=headers)


WIRE = [
    pytest.param(("5", "5"), 5.0, "(Retry-After: 5, 5)", id="same-seconds"),
    pytest.param((IMF, IMF), 7.0, f"(Retry-After: {IMF}, {IMF})", id="same-date"),
    pytest.param(("5", "6"), None, "(Retry-After: 5, 6)", id="differing-named-not-honoured"),
]


@pytest.mark.parametrize(("afters", "wait_s", "said"), WIRE)
async def test_a_pod_answering_the_header_twice_carries_one_wait_into_the_error(
    server: WireServer, afters: tuple[str, ...], wait_s: float | None, said: str
) -> None:
    server.answers[LOAD] = doubled(*afters)
    client = VllmClient(POD, server.url, served_model_name="base", wall_clock=lambda: NOW_S)
    try:
        with pytest.raises(RetryableEngineError) as caught:
            await client.load(AdapterId("a"), lora_path="/p")
    finally:
        await client.aclose()
    assert caught.value.retry_after_s == wait_s
    assert said in str(caught.value)


async def test_the_executor_waits_a_doubled_retry_after(server: WireServer) -> None:
    server.answers[LOAD] = doubled("5", "5")
    slept: list[float] = []

    async def sleep(delay_s: float) -> None:  # the pod is ready by the time we retry
        slept.append(delay_s)
        server.answers[LOAD] = text(200, "Success")

    client = VllmClient(POD, server.url, served_model_name="base", wall_clock=lambda: NOW_S)
    settings = ExecutorSettings(max_attempts=3, backoff_base_s=0.2, backoff_max_s=10.0)
    executor = Executor(
        {POD: client},
        lora_paths={AdapterId("a"): "/p"},
        settings=settings,
        rng=random.Random(7),
        sleep=sleep,
    )
    try:
        (result,) = (
            await executor.run((Load(pod=POD, adapter=AdapterId("a"), reason="t"),))
        ).results
    finally:
        await client.aclose()
    assert (result.status, result.attempts) == (Status.DONE, 2), result.detail
    assert slept == [5.0]
