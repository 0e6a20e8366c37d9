"""The demo's traffic: a window of the log at its real density, its events on the demo's
clock, events signed as the webhook checks them, and the first request after an event."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
import openai
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from placement.controller.webhook import create_webhook_app
from placement.demo.measure import first_after_events
from placement.demo.traffic import (
    EventShot,
    Shot,
    Webhook,
    _send,
    events_in,
    select,
    send_event,
)
from placement.domain import AdapterId, Load, PodId, TenantId, Warmup
from placement.forecast.event_preloads import Event, EventDecision, EventKind
from placement.settings import ControllerSettings

START = datetime(2026, 3, 12, 19, 0, tzinfo=UTC)
SECRET = b"a-demo-secret-of-at-least-32-bytes!!"


def _log(offsets_s: list[float], **columns: list[object]) -> pd.DataFrame:
    ts = [pd.Timestamp(START) + pd.Timedelta(seconds=s) for s in offsets_s]
    return pd.DataFrame({"ts": pd.to_datetime(ts, utc=True), **columns})


def test_every_request_of_the_window_keeps_its_time_at_real_density() -> None:
    frame = _log(
        [-1.0, 0.0, 0.25, 0.5, 30.0, 59.9, 60.0],
        adapter=["a", "b", "c", "d", "e", "f", "g"],
        tenant=["t"] * 7,
        prompt_tokens=[10] * 7,
        output_tokens=[2] * 7,
        event_id=[None, "pipeline-1", None, None, None, None, None],
    )
    end = START + timedelta(seconds=60)
    shots = select(frame, start=START, end=end, speed=1.0, rng=np.random.default_rng(1))
    assert [s.adapter for s in shots] == ["b", "c", "d", "e", "f"]
    assert [s.at_s for s in shots] == pytest.approx([0.0, 0.25, 0.5, 30.0, 59.9])
    assert [s.event_id for s in shots] == ["pipeline-1", "", "", "", ""]


def test_a_budget_thins_the_window_and_a_speed_compresses_it() -> None:
    frame = _log([float(s) for s in range(100)], adapter=[f"a{s}" for s in range(100)])
    end = START + timedelta(seconds=100)
    shots = select(
        frame, start=START, end=end, speed=10.0, rng=np.random.default_rng(1), max_requests=20
    )
    assert len(shots) == 20
    assert all(0.0 <= s.at_s < 10.0 for s in shots)
    assert [s.at_s for s in shots] == sorted(s.at_s for s in shots)


def test_events_of_the_window_go_on_the_demos_clock() -> None:
    frame = _log(
        [-5.0, 2.0, 8.0],
        kind=["login", "pipeline", "login"],
        trigger=[None, "document.uploaded", None],
        tenant=["tenant-03", "tenant-05", "tenant-03"],
        event_id=["login-1", "pipeline-2", "login-3"],
    )
    events = events_in(frame, start=START, end=START + timedelta(seconds=10), speed=2.0)
    assert events == [
        EventShot(
            at_s=1.0,
            kind="pipeline",
            tenant="tenant-05",
            event_id="pipeline-2",
            trigger="document.uploaded",
        ),
        EventShot(at_s=4.0, kind="login", tenant="tenant-03", event_id="login-3"),
    ]
    assert events[1].body() == {"type": "login", "tenant": "tenant-03", "id": "login-3"}


class _Sink:
    """The controller's side: a login preloads its tenant's adapter on pod-1."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def accepting(self) -> bool:
        return True

    async def submit(self, event: Event) -> EventDecision:
        self.events.append(event)
        adapter, pod = AdapterId("code-reviewer-xl"), PodId("pod-1")
        return EventDecision(
            actions=(
                Load(pod=pod, adapter=adapter, reason="login"),
                Warmup(pod=pod, adapter=adapter, reason="login"),
            ),
            skipped={AdapterId("customer-support-es"): "already hot on pod-0"},
        )


def _webhook(sink: _Sink) -> httpx.AsyncClient:
    app = create_webhook_app(
        sink,
        secret=SECRET,
        settings=ControllerSettings(),
        clock=time.time,
        registry=CollectorRegistry(),
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://controller")


@pytest.mark.anyio
async def test_an_event_reaches_the_webhook_signed_and_its_preloads_come_back() -> None:
    sink = _Sink()
    login = EventShot(at_s=0.0, kind="login", tenant="tenant-03", event_id="login-000041")
    async with _webhook(sink) as http:
        answer = await send_event(
            http, Webhook(url="http://controller/v1/events", secret=SECRET), login
        )
    assert answer.status == 202
    assert answer.preloads == ("pod-1/code-reviewer-xl",)
    assert answer.skipped == {"customer-support-es": "already hot on pod-0"}
    assert sink.events == [
        Event(kind=EventKind.LOGIN, id="login-000041", tenant=TenantId("tenant-03"))
    ]


@pytest.mark.anyio
async def test_a_wrong_secret_is_refused_and_reported_as_such() -> None:
    sink = _Sink()
    login = EventShot(at_s=0.0, kind="login", tenant="tenant-03", event_id="login-1")
    wrong = Webhook(url="http://controller/v1/events", secret=b"another-secret-of-32-bytes-or-more")
    async with _webhook(sink) as http:
        answer = await send_event(http, wrong, login)
    assert (answer.status, answer.preloads, sink.events) == (401, (), [])


def _shot(at_s: float, adapter: str, tenant: str, event_id: str = "") -> Shot:
    return Shot(
        at_s=at_s,
        adapter=adapter,
        tenant=tenant,
        prompt_tokens=1,
        output_tokens=1,
        event_id=event_id,
    )


@pytest.mark.anyio
async def test_a_connection_closed_unanswered_is_counted_with_its_cause() -> None:
    """A router that reads the request and hangs up: the demo names the client's error
    and its cause, so a closed connection reads apart from a refused one."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    try:
        result = await _send(client, _shot(0.0, "a1", "tenant-01"), 0.0)
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
    assert not result.ok
    assert result.error == "APIConnectionError (RemoteProtocolError)"


def test_the_first_request_after_an_event_is_read_from_the_routers_log() -> None:
    shots = [
        _shot(1.0, "doc-classifier-v2", "tenant-05", "pipeline-1"),
        _shot(3.0, "doc-classifier-v2", "tenant-05", "pipeline-1"),  # not the first
        _shot(4.0, "legal-extract-v3", "tenant-06", "pipeline-1"),
        _shot(5.0, "code-reviewer-xl", "tenant-03", "login-1"),
        _shot(6.0, "never-logged", "tenant-03", "login-1"),
    ]
    log = _log(
        [0.5, 1.02, 3.0, 4.01, 5.01],
        adapter=[
            "doc-classifier-v2",  # an earlier request, before the event's
            "doc-classifier-v2",
            "doc-classifier-v2",
            "legal-extract-v3",
            "code-reviewer-xl",
        ],
        tenant=["tenant-05", "tenant-05", "tenant-05", "tenant-06", "tenant-03"],
        outcome=["cold_load", "gpu_hit", "cold_load", "cold_load", "gpu_hit"],
    )
    assert first_after_events(log, shots, start=START, speed=1.0) == (3, 2)
