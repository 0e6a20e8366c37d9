"""A ``Process`` call's decision on the picker's own server, started by hand where the
body's frame is read: what it raises or what cancels it under it ends the call with a
status, the connection serves on, and what it sets in a ContextVar stays its own."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from placement.router.picker_calls import PROCESS, ProcessCall
from placement.router.picker_h2 import Call, GrpcH2Server
from placement.router.picker_hpack import literal
from placement.router.picker_messages import RoutedAnswers, _Stream

from .test_endpoint_picker_h2_rules import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
    Wire,
    block,
    frame,
    message,
)

SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="")


class _Decided(_Stream):
    """The decision twin: ``decide`` in place of the router's (no router behind it)."""

    def __init__(self, decide: Callable[[], Any]) -> None:
        super().__init__(None, RoutedAnswers())  # type: ignore[arg-type]  # no router: decide answers
        self.decide = decide

    async def body(self, chunk: Any) -> list[Any]:
        return list(await self.decide())


def _call(decide: Callable[[], Any]) -> Callable[[Call], ProcessCall]:
    def process(call: Call) -> ProcessCall:
        handler = ProcessCall(call, None, RoutedAnswers())  # type: ignore[arg-type]  # no router, as above
        handler.stream = _Decided(decide)
        return handler

    return process


def _trailers(stream_id: int, wire: Wire) -> list[bytes]:
    return [
        payload
        for kind, flags, sid, payload in wire.frames()
        if kind == HEADERS and flags & END_STREAM and sid == stream_id
    ]


def _streams(decide: Callable[[], Any], count: int, *, between: Any = None) -> Wire:
    """``count`` Process calls in turn on one connection, each one body chunk and the
    client's end; ``between`` (a coroutine function) runs after each call's frames."""
    chunk = ext_proc.ProcessingRequest(
        request_body=ext_proc.HttpBody(body=b"{}", end_of_stream=True)
    ).SerializeToString()
    fields = (
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PROCESS),
        ("content-type", "application/grpc"),
    )

    async def run() -> Wire:
        server = GrpcH2Server({PROCESS: _call(decide)}, max_message_bytes=1 << 20)
        connection, wire = server.protocol(), Wire()
        connection.connection_made(wire)
        connection.data_received(PREFACE + frame(SETTINGS, 0, 0))
        for i in range(count):
            sid = 2 * i + 1
            connection.data_received(
                frame(HEADERS, END_HEADERS, sid, block(*fields))
                + frame(DATA, END_STREAM, sid, message(chunk))
            )
            if between is not None:
                await between()
            for _ in range(3):
                await asyncio.sleep(0)
        connection.flush()
        return wire

    return asyncio.run(run())


def test_a_decision_cancelled_at_once_ends_its_call_cancelled_and_the_connection_serves_on() -> (
    None
):
    async def decide() -> list[Any]:
        gone = asyncio.get_running_loop().create_future()
        gone.cancel()
        await gone  # a load's future cancelled before this request came
        return []

    wire = _streams(decide, 2)
    for sid in (1, 3):
        [trailers] = _trailers(sid, wire)
        assert literal(b"grpc-status", b"1") in trailers
    assert not wire.closed


def test_a_decision_whose_wait_is_cancelled_under_it_ends_its_call_cancelled() -> None:
    waits: list[asyncio.Future[None]] = []

    async def decide() -> list[Any]:
        waits.append(asyncio.get_running_loop().create_future())
        await waits[-1]  # a load, cancelled by someone else (not the call's task)
        return []

    async def cancel_it() -> None:
        await asyncio.sleep(0)
        waits[-1].cancel()

    wire = _streams(decide, 1, between=cancel_it)
    [trailers] = _trailers(1, wire)
    assert literal(b"grpc-status", b"1") in trailers


@pytest.mark.parametrize("waits", [False, True], ids=["at-once", "after-a-wait"])
def test_what_a_decision_sets_in_a_context_var_stays_its_own(waits: bool) -> None:
    seen: list[str] = []

    async def decide() -> list[Any]:
        seen.append(SEEN.get())
        SEEN.set("set by a decision")
        if waits:
            await asyncio.sleep(0)
        return []

    _streams(decide, 2)
    assert seen == ["", ""]
