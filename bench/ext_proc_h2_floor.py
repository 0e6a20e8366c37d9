"""A bench-only floor: the trivial ext_proc server as a bare HTTP/2 protocol on an
asyncio loop, with no gRPC library, to show what a stream costs without grpc's C-core
(``bench.picker_latency --transports``).

Not a server anyone may deploy: it decodes no HPACK (the header blocks of
``bench.ext_proc_client`` are skipped unread), grants one large window up front and
sends without flow control, checks no protocol errors and answers every stream as the
picker's ``Process`` would a FULL_DUPLEX_STREAMED request (the routed answer and the body
echoed back once the body ends, the trailers once the client half-closes). The answers
are Envoy's protobufs (``xds-protos``), serialized per stream.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc

from bench.ext_proc_client import frame, literal
from bench.loop_server import LoopServer
from placement.router.core import Router
from placement.router.picker_grpc import RoutedAnswers, _Stream

_DATA, _HEADERS, _SETTINGS, _PING, _WINDOW_UPDATE = 0, 1, 4, 6, 8
_END_STREAM, _END_HEADERS, _ACK = 0x1, 0x4, 0x1
_PREFACE_BYTES = 24
_RESPONSE_HEADERS = literal(b":status", b"200") + literal(b"content-type", b"application/grpc")
_TRAILERS = literal(b"grpc-status", b"0")


def _framed(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class _Connection(asyncio.Protocol):
    def __init__(self, routed: bytes, router: Router | None) -> None:
        self.routed = routed
        self.router = router
        self.routes = RoutedAnswers()
        self.buffer = bytearray()
        self.preface = False
        self.streams: dict[int, bytearray] = {}
        self.pickers: dict[int, _Stream] = {}
        self.answered: set[int] = set()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        grant = struct.pack(">I", 1 << 30)
        transport.write(frame(_SETTINGS, 0, 0, b"") + frame(_WINDOW_UPDATE, 0, 0, grant))

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.preface:
            if len(buffer) < _PREFACE_BYTES:
                return
            del buffer[:_PREFACE_BYTES]
            self.preface = True
        out: list[bytes] = []
        while len(buffer) >= 9:
            size = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + size:
                break
            kind, flags = buffer[3], buffer[4]
            stream_id = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
            payload = bytes(buffer[9 : 9 + size])
            del buffer[: 9 + size]
            self._frame(kind, flags, stream_id, payload, out)
        if out:
            self.transport.write(b"".join(out))

    def _frame(
        self, kind: int, flags: int, stream_id: int, payload: bytes, out: list[bytes]
    ) -> None:
        if kind == _SETTINGS and not flags & _ACK:
            out.append(frame(_SETTINGS, _ACK, 0, b""))
        elif kind == _PING and not flags & _ACK:
            out.append(frame(_PING, _ACK, 0, payload))
        elif kind == _HEADERS:
            self.streams[stream_id] = bytearray()
            if self.router is not None:
                self.pickers[stream_id] = _Stream(self.router, self.routes)
        elif kind == _DATA and stream_id in self.streams:
            self._data(stream_id, flags, payload, out)

    def _data(self, stream_id: int, flags: int, payload: bytes, out: list[bytes]) -> None:
        data = self.streams[stream_id]
        data += payload
        while len(data) >= 5:
            size = int.from_bytes(data[1:5], "big")
            if len(data) < 5 + size:
                break
            message = ext_proc.ProcessingRequest.FromString(bytes(data[5 : 5 + size]))
            del data[: 5 + size]
            picker = self.pickers.get(stream_id)
            if picker is not None:
                self._pick(picker, stream_id, message, out)
            elif message.WhichOneof("request") == "request_body":
                echoed = ext_proc.ProcessingResponse()
                streamed = echoed.request_body.response.body_mutation.streamed_response
                streamed.body = message.request_body.body
                streamed.end_of_stream = True
                out.append(frame(_HEADERS, _END_HEADERS, stream_id, _RESPONSE_HEADERS))
                out.append(frame(_DATA, 0, stream_id, _framed(self.routed)))
                out.append(frame(_DATA, 0, stream_id, _framed(echoed.SerializeToString())))
        if flags & _END_STREAM:
            out.append(frame(_HEADERS, _END_HEADERS | _END_STREAM, stream_id, _TRAILERS))
            del self.streams[stream_id]
            self.answered.discard(stream_id)
            picker = self.pickers.pop(stream_id, None)
            if picker is not None:
                picker.finish()

    def _pick(self, picker: _Stream, stream_id: int, message: Any, out: list[bytes]) -> None:
        """The picker's own ``_Stream`` (its translation and decision) on this stream:
        the headers answered at once, the body's decision in a task (it may await)."""
        picker.note(message)
        if message.WhichOneof("request") != "request_body":
            self._send(stream_id, picker.answer(message), out)
            return
        task = asyncio.get_running_loop().create_task(picker.body(message.request_body))
        task.add_done_callback(lambda done: self._answered(stream_id, done))

    def _answered(self, stream_id: int, done: asyncio.Task[list[Any]]) -> None:
        out: list[bytes] = []
        self._send(stream_id, done.result(), out)
        self.transport.write(b"".join(out))

    def _send(self, stream_id: int, responses: list[Any], out: list[bytes]) -> None:
        if responses and stream_id not in self.answered:
            self.answered.add(stream_id)
            out.append(frame(_HEADERS, _END_HEADERS, stream_id, _RESPONSE_HEADERS))
        out.extend(frame(_DATA, 0, stream_id, _framed(r.SerializeToString())) for r in responses)


class H2FloorServer(LoopServer):
    """The bare HTTP/2 floor on its own uvloop in a thread; as ``ServerThread``. With a
    ``router``, each stream runs the picker's ``_Stream`` (translation, decision,
    answers) in place of the fixed answer: the picker as it would cost on such a
    transport."""

    def __init__(self, routed: Any, router: Router | None = None) -> None:
        super().__init__()
        self.router = router
        self.routed = routed.SerializeToString()
        self.server: Any = None

    async def _start(self) -> int:
        self.server = await asyncio.get_running_loop().create_server(
            lambda: _Connection(self.routed, self.router), "127.0.0.1", 0
        )
        return int(self.server.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()
