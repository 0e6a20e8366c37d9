"""Replay a window of a request log, and its events, through the live endpoints.

``select`` takes the requests of a time window (all of them, at the log's own density,
unless a budget thins them at random; each keeps its adapter, tenant, token counts and
event id) and puts them on the demo's clock (``speed`` scenario seconds per wall
second: 1.0 is real time); ``events_in`` does the same for an event log's pipeline
steps and logins. ``drive`` sends the requests with the real ``openai`` client,
streaming, times the first token of each answer and how late each left against its
schedule (whether this machine kept up), and sends each event to the controller's
webhook at its time, signed as a sender would (``send_event``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import httpx
import numpy as np
import openai
import pandas as pd

from placement.controller.webhook_gate import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

_Item = TypeVar("_Item")

#: Prompts and answers are sent at the log's lengths (an emulated pod's prefill and
#: decode steps are timed by them, as the replay's are), capped at about the log's 99th
#: percentile of prompts (war story: 8,257 tokens) and above its longest answer (197).
MAX_PROMPT_WORDS = 8192
MAX_OUTPUT_TOKENS = 256
#: Requests in flight at once; beyond it a request waits (and counts as late).
CONCURRENCY = 512


@dataclass(frozen=True, kw_only=True)
class Shot:
    """One request to send ``at_s`` seconds after the replay starts."""

    at_s: float
    adapter: str
    tenant: str
    prompt_tokens: int
    output_tokens: int
    #: The event (pipeline run, login) the request follows, when the log says so.
    event_id: str = ""


@dataclass(frozen=True, kw_only=True)
class ShotResult:
    adapter: str
    ok: bool
    ttft_ms: float
    #: How long after its schedule the request left (the client or the machine behind).
    late_ms: float = 0.0
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class EventShot:
    """A pipeline step or a login, to deliver ``at_s`` seconds after the replay starts."""

    at_s: float
    kind: str
    tenant: str
    event_id: str
    trigger: str = ""

    def body(self) -> dict[str, str]:
        body = {"type": self.kind, "tenant": self.tenant, "id": self.event_id}
        return body | ({"trigger": self.trigger} if self.kind == "pipeline" else {})


@dataclass(frozen=True, kw_only=True)
class EventResult:
    """The webhook's answer to one event: its status, the preloads the controller decided
    (``pod/adapter``) and the adapters it left alone, with why."""

    event: EventShot
    status: int
    preloads: tuple[str, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)
    late_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Webhook:
    """Where the controller listens for events, and the secret it checks them with."""

    url: str
    secret: bytes
    #: The controller's own address (its ``/metrics``); "": not known.
    base: str = ""


def _offsets_s(times: pd.Series, start: datetime, speed: float) -> np.ndarray:
    return (times - pd.Timestamp(start)).dt.total_seconds().to_numpy() / speed


def _column(window: pd.DataFrame, name: str, default: object) -> pd.Series:
    return window[name] if name in window else pd.Series(default, index=window.index)


def select(
    frame: pd.DataFrame,
    *,
    start: datetime,
    end: datetime,
    speed: float,
    rng: np.random.Generator,
    max_requests: int | None = None,
) -> list[Shot]:
    """The requests of [start, end) on the demo's clock; all of them unless ``max_requests``
    thins them at random (keeping their order and relative timing)."""
    window = frame[(frame["ts"] >= start) & (frame["ts"] < end)]
    if max_requests is not None and len(window) > max_requests:
        keep = np.sort(rng.choice(len(window), size=max_requests, replace=False))
        window = window.iloc[keep]
    events = _column(window, "event_id", "").fillna("").astype(str)
    return [
        Shot(
            at_s=float(at),
            adapter=str(adapter),
            tenant=str(tenant),
            prompt_tokens=int(p),
            output_tokens=int(o),
            event_id=event,
        )
        for at, adapter, tenant, p, o, event in zip(
            _offsets_s(window["ts"], start, speed),
            window["adapter"].astype(str),
            _column(window, "tenant", "").astype(str),
            _column(window, "prompt_tokens", 64),
            _column(window, "output_tokens", 8),
            events,
            strict=True,
        )
    ]


def events_in(
    frame: pd.DataFrame, *, start: datetime, end: datetime, speed: float
) -> list[EventShot]:
    """An event log's pipeline steps and logins of [start, end), on the demo's clock."""
    window = frame[(frame["ts"] >= start) & (frame["ts"] < end)]
    triggers = _column(window, "trigger", "").fillna("").astype(str)
    return [
        EventShot(
            at_s=float(at), kind=str(kind), tenant=str(tenant), event_id=str(e), trigger=trigger
        )
        for at, kind, tenant, e, trigger in zip(
            _offsets_s(window["ts"], start, speed),
            window["kind"],
            window["tenant"],
            window["event_id"],
            triggers,
            strict=True,
        )
    ]


async def _send(client: openai.AsyncOpenAI, shot: Shot, late_ms: float) -> ShotResult:
    """One streamed chat completion; the first data line of the stream is the first token.
    The chunks are read raw, not parsed into objects: at the log's density the client's
    CPU is the machine's."""
    words = " ".join(["lorem"] * min(MAX_PROMPT_WORDS, max(1, shot.prompt_tokens)))
    began = time.perf_counter()
    try:
        async with client.chat.completions.with_streaming_response.create(
            model=shot.adapter,
            messages=[{"role": "user", "content": words}],
            max_tokens=min(MAX_OUTPUT_TOKENS, max(1, shot.output_tokens)),
            stream=True,
            user=shot.tenant or openai.omit,
        ) as response:
            first_ms: float | None = None
            async for line in response.iter_lines():
                if first_ms is None and line.startswith("data:"):
                    first_ms = (time.perf_counter() - began) * 1000
        return ShotResult(adapter=shot.adapter, ok=True, ttft_ms=first_ms or 0.0, late_ms=late_ms)
    except openai.APIError as exc:
        return ShotResult(
            adapter=shot.adapter, ok=False, ttft_ms=0.0, late_ms=late_ms, error=_error_name(exc)
        )


def _error_name(exc: openai.APIError) -> str:
    """The error's type, with what caused it for a connection error (the client's HTTP
    error, e.g. ``APIConnectionError (RemoteProtocolError)``): that tells a connection
    the router closed from one it never accepted."""
    cause = exc.__cause__
    if isinstance(exc, openai.APIConnectionError) and cause is not None:
        return f"{type(exc).__name__} ({type(cause).__name__})"
    return type(exc).__name__


async def send_event(
    http: httpx.AsyncClient, webhook: Webhook, event: EventShot, *, late_ms: float = 0.0
) -> EventResult:
    """POST one event to the webhook, signed with the shared secret at the wall's time."""
    body = json.dumps(event.body()).encode()
    stamp = str(int(time.time()))
    headers = {
        "content-type": "application/json",
        TIMESTAMP_HEADER: stamp,
        SIGNATURE_HEADER: sign(webhook.secret, timestamp=stamp, body=body),
    }
    try:
        response = await http.post(webhook.url, content=body, headers=headers)
    except httpx.HTTPError:
        return EventResult(event=event, status=0, late_ms=late_ms)
    answer = response.json() if response.status_code in (200, 202) else {}
    preloads = (f"{p['pod']}/{p['adapter']}" for p in answer.get("preloads", ()))
    return EventResult(
        event=event,
        status=response.status_code,
        preloads=tuple(dict.fromkeys(preloads)),
        skipped={str(k): str(v) for k, v in answer.get("skipped", {}).items()},
        late_ms=late_ms,
    )


@dataclass(frozen=True, kw_only=True)
class Mark:
    """Something to do once, ``at_s`` seconds into the replay (a snapshot of counters)."""

    at_s: float
    action: Callable[[], Awaitable[None]]


async def _at_times(
    items: Sequence[_Item],
    at_s: Callable[[_Item], float],
    started: float,
    start_one: Callable[[_Item, float], None],
) -> None:
    """Call ``start_one(item, late_ms)`` for each item at its time on the loop's clock."""
    loop = asyncio.get_running_loop()
    for item in items:
        delay = started + at_s(item) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        start_one(item, max(0.0, loop.time() - started - at_s(item)) * 1000)


async def drive(
    shots: Sequence[Shot],
    *,
    base_url: str,
    events: Sequence[EventShot] = (),
    webhook: Webhook | None = None,
    marks: Sequence[Mark] = (),
    concurrency: int = CONCURRENCY,
    on_done: Callable[[ShotResult], None] | None = None,
    origin_s: float | None = None,
) -> tuple[list[ShotResult], list[EventResult]]:
    """Send every shot (and, with a webhook, every event) at its time; collect results.

    ``origin_s`` (epoch seconds, the router's clock origin) is the moment the times count
    from, so that the traffic keeps to the router's clock when the router started late
    (the first shots are then late); None: from now."""
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key="lorafleet-demo", max_retries=0, timeout=60.0
    )
    gate = asyncio.Semaphore(concurrency)
    results: list[ShotResult] = []
    answers: list[EventResult] = []
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()

    async def one(shot: Shot, late_ms: float) -> None:
        queued = loop.time()
        async with gate:
            late_ms += (loop.time() - queued) * 1000
            result = await _send(client, shot, late_ms)
        results.append(result)
        if on_done is not None:
            on_done(result)

    async def deliver(http: httpx.AsyncClient, event: EventShot, late_ms: float) -> None:
        assert webhook is not None
        answers.append(await send_event(http, webhook, event, late_ms=late_ms))

    def spawn(work: Awaitable[None]) -> None:
        tasks.append(asyncio.ensure_future(work))

    async with client, httpx.AsyncClient(timeout=30.0) as http:
        started = loop.time()
        if origin_s is not None:
            started += origin_s - time.time()
        timelines = [
            _at_times(shots, lambda s: s.at_s, started, lambda s, late: spawn(one(s, late))),
            _at_times(marks, lambda m: m.at_s, started, lambda m, _late: spawn(m.action())),
        ]
        if webhook is not None:
            timelines.append(
                _at_times(
                    events, lambda e: e.at_s, started, lambda e, late: spawn(deliver(http, e, late))
                )
            )
        await asyncio.gather(*timelines)
        await asyncio.gather(*tasks)
    return results, answers
