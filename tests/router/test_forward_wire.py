"""The proxy's forwarding at the wire, through the router: a pod that answers what is not
HTTP, closes the connection before answering, or closes a kept-alive connection as the
router writes on it.

Pod 1 sits behind a splice on the router's own loop: every request reaches the
emulated pod unchanged, except completion requests, which get the test's script in
turn ("pass" to the pod, "garbage" back, or "close" the connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import pytest

from placement.domain import Fleet, PodId

from .conftest import (
    MANUAL,
    Pods,
    Running,
    catalog_of,
    emulated,
    plan_of,
    read_request,
    router_for,
)

GARBAGE = b"HTTX/1.1 200 OK\r\n\r\n"


@dataclass
class Splice:
    """Between the router and one emulated pod; scripts its completion requests."""

    host: str
    port: int
    script: list[str]
    connections: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        pod_reader, pod_writer = await asyncio.open_connection(self.host, self.port)
        back = asyncio.create_task(_pump(pod_reader, writer))
        self.tasks.add(back)
        try:
            while True:
                head, body = await read_request(reader)
                action = "pass"
                if head.startswith(b"POST /v1/completions "):
                    action = self.script.pop(0)
                if action == "close":
                    return
                if action == "garbage":
                    writer.write(GARBAGE)
                    await writer.drain()
                    return
                pod_writer.write(head + body)
                await pod_writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            back.cancel()
            pod_writer.close()
            writer.close()


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()


def _with_url(fleet: Fleet, pod: str, url: str) -> Fleet:
    pools = tuple(
        replace(pool, pods=tuple(replace(p, url=url) if p.name == pod else p for p in pool.pods))
        for pool in fleet.pools
    )
    return replace(fleet, pools=pools)


@contextlib.contextmanager
def spliced(pods: Pods, script: list[str]) -> Iterator[tuple[Fleet, Splice]]:
    """Pod 1 behind a splice serving on a loop of its own: the fleet that says so."""
    host, port = pods.url("pod-1").removeprefix("http://").split(":")
    splice = Splice(host=host, port=int(port), script=script)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    listening = asyncio.start_server(splice.handle, "127.0.0.1", 0)
    server = asyncio.run_coroutine_threadsafe(listening, loop).result(10)

    async def stop() -> None:
        server.close()
        for task in splice.tasks:
            task.cancel()
        await asyncio.gather(*splice.tasks, return_exceptions=True)

    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        yield _with_url(pods.domain, "pod-1", url), splice
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


#: "lora-a" is planned on pod 1 (behind the splice).
PLAN = plan_of({"lora-a": ["pod-1"]})


def _complete(running: Running) -> str:
    answer = running.client().completions.create(model="lora-a", prompt="p", max_tokens=1)
    return answer.choices[0].text


@pytest.mark.parametrize(
    ("action", "why"),
    [
        ("garbage", "UpstreamError: pod pod-1 answered malformed HTTP"),
        ("close", "UpstreamError: pod pod-1 closed the connection before answering"),
    ],
)
def test_a_pod_that_fails_before_answering_is_left_and_the_request_served_elsewhere(
    action: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with emulated(2) as pods, spliced(pods, [action]) as (fleet, _):
        with router_for(fleet, plan=PLAN, catalog=catalog_of(["lora-a"])) as running:
            with caplog.at_level(logging.WARNING, logger="lorafleet"):
                assert _complete(running)
            (answer,) = pods.answers.wait(1)
            assert answer.pod == "pod-0"
            assert not running.router.topology.pods[PodId("pod-1")].healthy
        assert f"pod pod-1 leaves the rotation: {why}" in caplog.text
        assert "Traceback" not in caplog.text
        (row,) = running.log.rows
        assert (row.status, row.pod) == (200, "pod-0")


def test_a_kept_alive_connection_the_pod_closed_is_retried_on_a_fresh_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A keep-alive far longer than any stall of a busy machine: the second request
    # must find the first one's connection still pooled, whatever time passed between.
    patient = replace(MANUAL, router=replace(MANUAL.router, upstream_keepalive_s=3600.0))
    with emulated(2) as pods, spliced(pods, ["pass", "close", "pass"]) as (fleet, splice):
        with router_for(
            fleet, plan=PLAN, catalog=catalog_of(["lora-a"]), settings=patient
        ) as running:
            with caplog.at_level(logging.WARNING, logger="lorafleet"):
                _complete(running)
                connections = splice.connections
                _complete(running)
            answers = pods.answers.wait(2)
            assert [a.pod for a in answers] == ["pod-1", "pod-1"]
            assert running.router.topology.pods[PodId("pod-1")].healthy
        assert "leaves the rotation" not in caplog.text
        assert splice.script == []  # the closed connection took the second try's request
        assert splice.connections == connections + 1  # and one fresh connection the retry
        assert [row.pod for row in running.log.rows] == ["pod-1", "pod-1"]
