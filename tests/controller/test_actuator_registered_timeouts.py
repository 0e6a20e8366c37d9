"""``EngineActuator.registered`` (the preload and watchdog ticks' listing) and
``EngineActuator.apply`` (the plan and watchdog ticks', under the actuation lock) do not
retry a timeout: every pod is listed together and the tick's work waits for all of them, so a
hung pod retried ``LIST_ATTEMPTS`` times held every other pod's restore and preload
three client timeouts and the backoff between. A 5xx (with its Retry-After) and a
refused connection are still retried; ``apply``'s own listings still retry a timeout.

The hung pod is a socket that reads the request and never answers (``HungPod``); the
failing-once pod is ``tests.pods.wire_server`` answering 503 until the injected
``sleep`` is called. The client's timeout (``per_action_deadline_s``) is 2 s where a
served pod shares it: its thread may answer late on a loaded box, and the hung pod costs
one timeout only; 0.2 s where the hung pod is alone and is timed out every attempt.
"""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from placement.actuation.apply import LIST_ATTEMPTS, make_clients, observe
from placement.actuation.executor import Status
from placement.actuation.ledger import Ledger
from placement.controller.live_ports import EngineActuator
from placement.domain import AdapterId, PodId
from placement.settings import ExecutorSettings, Settings
from tests.factories import adapter, catalog, fleet, make_plan, pool
from tests.pods.wire_server import Answer, WireServer
from tests.ports import refusing_port

pytestmark = pytest.mark.anyio

MODELS = "GET /v1/models"
TIMEOUT_S = 2.0
#: For the hung pod alone (nothing there can answer late), timed out LIST_ATTEMPTS times.
HUNG_TIMEOUT_S = 0.2
SETTINGS = Settings(
    executor=ExecutorSettings(
        backoff_base_s=0.2, backoff_max_s=5.0, per_action_deadline_s=TIMEOUT_S
    )
)
LISTING = {
    "object": "list",
    "data": [
        {"id": "base", "object": "model", "root": "base", "parent": None},
        {"id": "a0", "object": "model", "root": "/adapters/a0", "parent": "base"},
    ],
}


class HungPod:
    """Accepts each connection, reads the request line, and never answers; ``seen``
    has the request lines. Its connections are closed at ``stop``."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by stop
                return
            self._conns.append(conn)
            data = b""
            while b"\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            line = data.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if len(line) >= 2:
                self.seen.append(f"{line[0]} {line[1]}")

    def stop(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        for conn in self._conns:
            conn.close()


@pytest.fixture
def hung() -> Iterator[HungPod]:
    pod = HungPod()
    yield pod
    pod.stop()


@pytest.fixture
def flaky() -> Iterator[WireServer]:
    """503 with a Retry-After of 2 s until the actuator's ``sleep`` is called."""
    wire = WireServer().start()
    wire.answers[MODELS] = Answer(
        status=503, body=b"busy", headers=(("Content-Type", "text/plain"), ("Retry-After", "2"))
    )
    yield wire
    wire.stop()


async def test_a_hung_pod_costs_one_timeout_and_a_failing_one_is_still_retried(
    hung: HungPod, flaky: WireServer
) -> None:
    slept: list[float] = []

    async def sleep(delay_s: float) -> None:
        slept.append(delay_s)
        flaky.answers[MODELS] = Answer(body=json.dumps(LISTING).encode())

    pods = fleet(pool("llama", 2, served_model="base", urls=[hung.url, flaky.url]))
    async with httpx.AsyncClient() as http:
        actuator = EngineActuator(
            catalog=catalog(), http=http, settings=SETTINGS, rng=random.Random(7), sleep=sleep
        )
        present = await actuator.registered(pods)
    assert dict(present) == {
        PodId("llama-0"): None,
        PodId("llama-1"): frozenset({AdapterId("a0")}),
    }
    assert hung.seen == [MODELS]  # one try: before, LIST_ATTEMPTS of them
    assert flaky.seen == [MODELS, MODELS]
    assert slept == [2.0]  # the flaky pod's Retry-After; none for the hung one


async def test_a_refused_connection_is_still_retried() -> None:
    slept: list[float] = []

    async def sleep(delay_s: float) -> None:
        slept.append(delay_s)

    with refusing_port() as port:
        pods = fleet(pool("llama", 1, served_model="base", urls=[f"http://127.0.0.1:{port}"]))
        async with httpx.AsyncClient() as http:
            actuator = EngineActuator(
                catalog=catalog(), http=http, settings=SETTINGS, rng=random.Random(7), sleep=sleep
            )
            present = await actuator.registered(pods)
    assert dict(present) == {PodId("llama-0"): None}
    assert len(slept) == LIST_ATTEMPTS - 1


async def test_apply_s_own_listing_still_retries_a_timeout(hung: HungPod) -> None:
    async def sleep(delay_s: float) -> None:
        pass

    pods = fleet(pool("llama", 1, served_model="base", urls=[hung.url]))
    async with httpx.AsyncClient() as http:
        observation = await observe(
            pods,
            make_clients(pods, http=http, timeout_s=HUNG_TIMEOUT_S),
            settings=SETTINGS.executor,
            rng=random.Random(7),
            sleep=sleep,
        )
    assert f"after {LIST_ATTEMPTS} attempts" in observation.unreachable[PodId("llama-0")]
    assert hung.seen == [MODELS] * LIST_ATTEMPTS


async def test_the_plan_tick_s_apply_costs_one_timeout_for_a_hung_pod_and_loads_the_rest(
    hung: HungPod, flaky: WireServer
) -> None:
    """The plan tick lists while it holds the actuation lock the webhook's preloads wait
    on: before, a hung pod held it LIST_ATTEMPTS timeouts and the backoff between."""
    slept: list[float] = []

    async def sleep(delay_s: float) -> None:
        slept.append(delay_s)
        flaky.answers[MODELS] = Answer(body=json.dumps(LISTING).encode())

    flaky.answers["POST /v1/load_lora_adapter"] = Answer(
        body=b"Success", headers=(("Content-Type", "text/plain"),)
    )
    flaky.answers["POST /v1/completions"] = Answer(body=b"{}")  # a warm-up's answer
    pods = fleet(pool("llama", 2, served_model="base", urls=[hung.url, flaky.url]))
    plan = make_plan({"llama-0": ("a0",), "llama-1": ("a0", "a1")})
    async with httpx.AsyncClient() as http:
        actuator = EngineActuator(
            catalog=catalog(adapter("a0"), adapter("a1")),
            http=http,
            settings=SETTINGS,
            rng=random.Random(7),
            sleep=sleep,
        )
        report = await actuator.apply(plan, fleet=pods, ledger=Ledger())
    assert hung.seen == [MODELS]  # one try: before, LIST_ATTEMPTS of them
    assert flaky.seen[:2] == [MODELS, MODELS]
    assert "POST /v1/load_lora_adapter" in flaky.seen
    assert report.ok, report.failed
    done = {(r.action.pod, r.action.adapter) for r in report.results if r.status is Status.DONE}
    assert (PodId("llama-1"), AdapterId("a1")) in done
    assert {r.action.pod for r in report.results} == {PodId("llama-1")}
    assert slept[0] == 2.0
