"""Emulated pods on real sockets and a router in front of them, for the router's tests.

The router's loops never fire during a test (``MANUAL``): a test that needs a scrape
or a plan poll calls the round itself (``Running.scrape``, ``Running.refresh_plan``),
and waits on events (``Answers.wait``), never on the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from openai import OpenAI
from prometheus_client import CollectorRegistry

from placement.clock import Clock
from placement.domain import Adapter, AdapterId, Catalog, Engine, Fleet, PodId, Tier
from placement.emulator import (
    EmulatedFleet,
    PodConfig,
    listening_sockets,
    ports_of,
    serving_in_thread,
)
from placement.plan import AdapterPlan, Plan, PodPlan
from placement.router import MemoryRequestLog, Router, RouterApp, build_router
from placement.router.sources import PlanSource
from placement.router.wiring import ServedApp
from placement.settings import RouterSettings, Settings

#: An hour between rounds of every loop: within a test, only the test runs them.
MANUAL = Settings(
    router=RouterSettings(
        scrape_interval_s=3600.0,
        plan_poll_s=3600.0,
        pods_poll_s=3600.0,
        log_flush_s=3600.0,
        listing_every_scrapes=4,
    )
)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One HTTP/1.1 request off ``reader`` as a fake pod reads it: its head and its
    Content-Length body (none without the header)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    return head, await reader.readexactly(length)


def catalog_of(names: Sequence[str], *, base: str = "base-model") -> Catalog:
    return Catalog(
        adapters=tuple(
            Adapter(
                name=AdapterId(name),
                base_model=base,
                rank=8,
                alpha=8.0,
                target_modules=("q_proj", "v_proj"),
                dtype="float16",
                source=f"s3://adapters/{name}",
                size_bytes=50_000_000,
            )
            for name in names
        )
    )


def plan_of(hot: dict[str, list[str]], *, plan_id: str = "plan-1") -> Plan:
    """A plan with ``{adapter: [pods]}`` hot, equal weights."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    pods: dict[PodId, list[AdapterId]] = {}
    adapters = {}
    for name, owners in hot.items():
        share = 1.0 / len(owners)
        adapters[AdapterId(name)] = AdapterPlan(
            tier=Tier.HOT, pods=MappingProxyType({PodId(p): share for p in owners})
        )
        for pod in owners:
            pods.setdefault(PodId(pod), []).append(AdapterId(name))
    return Plan(
        id=plan_id,
        created_at=now,
        valid_from=now,
        valid_until=now + timedelta(hours=1),
        pods=MappingProxyType({p: PodPlan(hot=tuple(a)) for p, a in pods.items()}),
        adapters=MappingProxyType(adapters),
    )


@dataclass(frozen=True, slots=True)
class Answer:
    """One completion request an emulated pod finished (or gave up on)."""

    pod: str
    path: str
    #: The pod sent its whole answer; False when the caller went away first.
    complete: bool


class Answers:
    """The completion requests the pods finished, in order, for tests to wait on."""

    def __init__(self) -> None:
        self._answers: list[Answer] = []
        self._changed = threading.Condition()

    def add(self, answer: Answer) -> None:
        with self._changed:
            self._answers.append(answer)
            self._changed.notify_all()

    def __len__(self) -> int:
        with self._changed:
            return len(self._answers)

    def wait(self, count: int, *, timeout_s: float = 10.0) -> list[Answer]:
        """The first ``count`` answers, once the pods have finished that many."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._answers) >= count, timeout_s):
                raise AssertionError(f"the pods finished {len(self._answers)} of {count}")
            return self._answers[:count]


class MetricsOverride:
    """What some pods answer on ``/metrics`` instead of their own text: a test sets
    ``texts[pod]`` (a pod that says ``NaN``), and deletes it to give the pod back."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}


class _OverrideMetrics:
    """ASGI middleware on an emulated pod: ``/metrics`` answers ``MetricsOverride``'s text."""

    def __init__(self, app: Any, *, pod: str, override: MetricsOverride) -> None:
        self.app, self.pod, self.override = app, pod, override

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        text = self.override.texts.get(self.pod)
        if scope["type"] != "http" or scope["path"] != "/metrics" or text is None:
            await self.app(scope, receive, send)
            return
        body = text.encode()
        headers = [(b"content-type", b"text/plain; version=0.0.4"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _NoteAnswers:
    """ASGI middleware on an emulated pod: each completion request it finishes is noted."""

    def __init__(self, app: Any, *, pod: str, answers: Answers) -> None:
        self.app, self.pod, self.answers = app, pod, answers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("completions"):
            await self.app(scope, receive, send)
            return
        finished = False

        async def noting(message: MutableMapping[str, Any]) -> None:
            nonlocal finished
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True

        try:
            await self.app(scope, receive, noting)
        finally:
            self.answers.add(Answer(pod=self.pod, path=scope["path"], complete=finished))


@dataclass
class Pods:
    fleet: EmulatedFleet
    domain: Fleet
    answers: Answers

    def stats(self, pod: str) -> dict[str, Any]:
        url = next(h.url for h in self.fleet.handles if h.name == pod)
        with urllib.request.urlopen(f"{url}/admin/stats", timeout=5) as answer:
            stats: dict[str, Any] = json.load(answer)
        return stats

    def counter(self, name: str) -> int:
        return sum(int(h.pod.counters[name]) for h in self.fleet.handles)

    def url(self, pod: str) -> str:
        return next(h.url for h in self.fleet.handles if h.name == pod)

    @property
    def urls(self) -> dict[str, str]:
        """Each pod's URL, by name (a fleet file's pods)."""
        return {h.name: h.url for h in self.fleet.handles}


@contextlib.contextmanager
def emulated(
    n: int,
    *,
    engine: Engine = Engine.VLLM,
    max_loras: int = 2,
    max_cpu_loras: int = 8,
    clock: Clock = time.monotonic,
    metrics_override: MetricsOverride | None = None,
    **extra: Any,
) -> Iterator[Pods]:
    """``n`` pods on real sockets; ``clock`` is the pods' own (their down windows);
    ``metrics_override`` lets a test replace what a pod answers on ``/metrics``."""
    config = replace(
        PodConfig(), engine=engine, max_loras=max_loras, max_cpu_loras=max_cpu_loras, **extra
    )
    sockets = listening_sockets(n)  # port 0: each pod's port is the kernel's pick, bound here
    fleet = EmulatedFleet.start(
        n, engine=engine, ports=ports_of(sockets), config=config, clock=clock
    )
    answers = Answers()
    for handle in fleet.handles:
        handle.app.add_middleware(_NoteAnswers, pod=handle.name, answers=answers)
        if metrics_override is not None:
            handle.app.add_middleware(_OverrideMetrics, pod=handle.name, override=metrics_override)
    with serving_in_thread(fleet.handles, sockets=sockets):
        yield Pods(fleet=fleet, domain=fleet.domain(), answers=answers)


@dataclass
class Running:
    app: RouterApp
    served: ServedApp
    log: MemoryRequestLog
    registry: CollectorRegistry

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def router(self) -> Router:
        return self.app.router

    def scrape(self) -> None:
        """One scrape round, as the scrape loop would run it, on the router's loop."""
        self.served.call(self.router.scrape_all())

    def refresh_plan(self) -> None:
        """One poll of the plan source, as the plan loop would run it."""
        self.served.call(self.router.refresh_plan())

    clients: list[OpenAI] = field(default_factory=list)

    def client(self, **kwargs: Any) -> OpenAI:
        made = OpenAI(base_url=f"{self.url}/v1", api_key="test", max_retries=0, **kwargs)
        self.clients.append(made)
        return made

    def close(self) -> None:
        for made in self.clients:
            made.close()

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as answer:
            body = answer.read()
        return json.loads(body) if path != "/metrics" else body.decode()


@contextlib.contextmanager
def router_for(
    fleet: Fleet,
    *,
    plan: Plan | str | Path | PlanSource | None = None,
    catalog: Catalog | None = None,
    settings: Settings = MANUAL,
) -> Iterator[Running]:
    log = MemoryRequestLog()
    registry = CollectorRegistry()
    app = build_router(
        fleet=fleet,
        plan=plan,
        catalog=catalog,
        settings=settings,
        registry=registry,
        request_log=log,
    )
    with ServedApp(app) as served:
        running = Running(app=app, served=served, log=log, registry=registry)
        try:
            yield running
        finally:
            running.close()


class Ticker:
    """The router's loops' ``sleep`` in a test: each loop waits for the next ``tick``.

    ``tick`` lets every sleeping loop run one round and returns once ``loops`` of them
    sleep again (a loop that ended never does). ``delays`` has each loop's waits, by
    the loop's name, so backoff shows as it would have been slept.
    """

    def __init__(self) -> None:
        self.delays: dict[str, list[float]] = {}
        self._generation = 0
        self._wake: dict[int, asyncio.Event] = {}
        self._sleeping: dict[int, int] = {}

    async def sleep(self, delay_s: float) -> None:
        task = asyncio.current_task()
        name = task.get_name() if task is not None else "?"
        self.delays.setdefault(name, []).append(delay_s)
        generation = self._generation
        self._sleeping[generation] = self._sleeping.get(generation, 0) + 1
        await self._wake.setdefault(generation, asyncio.Event()).wait()

    async def settle(self, loops: int) -> None:
        """Until ``loops`` loops sleep in this generation (event-loop turns, no clock)."""
        for _ in range(100_000):
            if self._sleeping.get(self._generation, 0) >= loops:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"{self._sleeping.get(self._generation, 0)} of {loops} loops sleep")

    async def tick(self, loops: int) -> None:
        await self.settle(loops)
        woken = self._generation
        self._generation += 1
        self._wake.setdefault(woken, asyncio.Event()).set()
        await self.settle(loops)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
