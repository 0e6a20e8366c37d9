"""The endpoint picker's calls on its own HTTP/2 server (``router.picker_h2``): Envoy's
``ExternalProcessor.Process`` over ``router.picker_messages``'s ``_Stream``, and
``grpc.health.v1.Health`` over ``router.picker_health``'s verdicts.

A ``Process`` call runs as grpc.aio's handler did, message by message in the order the
gateway sent them: each message is parsed (Envoy's published ``ProcessingRequest``) and
answered where it arrives, on the loop, with no task. The body's end is decided there
too, its coroutine started by hand; only a decision that waits (a cold load, memory
pressure) goes on in a task (``resume``), and what arrives meanwhile waits its turn.
An unparsable message or one out of the protocol's order ends the call with
INVALID_ARGUMENT naming why; the stream's end (or a reset) finishes the request (its
log row).

Must not decide anything (``router.endpoint_picking``) nor know HTTP/2's framing.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2  # type: ignore[import-untyped]

from placement.router.core import Router
from placement.router.picker_h2 import (
    CANCELLED,
    INVALID_ARGUMENT,
    NOT_FOUND,
    UNKNOWN,
    Call,
    Handler,
    HandlerFactory,
)
from placement.router.picker_health import PickerHealth
from placement.router.picker_messages import RoutedAnswers, _Stream

log = logging.getLogger("lorafleet.router")

T = TypeVar("T")

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"


async def resume(coroutine: Coroutine[Any, Any, T], waiting: Any) -> T:
    """Drive ``coroutine``, started by hand (``send(None)``) and suspended on
    ``waiting`` (what it yielded: a future, or None for a bare yield), to its end in
    the task that awaits this, as if that task had run it from the start (3.12's eager
    tasks do this; 3.11 has none). What ``waiting`` raises, the coroutine reads from it
    when resumed; this task's cancellation is thrown into it."""
    while True:
        try:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                # As a task does with what its coroutine yields: the future's "a task
                # waits on me" flag, set by the coroutine's await, is the task's to clear.
                waiting._asyncio_future_blocking = False
                await waiting
        except asyncio.CancelledError as exc:
            if waiting is None or not waiting.cancelled():  # this task was cancelled
                try:
                    waiting = coroutine.throw(exc)
                except StopIteration as done:
                    return cast(T, done.value)
                continue
        except Exception:
            if waiting is None or not waiting.done():
                raise
            # The coroutine reads it from the future when resumed.
        try:
            waiting = coroutine.send(None)
        except StopIteration as done:
            return cast(T, done.value)


def _parse(message_type: Any, payload: bytes, call: Call) -> Any | None:
    try:
        return message_type.FromString(payload)
    except DecodeError as exc:
        name = message_type.DESCRIPTOR.full_name
        call.end(INVALID_ARGUMENT, f"not a {name}: {exc}")
        return None


class ProcessCall:
    """One ``Process`` stream: one HTTP request through the gateway."""

    def __init__(self, call: Call, router: Router, routes: RoutedAnswers) -> None:
        self.call = call
        self.stream = _Stream(router, routes)
        self.waiting: deque[Any] = deque()
        self.task: asyncio.Task[None] | None = None
        self.half_closed_ = False

    def message(self, payload: bytes) -> None:
        message = _parse(ext_proc.ProcessingRequest, payload, self.call)
        if message is None:
            self.stream.finish()
        elif self.task is not None:
            self.waiting.append(message)  # the body's decision first
        else:
            self._answer(message)

    def _answer(self, message: Any) -> None:
        stream = self.stream
        if stream.done:
            # Answered already (an immediate response): what the gateway sent before it
            # read that is dropped; the call ends when it closes its side.
            return
        stream.note(message)
        if message.WhichOneof("request") == "request_body":
            self._body(message.request_body)
            return
        try:
            responses = stream.answer(message)
        except ValueError as exc:  # messages out of the protocol's order
            self._abort(str(exc))
            return
        self._send(responses)

    def _body(self, chunk: Any) -> None:
        """The body chunk's answer, at once when its decision never waits (most do not:
        no load, no pressure), else from a task once it has.

        The decision runs in a context of its own from its start, as in a task: what it
        sets in a ``ContextVar`` stays its own, not the connection's. Until it first
        waits there is no current task (``asyncio.current_task()`` is None), so the
        decision must not open ``asyncio.timeout`` or a ``TaskGroup`` before that."""
        body = self.stream.body(chunk)
        context = contextvars.copy_context()
        try:
            waiting = context.run(body.send, None)
        except StopIteration as decided:
            self._decided(decided.value)
            return
        except (Exception, asyncio.CancelledError) as exc:  # its own: no task here
            self._failed(exc)
            return
        loop = asyncio.get_running_loop()
        self.task = loop.create_task(self._waited(body, waiting), context=context)

    async def _waited(self, body: Coroutine[Any, Any, list[Any]], waiting: Any) -> None:
        try:
            responses = await resume(body, waiting)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # ours: the call is over
                raise
            self.task = None  # the decision's own (a future it awaited was cancelled)
            self._failed(exc)
            return
        except Exception as exc:
            self.task = None
            self._failed(exc)
            return
        self.task = None
        self._decided(responses)
        while self.waiting and self.task is None and not self.call.ended:
            self._answer(self.waiting.popleft())
        if self.half_closed_ and self.task is None:
            self._close()

    def _decided(self, responses: list[Any]) -> None:
        self._send(responses)

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, ValueError):  # messages out of the protocol's order
            self._abort(str(exc))
            return
        if isinstance(exc, asyncio.CancelledError):  # what it waited for was cancelled
            log.warning("endpoint picker: a decision was cancelled under the call")
            self.call.end(CANCELLED, "the picker's decision was cancelled")
            self.stream.finish()
            return
        log.error("endpoint picker: deciding a request failed", exc_info=exc)
        self.call.end(UNKNOWN, f"the picker failed: {type(exc).__name__}: {exc}")
        self.stream.finish()

    def _send(self, responses: list[Any]) -> None:
        for response in responses:
            self.call.send(response.SerializeToString())

    def _abort(self, message: str) -> None:
        self.call.end(INVALID_ARGUMENT, message)
        self.stream.finish()

    def half_closed(self) -> None:
        self.half_closed_ = True
        if self.task is None:
            self._close()

    def _close(self) -> None:
        self.call.end()
        self.stream.finish()

    def cancelled(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.stream.finish()


class HealthCheck:
    """``Health.Check``: one request, one answer (NOT_FOUND for a name not served)."""

    def __init__(self, call: Call, health: PickerHealth) -> None:
        self.call, self.health = call, health
        self.service: str | None = None

    def message(self, payload: bytes) -> None:
        request = _parse(health_pb2.HealthCheckRequest, payload, self.call)
        if request is not None:
            self.service = request.service

    def half_closed(self) -> None:
        if self.service is None:
            self.call.end(INVALID_ARGUMENT, "no HealthCheckRequest before the stream's end")
            return
        status = self.health.status(self.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            self.call.end(NOT_FOUND, f"no service {self.service!r}")
            return
        self.call.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
        self.call.end()

    def cancelled(self) -> None:
        pass


class HealthWatch:
    """``Health.Watch``: the status at once, then again whenever it changes."""

    def __init__(self, call: Call, health: PickerHealth, *, interval_s: float) -> None:
        self.call, self.health, self.interval_s = call, health, interval_s
        self.task: asyncio.Task[None] | None = None

    def message(self, payload: bytes) -> None:
        request = _parse(health_pb2.HealthCheckRequest, payload, self.call)
        if request is not None and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._watch(request.service))

    async def _watch(self, service: str) -> None:
        sent: int | None = None
        while not self.call.ended:
            status = self.health.status(service)
            if status != sent:
                self.call.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
                sent = status
            await asyncio.sleep(self.interval_s)

    def half_closed(self) -> None:
        if self.task is None:
            self.call.end(INVALID_ARGUMENT, "no HealthCheckRequest before the stream's end")

    def cancelled(self) -> None:
        if self.task is not None:
            self.task.cancel()


def picker_methods(router: Router) -> dict[str, HandlerFactory]:
    """The picker's gRPC methods by path: ext_proc and the health service."""
    routes = RoutedAnswers()
    health = PickerHealth(router)
    interval_s = router.settings.scrape_interval_s

    def process(call: Call) -> Handler:
        return ProcessCall(call, router, routes)

    def check(call: Call) -> Handler:
        return HealthCheck(call, health)

    def watch(call: Call) -> Handler:
        return HealthWatch(call, health, interval_s=interval_s)

    return {PROCESS: process, HEALTH_CHECK: check, HEALTH_WATCH: watch}
