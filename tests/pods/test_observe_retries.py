"""Listing the pods (``apply.observe``): a failed listing waits before its next try.

A listing that fails retryably is tried up to ``LIST_ATTEMPTS`` times, waiting what the
executor's retries wait (``backoff_s`` under the settings in force: full jitter, at least
the pod's ``Retry-After``, capped at ``backoff_max_s``), with the ``sleep`` and ``rng``
the caller passes; each pod waits on its own. An unreachable pod says its last error and
how many tries were made. The pods are ``tests.pods.wire_server`` over a real socket, a
refusing one a port held bound and not listening (``tests.ports.refusing_port``); the
sleep is injected (it flips a busy pod to ready), so nothing waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator

import httpx
import pytest

from placement.actuation.apply import LIST_ATTEMPTS, apply_plan, make_clients, observe
from placement.domain import Fleet, PodId
from placement.settings import ExecutorSettings
from tests.factories import adapter, catalog, fleet, make_plan, pool
from tests.pods.wire_server import Answer, WireServer
from tests.ports import is_held, refusing_port

pytestmark = pytest.mark.anyio

MODELS = "GET /v1/models"
TIMEOUT_S = 2.0
SEED = 7
#: Only a guard against a hang when the listings are not concurrent; a passing run
#: never waits on it.
HANG_GUARD_S = 10.0
BASE_CARD = {"id": "base", "object": "model", "root": "/models/base", "parent": None}
LISTING = Answer(
    body=json.dumps(
        {
            "object": "list",
            "data": [BASE_CARD, {"id": "a", "root": "s3://x/a", "parent": "base"}],
        }
    ).encode()
)
SETTINGS = ExecutorSettings(backoff_base_s=0.2, backoff_max_s=10.0)


def busy(after: str | None) -> Answer:
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "text/plain"),)
    if after is not None:
        headers += (("Retry-After", after),)
    return Answer(status=503, body=b"busy", headers=headers)


def draws(*caps_s: float) -> list[float]:
    """The jitter ``backoff_s`` draws first from ``random.Random(SEED)``, per cap."""
    rng = random.Random(SEED)
    return [rng.uniform(0.0, cap_s) for cap_s in caps_s]


@pytest.fixture
def server() -> Iterator[WireServer]:
    wire = WireServer().start()
    yield wire
    wire.stop()


def one_pod(server: WireServer) -> Fleet:
    return fleet(pool("p", 1, urls=[server.url]))


class Recorder:
    """An injected sleep: keeps each wait and, when ``ready`` is set, makes the pod
    ``server`` answer it from then on, as a pod back up by the retry does."""

    def __init__(self, server: WireServer | None = None, ready: Answer | None = None) -> None:
        self.slept: list[float] = []
        self._server, self._ready = server, ready

    async def __call__(self, delay_s: float) -> None:
        self.slept.append(delay_s)
        if self._server is not None and self._ready is not None:
            self._server.answers[MODELS] = self._ready


# --- a pod busy once is listed after the wait it asked for ------------------------------

ONCE = [
    pytest.param("3", SETTINGS, [3.0], id="retry-after-honoured"),
    pytest.param(None, SETTINGS, draws(0.2), id="no-header-is-the-jitter"),
    pytest.param("soon", SETTINGS, draws(0.2), id="unreadable-header-is-the-jitter"),
    pytest.param(
        "3600",
        ExecutorSettings(backoff_base_s=0.2, backoff_max_s=5.0),
        [5.0],
        id="an-hour-capped-at-backoff-max",
    ),
]


@pytest.mark.parametrize(("after", "settings", "waited_s"), ONCE)
async def test_a_pod_busy_once_is_listed_after_waiting_as_the_executor_would(
    server: WireServer, after: str | None, settings: ExecutorSettings, waited_s: list[float]
) -> None:
    server.answers[MODELS] = busy(after)
    sleep = Recorder(server, LISTING)
    one = one_pod(server)
    async with httpx.AsyncClient() as http:
        seen = await observe(
            one,
            make_clients(one, http=http, timeout_s=TIMEOUT_S),
            settings=settings,
            rng=random.Random(SEED),
            sleep=sleep,
        )
    assert not seen.unreachable, seen.unreachable
    assert seen.states[PodId("p-0")].registered == {"a"}
    assert sleep.slept == waited_s
    assert server.seen == [MODELS, MODELS]


# --- a pod that never answers is unreachable: its last error and the tries --------------


async def test_a_pod_always_busy_is_unreachable_with_its_error_and_the_tries(
    server: WireServer,
) -> None:
    server.answers[MODELS] = busy("2")
    sleep = Recorder()
    one = one_pod(server)
    async with httpx.AsyncClient() as http:
        seen = await observe(
            one,
            make_clients(one, http=http, timeout_s=TIMEOUT_S),
            settings=SETTINGS,
            rng=random.Random(SEED),
            sleep=sleep,
        )
    why = seen.unreachable[PodId("p-0")]
    assert "GET /v1/models answered 503: busy (Retry-After: 2)" in why
    assert f"after {LIST_ATTEMPTS} attempts" in why
    assert sleep.slept == [2.0] * (LIST_ATTEMPTS - 1)
    assert server.seen == [MODELS] * LIST_ATTEMPTS


async def test_a_pod_refusing_connections_waits_the_growing_jitter_between_tries() -> None:
    with refusing_port() as port:
        assert is_held(port)  # a server that would take it (SO_REUSEADDR) cannot
        one = fleet(pool("p", 1, urls=[f"http://127.0.0.1:{port}"]))
        sleep = Recorder()
        async with httpx.AsyncClient() as http:
            seen = await observe(
                one,
                make_clients(one, http=http, timeout_s=TIMEOUT_S),
                settings=SETTINGS,
                rng=random.Random(SEED),
                sleep=sleep,
            )
    why = seen.unreachable[PodId("p-0")]
    assert "ConnectError" in why and f"after {LIST_ATTEMPTS} attempts" in why, why
    assert sleep.slept == draws(*(0.2 * 2**i for i in range(LIST_ATTEMPTS - 1)))


async def test_a_listing_refused_for_good_is_not_retried_and_says_so(server: WireServer) -> None:
    server.answers[MODELS] = Answer(body=json.dumps({"object": "list", "data": None}).encode())
    sleep = Recorder()
    one = one_pod(server)
    async with httpx.AsyncClient() as http:
        seen = await observe(
            one,
            make_clients(one, http=http, timeout_s=TIMEOUT_S),
            settings=SETTINGS,
            rng=random.Random(SEED),
            sleep=sleep,
        )
    why = seen.unreachable[PodId("p-0")]
    assert '"data" is a JSON null' in why and "after 1 attempt; not retryable" in why
    assert sleep.slept == []
    assert server.seen == [MODELS]


# --- one pod's waits do not hold up the others ------------------------------------------


async def test_the_other_pods_are_listed_while_a_busy_pod_waits() -> None:
    """The busy pod comes first; its wait lasts until the ready pod has answered, which
    it can only do if its listing is not queued behind the busy pod's retries."""
    busy_pod, ready_pod = WireServer().start(), WireServer().start()
    busy_pod.answers[MODELS] = busy("4")
    ready_pod.answers[MODELS] = LISTING
    ready_answered = asyncio.Event()
    slept: list[tuple[float, bool]] = []

    async def on_response(response: httpx.Response) -> None:
        if str(response.request.url).startswith(ready_pod.url):
            ready_answered.set()

    async def sleep(delay_s: float) -> None:
        slept.append((delay_s, ready_answered.is_set()))
        await asyncio.wait_for(ready_answered.wait(), HANG_GUARD_S)

    two = fleet(pool("p", 2, urls=[busy_pod.url, ready_pod.url]))
    try:
        async with httpx.AsyncClient(event_hooks={"response": [on_response]}) as http:
            seen = await observe(
                two,
                make_clients(two, http=http, timeout_s=TIMEOUT_S),
                settings=SETTINGS,
                rng=random.Random(SEED),
                sleep=sleep,
            )
    finally:
        busy_pod.stop()
        ready_pod.stop()
    assert seen.states[PodId("p-1")].registered == {"a"}
    assert f"after {LIST_ATTEMPTS} attempts" in seen.unreachable[PodId("p-0")]
    assert [delay_s for delay_s, _ in slept] == [4.0] * (LIST_ATTEMPTS - 1)
    assert ready_pod.seen == [MODELS] and busy_pod.seen == [MODELS] * LIST_ATTEMPTS


# --- apply_plan times the listing with the executor's own settings, rng and sleep -------


async def test_apply_plan_lists_a_busy_pod_with_the_sleep_and_settings_it_was_given(
    server: WireServer,
) -> None:
    server.answers[MODELS] = busy("3")
    sleep = Recorder(server, LISTING)
    one = one_pod(server)
    async with httpx.AsyncClient() as http:
        outcome = await apply_plan(
            make_plan({"p-0": ["a"]}),
            fleet=one,
            catalog=catalog(adapter("a", base="base", source="s3://x/a")),
            clients=make_clients(one, http=http, timeout_s=TIMEOUT_S),
            settings=SETTINGS,
            rng=random.Random(SEED),
            sleep=sleep,
        )
    assert not outcome.observation.unreachable, outcome.observation.unreachable
    assert outcome.observation.states[PodId("p-0")].registered == {"a"}
    assert sleep.slept[:1] == [3.0]
    assert server.seen[:2] == [MODELS, MODELS]
