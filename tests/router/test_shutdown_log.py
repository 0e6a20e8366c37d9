"""No answered request loses its request-log row when the router stops.

At SIGTERM uvicorn stops taking connections, waits for the answers in flight, then runs
the lifespan's shutdown: ``Router.stop`` cancels the loops, the log loop among them,
and ``RequestLogger.close`` flushes what is left and closes the file. A flush the
cancellation caught with its batch already handed to the worker thread used to let
go of the batch: not started yet, it was never written; started, it could find the
file closed under it. Either way without a word: the one silent loss found behind the
demo gate's 1,087 rows for 1,088 answers (the run's last row missing, once).

The executor here holds the log's write until the test lets it go, so the cancellation
always finds the batch in the thread's queue: no timing decides the outcome.
"""

from __future__ import annotations

import asyncio
import functools
import http.client
import json
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from prometheus_client import CollectorRegistry

from placement.router import MemoryRequestLog, build_router
from placement.router.metrics import RouterMetrics
from placement.router.reqlog import JsonLinesRequestLog, LogRow, RequestLogger
from placement.router.wiring import RouterWithPicker, ServedApp

from .conftest import MANUAL, Ticker, catalog_of, emulated, plan_of
from .test_endpoint_picker import body_chunks, request_headers


class HeldWrites(ThreadPoolExecutor):
    """An event loop's default executor that holds the calls of ``held`` (a request
    log's ``_write``) until ``release``, and runs every other call in its threads. A
    held call cancelled meanwhile never runs, as in the pool's own queue."""

    def __init__(self, held: Callable[..., Any]) -> None:
        super().__init__(max_workers=2)
        self._held = held
        self._waiting: list[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self.holding = True
        #: Set once a held call waits (the loop it is given, and the event).
        self.arrived: asyncio.Event | None = None

    def _is_held(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
        if fn == self._held:
            return True
        # asyncio.to_thread hands over ``partial(context.run, fn, *args)``.
        return isinstance(fn, functools.partial) and bool(fn.args) and fn.args[0] == self._held

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if not (self.holding and self._is_held(fn, args)):
            return super().submit(fn, *args, **kwargs)
        future: Future[Any] = Future()
        self._waiting.append((future, functools.partial(fn, **kwargs), args))
        if self.arrived is not None:
            self.arrived.set()
        return future

    def release(self) -> None:
        """Run the held calls (here, on the caller's thread) and hold no more."""
        self.holding = False
        waiting, self._waiting = self._waiting, []
        for future, fn, args in waiting:
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited: it never runs
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)


def _row(n: int) -> LogRow:
    return LogRow(1.7e9 + n, "alpha", "t", n, 2, "pod-0", "gpu_hit", 12.5, 200)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def logger(tmp_path: Path, registry: CollectorRegistry) -> Iterator[RequestLogger]:
    logger = RequestLogger(
        JsonLinesRequestLog(tmp_path / "requests.jsonl"),
        flush_interval_s=1.0,
        metrics=RouterMetrics(registry),
        max_pending_rows=100,
    )
    yield logger


@pytest.mark.anyio
async def test_a_flush_cancelled_with_its_batch_in_the_thread_writes_it_before_the_close(
    logger: RequestLogger, tmp_path: Path
) -> None:
    executor = HeldWrites(logger._write)
    asyncio.get_running_loop().set_default_executor(executor)
    executor.arrived = asyncio.Event()
    logger.append(_row(1))
    flushing = asyncio.create_task(logger.flush())  # the log loop's round
    await executor.arrived.wait()  # the batch is in the thread's queue
    flushing.cancel()  # Router.stop: Supervisor.stop cancels the log loop
    # One turn of the loop: what the cancellation does reaches the executor's future
    # (a thread scheduled later would find it now), then the thread gets to the batch.
    await asyncio.sleep(0)
    executor.release()
    outcomes = await asyncio.gather(flushing, return_exceptions=True)
    assert isinstance(outcomes[0], asyncio.CancelledError)  # the cancellation still ends it
    logger.append(_row(2))  # a row the log loop had not taken yet: the close's
    await logger.close()
    assert [row["prompt_tokens"] for row in _lines(tmp_path / "requests.jsonl")] == [1, 2]


@pytest.mark.anyio
async def test_the_close_waits_for_a_batch_in_the_thread_before_closing_the_file(
    logger: RequestLogger, tmp_path: Path
) -> None:
    executor = HeldWrites(logger._write)
    asyncio.get_running_loop().set_default_executor(executor)
    executor.arrived = asyncio.Event()
    logger.append(_row(1))
    flushing = asyncio.create_task(logger.flush())
    await executor.arrived.wait()
    closing = asyncio.create_task(logger.close())
    await asyncio.sleep(0)  # the close runs up to where it waits
    executor.release()
    await asyncio.gather(flushing, closing)
    assert len(_lines(tmp_path / "requests.jsonl")) == 1


@pytest.mark.anyio
async def test_a_row_appended_after_the_close_is_counted_and_named(
    logger: RequestLogger, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    await logger.close()
    logger.append(_row(1))
    dropped = {"reason": "closed"}
    assert registry.get_sample_value("lorafleet_router_log_rows_dropped_total", dropped) == 1.0
    assert "request-log row dropped: the request log" in caplog.text
    assert "is closed" in caplog.text


# -- at the wire: the router's own server protocol, an emulated pod, a real file --------


class _OnShutdown:
    """Lifespan middleware: ``then`` runs two turns of the loop after the app is told
    to shut down (``Router.stop`` has cancelled its loops by then)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.then: Callable[[], None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def receiving() -> MutableMapping[str, Any]:
            message: MutableMapping[str, Any] = await receive()
            then = self.then
            if message["type"] == "lifespan.shutdown" and then is not None:
                loop = asyncio.get_running_loop()
                loop.call_soon(loop.call_soon, then)
            return message

        await self.app(scope, receiving, send)


def _answer(port: int, *, stream: bool) -> bytes:
    """One completion, read to its last byte (a stream to its terminating chunk)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = {"model": "alpha", "prompt": "hello", "max_tokens": 3, "stream": stream}
    connection.request(
        "POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"}
    )
    reply = connection.getresponse()
    data = reply.read()
    assert reply.status == 200, data
    connection.close()
    return data


def _served_router(tmp_path: Path, pods: Any) -> tuple[Any, _OnShutdown, Path]:
    path = tmp_path / "requests.jsonl"
    app = build_router(
        fleet=pods.domain,
        plan=plan_of({"alpha": ["pod-0"]}),
        catalog=catalog_of(["alpha"]),
        settings=MANUAL,
        registry=CollectorRegistry(),
        request_log=path,
    )
    return app, _OnShutdown(app), path


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_the_rows_of_answers_ended_as_the_router_stops_are_in_the_file(
    tmp_path: Path, stream: bool
) -> None:
    """The stop begins as the client reads the answer's end. This held before the fix
    too: the row is appended in the turn that writes the last byte, and uvicorn waits
    for the handler tasks before the lifespan's shutdown; it guards both."""
    with emulated(1) as pods:
        _app, wrapped, path = _served_router(tmp_path, pods)
        served = ServedApp(wrapped).start()
        try:
            _answer(served.port, stream=True)
            data = _answer(served.port, stream=stream)
            served.server.should_exit = True  # the moment the client has the answer's end
        finally:
            served.stop()
    assert data.endswith(b"data: [DONE]\n\n") if stream else data.endswith(b"}")
    assert [row["status"] for row in _lines(path)] == [200, 200]


def test_a_flush_in_flight_as_the_router_stops_lands_in_the_file(tmp_path: Path) -> None:
    with emulated(1) as pods:
        app, wrapped, path = _served_router(tmp_path, pods)
        ticker = Ticker()
        app.router.supervisor.sleep = ticker.sleep  # the loops' rounds run when told
        executor = HeldWrites(app.router.request_log._write)
        served = ServedApp(wrapped).start()
        try:

            async def install() -> None:
                asyncio.get_running_loop().set_default_executor(executor)

            served.call(install())
            _answer(served.port, stream=True)
            _answer(served.port, stream=False)
            # The log loop's round takes both rows and hands them to the thread (held);
            # the three other loops sleep again.
            served.call(ticker.tick(3))
            assert executor._waiting
            wrapped.then = executor.release  # the thread gets to it after the cancellation
            served.server.should_exit = True
        finally:
            served.stop()
    assert [row["status"] for row in _lines(path)] == [200, 200]


# -- the endpoint picker: a stream still open when its grace ends ------------------------


class _Unflushed:
    """A connection's transport as it is while the peer reads nothing: ``close`` only
    marks it closing (``connection_lost`` waits for the bytes it holds to be written);
    ``flushed`` closes it for real."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.closing = False

    def close(self) -> None:
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def flushed(self) -> None:
        if self.closing:
            self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _AfterShutdown:
    """Lifespan middleware: ``then`` runs once the app's shutdown is complete (the
    request log closed), before uvicorn is told so."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.then: list[Callable[[], None]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                for then in self.then:
                    then()
            await send(message)

        await self.app(scope, receive, sending)


def test_a_picker_stream_open_past_its_grace_is_logged_before_the_log_closes() -> None:
    log = MemoryRequestLog()
    settings = replace(MANUAL, router=replace(MANUAL.router, shutdown_grace_s=0.0))
    with emulated(1) as pods:
        app = build_router(
            fleet=pods.domain, settings=settings, registry=CollectorRegistry(), request_log=log
        )
        with_picker = RouterWithPicker(app, host="127.0.0.1", port=0, transport="h2")
        wrapped = _AfterShutdown(with_picker)
        served = ServedApp(wrapped).start()
        port = with_picker.picker.port

        async def hold_its_writes() -> None:
            for connection in with_picker.picker._server.connections:
                connection.transport = held = _Unflushed(connection.transport)
                wrapped.then.append(held.flushed)

        async def gateway() -> None:
            body = json.dumps({"model": "base-model"}).encode()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = ext_proc_grpc.ExternalProcessorStub(channel).Process()
                await call.write(request_headers(body))
                await call.write(body_chunks(body, 1)[0])
                assert (await call.read()).HasField("request_headers")
                await call.read()  # the body, sent on to the pod the picker chose
                served.call(hold_its_writes())
                # The router stops with the stream open (the pod's answer not yet told).
                await asyncio.to_thread(served.stop)

        try:
            asyncio.run(gateway())
        finally:
            served.stop()
    assert [row.status for row in log.rows] == [499]  # the gateway never said how it ended
