"""A request's end at the wire releases the entry it ran on, as the engine does.

One emulated vLLM pod (2 GPU slots) behind the router; the pod holds each streamed
completion whose prompt names a gate until the test opens it. Request 1 streams on
c's entry; c is unloaded on the pod (its entry keeps its slot: a vLLM ghost), so
request 2 for c is refused (404), the router loads c again (a second entry) and sends
it there. Request 2 ends first. The engine releases c's new entry and touches it last;
a load of d then evicts it (the ghost runs request 1). The router's ledger must say
the same: released by name, the end let go of the old entry instead and touched that.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Callable, MutableMapping
from typing import Any

from placement.domain import PodId
from placement.router.live_pods import LivePod

from .conftest import Running, catalog_of, emulated, router_for


class Gates:
    """ASGI middleware state on the pods: answered completions (200) whose prompt is a
    gate's name wait before their first body byte until the test opens that gate."""

    def __init__(self) -> None:
        self.arrived: dict[str, threading.Event] = {}
        self._open: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._lock = threading.Lock()

    def expect(self, name: str) -> threading.Event:
        with self._lock:
            return self.arrived.setdefault(name, threading.Event())

    async def hold(self, name: str) -> None:
        gate = asyncio.Event()
        with self._lock:
            self._open[name] = (asyncio.get_running_loop(), gate)
        self.expect(name).set()
        await gate.wait()

    def open(self, name: str) -> None:
        with self._lock:
            loop, gate = self._open[name]
        loop.call_soon_threadsafe(gate.set)


class _Gated:
    def __init__(self, app: Any, *, gates: Gates) -> None:
        self.app, self.gates = app, gates

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("completions"):
            await self.app(scope, receive, send)
            return
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        prompt = json.loads(b"".join(m.get("body", b"") for m in messages)).get("prompt")
        gated = isinstance(prompt, str) and prompt.startswith("gate-")
        replay = list(messages)

        async def replaying() -> Any:
            return replay.pop(0) if replay else await receive()

        held = False
        status = 0

        async def holding(message: MutableMapping[str, Any]) -> None:
            nonlocal held, status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif gated and not held and status == 200:  # not a refusal (404)
                held = True
                await self.gates.hold(prompt)
            await send(message)

        await self.app(scope, replaying, holding)


def _stream(running: Running, prompt: str, out: list[str]) -> threading.Thread:
    def read() -> None:
        chunks = running.client().completions.create(
            model="c", prompt=prompt, max_tokens=2, stream=True
        )
        out.extend(chunk.choices[0].text for chunk in chunks if chunk.choices)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _until(running: Running, done: Callable[[], bool]) -> None:
    """On the router's loop, until ``done`` holds (turns of the loop, no clock)."""

    async def wait() -> None:
        async with asyncio.timeout(10):
            while not done():
                await asyncio.sleep(0)

    running.served.call(wait())


def _post(url: str, payload: dict[str, str]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        answer.read()


def test_an_end_releases_the_entry_its_request_ran_on_not_the_names_oldest() -> None:
    gates = Gates()
    with emulated(1, max_loras=2, max_cpu_loras=8) as pods:
        pods.fleet.handles[0].app.add_middleware(_Gated, gates=gates)
        with router_for(pods.domain, catalog=catalog_of(["c", "d"])) as running:
            state: LivePod = running.router.topology.pods[PodId("pod-0")]
            first: list[str] = []
            one = _stream(running, "gate-1", first)
            assert gates.expect("gate-1").wait(10), "request 1 reached the pod"
            _post(f"{pods.url('pod-0')}/v1/unload_lora_adapter", {"lora_name": "c"})
            second: list[str] = []
            two = _stream(running, "gate-2", second)
            assert gates.expect("gate-2").wait(10), "request 2 reached the pod, reloaded"
            assert pods.stats("pod-0")["ghosts"] == 1
            gates.open("gate-2")
            two.join(10)
            _until(running, lambda: state.inflight == 1)
            assert second, "request 2 was answered"
            # d's load: the engine evicts c's new, idle entry; the ghost runs request 1.
            answer = running.client().completions.create(model="d", prompt="p", max_tokens=1)
            assert answer.choices[0].text
            stats = pods.stats("pod-0")
            assert stats["gpu"] == ["d"] and stats["ghosts"] == 1
            assert state.ledger.active() == ("d",), "the router's ledger is the engine's"
            assert state.ledger.residency.ghosts_on_gpu() == 1
            gates.open("gate-1")
            one.join(10)
            _until(running, lambda: state.inflight == 0)
            assert first, "request 1 was answered"
            assert not state.busy
