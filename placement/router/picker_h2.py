"""The endpoint picker's own gRPC server: HTTP/2 (RFC 9113) and gRPC's framing on the
router's event loop, with no gRPC library.

Why: grpc.aio costs 160-190 us of the loop thread's CPU per ext_proc stream (three
reads and two writes, each a C-core batch and a wake-up from its poller thread), about
the whole of the picker's 200 us budget; an ``asyncio.Protocol`` reading the frames
where they arrive costs a fraction (docs/benchmarks.md, "Endpoint picker over gRPC").

What it does: cleartext HTTP/2 with prior knowledge, as gateways and kubelets speak gRPC
to a picker. The connection (frames, SETTINGS, PING, RST_STREAM, GOAWAY, HEADERS with
CONTINUATION and padding, flow control on what is received) is
``router.picker_h2_connection``'s, over ``router.picker_h2_frames`` (frame types, error
codes, limits, a stream's state) and ``router.picker_hpack`` (HPACK decoding); here,
each stream's gRPC call, what is sent (waiting for the peer's windows) and the server
with its graceful stop (GOAWAY, then the open streams get their grace). Per stream,
gRPC's framing: the method from ``:path``, length-prefixed messages up to
``max_message_bytes``, the answer's headers, messages and trailers (``grpc-status``,
``grpc-message``). Errors a peer can cause end its stream with a gRPC status naming what
was wrong, or the connection with a GOAWAY naming it, and never the server. What a peer
can make it hold is bounded: frames of 16 KiB, a header block of 64 KiB in at most 33
frames and a header list of 64 KiB decoded, ``max_streams`` streams a connection, what
each sends by the window we grant, and nothing more read from a peer that does not read
our answers (``pause_writing``); a connection with no stream is closed after
``idle_timeout_s`` (one with no preface after ``preface_timeout_s``).

A call's ``grpc-timeout`` is its deadline: past it, DEADLINE_EXCEEDED and its handler
hears ``cancelled``. What it does not: TLS, compression (a compressed message is
UNIMPLEMENTED), server push. The methods are ``Handler`` factories given by the caller; this module
knows no protobuf and decides nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol
from urllib.parse import quote

from placement.router.picker_h2_connection import H2Connection
from placement.router.picker_h2_frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    IDLE_TIMEOUT_S,
    MAX_STREAMS,
    NO_ERROR,
    PREFACE_TIMEOUT_S,
    RST_STREAM,
    Stream,
    frame,
)
from placement.router.picker_hpack import literal

log = logging.getLogger("lorafleet.router")

# gRPC status codes.
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14

#: grpc-timeout's units (gRPC over HTTP/2: "TimeoutValue TimeoutUnit", at most 8 digits).
_TIMEOUT_UNITS_S = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def timeout_s(value: bytes) -> float | None:
    """A ``grpc-timeout`` in seconds; None if it is not one."""
    digits, unit = value[:-1], value[-1:]
    if not 1 <= len(digits) <= 8 or not digits.isdigit() or unit not in _TIMEOUT_UNITS_S:
        return None
    return int(digits) * _TIMEOUT_UNITS_S[unit]


_RESPONSE_HEADERS = literal(b":status", b"200") + literal(b"content-type", b"application/grpc")


def _trailers(code: int, message: str) -> bytes:
    block = literal(b"grpc-status", str(code).encode())
    if message:
        # Percent-encoded as gRPC's spec asks; short enough for one frame.
        block += literal(b"grpc-message", quote(message[:1024], safe=" ").encode())
    return block


class Handler(Protocol):
    """One gRPC call's server side: what the peer sends, as it arrives."""

    def message(self, payload: bytes) -> None: ...

    def half_closed(self) -> None:
        """The peer has sent all it will (END_STREAM)."""

    def cancelled(self) -> None:
        """The peer reset the stream or the connection went: answer nothing more."""


class Call:
    """The answering side of one call: ``send`` messages, then ``end`` with a status."""

    __slots__ = ("_connection", "_stream")

    def __init__(self, connection: _Connection, stream: Stream) -> None:
        self._connection, self._stream = connection, stream

    @property
    def ended(self) -> bool:
        return self._stream.ended

    def send(self, payload: bytes) -> None:
        """One message (a serialized protobuf), framed as gRPC frames it."""
        if not self._stream.ended:
            prefix = b"\x00" + len(payload).to_bytes(4, "big")
            self._connection.send_data(self._stream, prefix + payload)

    def end(self, code: int = OK, message: str = "") -> None:
        """The trailers with ``grpc-status`` (and ``grpc-message``): the call is over."""
        self._connection.end(self._stream, code, message)


HandlerFactory = Callable[[Call], Handler]


class _Connection(H2Connection):
    """One connection's gRPC: each stream a call of ``server.methods``."""

    server: GrpcH2Server

    def _open(self, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None:
        fields: dict[bytes, bytes] = {}
        for name, value in headers:
            fields.setdefault(name, value)
        call = Call(self, stream)
        content_type = fields.get(b"content-type", b"")
        if fields.get(b":method") != b"POST" or not content_type.startswith(b"application/grpc"):
            stream.headers_sent = True  # not gRPC: an HTTP answer, as gRPC's spec says
            status = b"405" if fields.get(b":method") != b"POST" else b"415"
            self._end_stream_block(stream, literal(b":status", status))
            return
        path = fields.get(b":path", b"").decode("latin-1")
        factory = self.server.methods.get(path)
        if factory is None:
            call.end(UNIMPLEMENTED, f"no method {path!r} here")
            return
        timeout = fields.get(b"grpc-timeout")
        if timeout is not None:
            limit_s = timeout_s(timeout)
            if limit_s is None:
                call.end(INTERNAL, f"a grpc-timeout of {timeout!r}")
                return
            loop = asyncio.get_running_loop()
            stream.deadline = loop.call_later(limit_s, self._expired, stream)
        stream.handler = self._guarded(stream, lambda: factory(call))

    def _expired(self, stream: Stream) -> None:
        """The call's deadline passed: DEADLINE_EXCEEDED, and its handler told it is over."""
        stream.deadline = None
        if stream.ended or self.transport is None:
            return
        handler = stream.handler
        self.end(stream, DEADLINE_EXCEEDED, "the call's deadline (grpc-timeout) passed")
        stream.handler = handler
        self._cancel(stream)

    def _messages(self, stream: Stream) -> None:
        inbox = stream.inbox
        while len(inbox) >= 5 and not stream.ended:
            compressed, size = inbox[0], int.from_bytes(inbox[1:5], "big")
            if compressed:
                self.end(stream, UNIMPLEMENTED, "compressed messages are not supported")
                return
            if size > self.server.max_message_bytes:
                message = f"a message of {size} bytes, over {self.server.max_message_bytes}"
                self.end(stream, RESOURCE_EXHAUSTED, message)
                return
            if len(inbox) < 5 + size:
                return
            payload = bytes(inbox[5 : 5 + size])
            del inbox[: 5 + size]
            handler = stream.handler
            if handler is not None:
                self._guarded(stream, partial(handler.message, payload))

    def _remote_closed(self, stream: Stream) -> None:
        stream.remote_closed = True
        if stream.inbox:
            self.end(stream, INTERNAL, "the stream ended inside a message")
            return
        handler = stream.handler
        if handler is not None:
            self._guarded(stream, handler.half_closed)

    def _guarded(self, stream: Stream, run: Callable[[], Any]) -> Any:
        """A handler's step; what it raises ends its call (UNKNOWN), not the connection,
        and the handler is told it is over (``cancelled``: it frees what it holds)."""
        try:
            return run()
        # The handler's bug must not take the connection down; a step runs in no task,
        # so a CancelledError here is the handler's own, not the server's.
        except (Exception, asyncio.CancelledError) as exc:
            log.exception("endpoint picker: a call failed")
            handler = stream.handler
            self.end(stream, UNKNOWN, f"the picker failed: {type(exc).__name__}: {exc}")
            stream.handler = handler  # the trailers may have cleared it: it hears first
            self._cancel(stream)
            return None

    def _cancel(self, stream: Stream) -> None:
        stream.ended = True
        if stream.deadline is not None:
            stream.deadline.cancel()
            stream.deadline = None
        handler, stream.handler = stream.handler, None
        if handler is not None:
            try:
                handler.cancelled()
            except Exception:  # cleanup: log it, go on
                log.exception("endpoint picker: cancelling a call failed")

    # -- answering -------------------------------------------------------------------

    def send_data(self, stream: Stream, data: bytes) -> None:
        if not stream.headers_sent:
            stream.headers_sent = True
            self._queue(frame(HEADERS, END_HEADERS, stream.stream_id, _RESPONSE_HEADERS))
        stream.outbox.append(data)
        self._drain(stream)

    def end(self, stream: Stream, code: int, message: str) -> None:
        if stream.ended:
            return
        stream.ended = True
        block = _trailers(code, message)
        if not stream.headers_sent:  # trailers-only
            stream.headers_sent = True
            block = _RESPONSE_HEADERS + block
        stream.outbox.append((block,))
        self._drain(stream)

    def _end_stream_block(self, stream: Stream, block: bytes) -> None:
        stream.ended = True
        stream.outbox.append((block,))
        self._drain(stream)

    def _drain(self, stream: Stream) -> None:
        outbox = stream.outbox
        while outbox:
            item = outbox[0]
            if isinstance(item, tuple):  # the trailers: the stream is done on our side
                outbox.popleft()
                self._queue(frame(HEADERS, END_HEADERS | END_STREAM, stream.stream_id, item[0]))
                self._closed(stream)
                return
            allowed = min(stream.send_window, self.send_window, self.peer_max_frame)
            if allowed <= 0 and item:
                return  # the peer's window: WINDOW_UPDATE resumes it
            chunk = item[:allowed]
            if len(chunk) < len(item):
                outbox[0] = item[len(chunk) :]
            else:
                outbox.popleft()
            stream.send_window -= len(chunk)
            self.send_window -= len(chunk)
            self._queue(frame(DATA, 0, stream.stream_id, chunk))

    def _drain_all(self) -> None:
        for stream in list(self.streams.values()):
            if stream.outbox:
                self._drain(stream)

    def _closed(self, stream: Stream) -> None:
        """Our side ended: a peer still sending is told to stop (RST_STREAM NO_ERROR)."""
        if not stream.remote_closed:
            self._queue(frame(RST_STREAM, 0, stream.stream_id, NO_ERROR.to_bytes(4, "big")))
        stream.handler = None
        if stream.deadline is not None:
            stream.deadline.cancel()
            stream.deadline = None
        if self.streams.pop(stream.stream_id, None) is not None:
            self._stream_gone()


class GrpcH2Server:
    """The server: a listening socket on the running loop, its connections, a stop."""

    def __init__(
        self,
        methods: Mapping[str, HandlerFactory],
        *,
        max_message_bytes: int,
        max_streams: int = MAX_STREAMS,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        preface_timeout_s: float = PREFACE_TIMEOUT_S,
    ) -> None:
        self.methods = dict(methods)
        self.max_message_bytes = max_message_bytes
        #: SETTINGS_MAX_CONCURRENT_STREAMS, per connection: past it, REFUSED_STREAM.
        self.max_streams = max_streams
        self.idle_timeout_s, self.preface_timeout_s = idle_timeout_s, preface_timeout_s
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._changed = asyncio.Event()

    async def start(self, host: str | None, port: int) -> int:
        """Listen (port 0: the kernel's choice); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.protocol, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    def protocol(self) -> _Connection:
        """A connection's protocol (what the listening socket makes per connection)."""
        return _Connection(self)

    def changed(self) -> None:
        self._changed.set()

    def _open_streams(self) -> int:
        return sum(len(connection.streams) for connection in self.connections)

    async def stop(self, grace_s: float | None) -> None:
        """No new connections nor streams; the open streams get ``grace_s`` to end,
        then every connection closes (its calls cancelled)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self.connections):
            connection.goaway()
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + (grace_s or 0.0)
        while self._open_streams() and loop.time() < deadline_s:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline_s - loop.time())
            except TimeoutError:
                break
        for connection in list(self.connections):
            connection.close()  # its calls cancelled, their rows logged, here and now
        await server.wait_closed()
        await asyncio.sleep(0)  # the ends of the connections whose writes are done
