"""The picker's own HTTP/2 server at the wire: HPACK against RFC 7541's examples, and
what a bad peer gets (a gRPC status or a GOAWAY naming what is wrong, never a dead
server); a body larger than every window goes through both ways."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from prometheus_client import CollectorRegistry

from placement.router import MemoryRequestLog, build_router
from placement.router.picker_calls import PROCESS, resume
from placement.router.picker_h2 import GrpcH2Server
from placement.router.picker_hpack import Decoder, HpackError, huffman_decode, huffman_encode
from placement.router.wiring import RouterWithPicker, ServedApp

from .conftest import MANUAL, emulated
from .test_endpoint_picker import (
    _headers,
    body_chunks,
    picker_for,
    request_headers,
    with_transport,
)

# --- HPACK ---------------------------------------------------------------------------

#: RFC 7541, C.4: three requests on one connection, Huffman-coded, sharing the table.
C4 = [
    (
        "828684418cf1e3c2e5f23a6ba0ab90f4ff",
        [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ],
    ),
    (
        "828684be5886a8eb10649cbf",
        [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ],
    ),
    (
        "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
        [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ],
    ),
]


def test_the_rfc_examples_decode_in_order_on_one_table() -> None:
    decoder = Decoder()
    for block, expected in C4:
        decoded = decoder.decode(bytes.fromhex(block))
        assert decoded == [(k.encode(), v.encode()) for k, v in expected]


def test_every_byte_goes_through_the_huffman_code_and_back() -> None:
    text = bytes(range(256)) * 2
    assert huffman_decode(huffman_encode(text)) == text


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ("be", "no header table entry 62"),
        ("3fe21f", "a table size of 4097 over the 4096"),
        ("008100", "bad padding"),
        ("4085", "past the end"),
        ("ff", "ends inside an integer"),
    ],
    ids=["index-past-the-table", "table-size-over-ours", "padding-not-ones", "short", "int"],
)
def test_a_bad_header_block_is_an_error_naming_it(block: str, words: str) -> None:
    with pytest.raises(HpackError, match=words):
        Decoder().decode(bytes.fromhex(block))


# --- the wire --------------------------------------------------------------------------


def _frames(data: bytes) -> list[tuple[int, int, bytes]]:
    frames, at = [], 0
    while len(data) - at >= 9:
        size = int.from_bytes(data[at : at + 3], "big")
        frames.append(
            (
                data[at + 3],
                int.from_bytes(data[at + 5 : at + 9], "big"),
                data[at + 9 : at + 9 + size],
            )
        )
        at += 9 + size
    return frames


def _raw(port: int, sent: bytes) -> list[tuple[int, int, bytes]]:
    """What the picker answers to ``sent`` until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(sent)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return _frames(received)


def test_a_peer_that_is_not_http2_gets_a_goaway_naming_why() -> None:
    with emulated(1) as pods, picker_for(pods.domain) as picking:
        port = int(picking.gateway.target.rpartition(":")[2])
        frames = _raw(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert picking.send(json.dumps({"model": "base-model"}).encode()).status == 200
    [goaway] = [payload for kind, _, payload in frames if kind == 0x7]
    assert int.from_bytes(goaway[4:8], "big") == 0x1  # PROTOCOL_ERROR
    assert b"not an HTTP/2 connection preface" in goaway[8:]


async def _raw_call(
    port: int, method: str, payload: bytes, **options: Any
) -> tuple[grpc.StatusCode, str]:
    """One message and the end of the client's side in one go (a unary call: on a
    stream, a write after the server ended the call races its status in grpc.aio's
    client), then the call's status as the server ended it."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", **options) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await channel.unary_unary(method)(payload)
    return failed.value.code(), failed.value.details() or ""


@pytest.mark.parametrize(
    ("method", "payload", "options", "code", "words"),
    [
        (PROCESS, b"\xff\xff\xff", {}, grpc.StatusCode.INVALID_ARGUMENT, "not a envoy.service"),
        ("/lorafleet.Nothing/Here", b"", {}, grpc.StatusCode.UNIMPLEMENTED, "no method"),
        (
            PROCESS,
            request_headers(b"{}").SerializeToString() * 40,
            {"compression": grpc.Compression.Gzip},
            grpc.StatusCode.UNIMPLEMENTED,
            "compressed messages",
        ),
    ],
    ids=["not-a-processing-request", "unknown-method", "compressed"],
)
def test_a_bad_call_ends_with_a_grpc_status_naming_why(
    method: str, payload: bytes, options: dict[str, Any], code: grpc.StatusCode, words: str
) -> None:
    with emulated(1) as pods, picker_for(pods.domain) as picking:
        port = int(picking.gateway.target.rpartition(":")[2])
        ended, details = asyncio.run(_raw_call(port, method, payload, **options))
        # The server goes on serving.
        assert picking.send(json.dumps({"model": "base-model"}).encode()).status == 200
    assert ended == code
    assert words in details


def test_a_body_larger_than_every_window_goes_through_and_comes_back_whole() -> None:
    prompt = "x" * 900_000  # over the peers' 64 KiB windows, under the 1 MiB limit
    body = json.dumps({"model": "base-model", "prompt": prompt, "max_tokens": 1}).encode()
    with emulated(1) as pods, picker_for(pods.domain) as picking:
        outcome = picking.send(body, chunks=20)
    assert outcome.forwarded == body
    assert outcome.status == 200


# --- a decision started by hand, resumed in a task ------------------------------------


async def _started(body: Any) -> tuple[Any, Any]:
    coroutine = body()
    return coroutine, coroutine.send(None)


def test_a_coroutine_started_by_hand_ends_in_its_task_as_if_it_ran_there() -> None:
    seen: list[str] = []

    async def run() -> list[str]:
        loop = asyncio.get_running_loop()
        ready, failing, never = loop.create_future(), loop.create_future(), loop.create_future()

        async def decision() -> str:
            await asyncio.sleep(0)  # a bare yield
            await asyncio.shield(ready)
            try:
                await failing
            except KeyError:
                seen.append("raised")
            return "decided"

        async def waiting_forever() -> None:
            try:
                await never
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        coroutine, waiting = await _started(decision)
        task = asyncio.create_task(resume(coroutine, waiting))
        loop.call_soon(ready.set_result, None)
        loop.call_later(0.001, failing.set_exception, KeyError("x"))
        seen.append(await task)
        coroutine, waiting = await _started(waiting_forever)
        stuck = asyncio.create_task(resume(coroutine, waiting))
        await asyncio.sleep(0)
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        return seen

    assert asyncio.run(run()) == ["raised", "decided", "cancelled"]


# --- a graceful stop ---------------------------------------------------------------------


def test_a_stop_lets_the_open_stream_end_then_closes_the_port() -> None:
    log = MemoryRequestLog()
    with emulated(1) as pods:
        app = build_router(
            fleet=pods.domain,
            settings=MANUAL,
            registry=CollectorRegistry(),
            request_log=log,
        )
        with_picker = with_transport(RouterWithPicker(app, host="127.0.0.1", port=0))
        with ServedApp(with_picker) as served:
            port = with_picker.picker.port
            assert port

            async def begin_stop() -> asyncio.Task[None]:
                stopping = asyncio.create_task(with_picker.picker.stop(grace_s=3600.0))
                await asyncio.sleep(0)  # one turn: the GOAWAY is out, the stop waits
                return stopping

            async def ended(stopping: asyncio.Task[None]) -> None:
                await stopping

            async def gateway() -> grpc.StatusCode:
                body = json.dumps({"model": "base-model"}).encode()
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    call = ext_proc_grpc.ExternalProcessorStub(channel).Process()
                    await call.write(request_headers(body))
                    await call.write(body_chunks(body, 1)[0])
                    assert (await call.read()).HasField("request_headers")
                    await call.read()  # the body, sent on
                    stopping = served.call(begin_stop())
                    answer = ext_proc.HttpHeaders(headers=_headers([(":status", "200")]))
                    await call.write(ext_proc.ProcessingRequest(response_headers=answer))
                    assert (await call.read()).HasField("response_headers")
                    await call.done_writing()
                    assert await call.read() == grpc.aio.EOF
                    code: grpc.StatusCode = await call.code()
                served.call(ended(stopping))
                return code

            assert asyncio.run(gateway()) == grpc.StatusCode.OK
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=10).close()
    assert [row.status for row in log.rows] == [200]  # the request finished, logged


# --- a call whose handler fails ------------------------------------------------------


class _Failing:
    """A call that fails on its first message, and notes that it heard it was over."""

    def __init__(self, heard: list[str]) -> None:
        self.heard = heard

    def message(self, payload: bytes) -> None:
        raise RuntimeError(f"no answer to {payload!r}")

    def half_closed(self) -> None:
        self.heard.append("half-closed")

    def cancelled(self) -> None:
        self.heard.append("cancelled")


def test_a_failing_call_ends_unknown_naming_why_is_told_so_and_the_server_goes_on() -> None:
    heard: list[str] = []

    async def run() -> list[tuple[grpc.StatusCode, str]]:
        server = GrpcH2Server(
            {"/t.T/Fail": lambda call: _Failing(heard)}, max_message_bytes=1 << 20
        )
        port = await server.start("127.0.0.1", 0)
        try:
            return [await _raw_call(port, "/t.T/Fail", b"x") for _ in range(2)]
        finally:
            await server.stop(None)

    ended = asyncio.run(run())
    assert [code for code, _ in ended] == [grpc.StatusCode.UNKNOWN] * 2
    assert "the picker failed: RuntimeError: no answer to b'x'" in ended[0][1]
    assert heard == ["cancelled", "cancelled"]
