"""The endpoint picker's own gRPC server: HTTP/2 (RFC 9113) and gRPC's framing on the
router's event loop, with no gRPC library.

Why: grpc.aio costs 160-190 us of the loop thread's CPU per ext_proc stream (three
reads and two writes, each a C-core batch and a wake-up from its poller thread), about
the whole of the picker's 200 us budget; an ``asyncio.Protocol`` reading the frames
where they arrive costs a fraction (docs/benchmarks.md, "Endpoint picker over gRPC").

What it does: cleartext HTTP/2 with prior knowledge, as gateways and kubelets speak
gRPC to a picker; HPACK decoding (``router.picker_hpack``); HEADERS with CONTINUATION,
padding and priority; flow control both ways (what is received is granted back, what
is sent waits for the peer's windows); SETTINGS, PING, RST_STREAM, GOAWAY; a graceful
stop (GOAWAY, then the open streams get their grace). Per stream, gRPC's framing: the
method from ``:path``, length-prefixed messages up to ``max_message_bytes``, the
answer's headers, messages and trailers (``grpc-status``, ``grpc-message``). Errors a
peer can cause end its stream with a gRPC status naming what was wrong, or the
connection with a GOAWAY naming it, and never the server. What a peer can make it hold
is bounded: frames of 16 KiB, a header block of 64 KiB in at most 33 frames and a header
list of 64 KiB decoded, ``max_streams`` streams a connection, what each sends by the
window we grant, and nothing more read from a peer that does not read our answers
(``pause_writing``); a connection with no stream is closed after ``idle_timeout_s``
(one with no preface after ``preface_timeout_s``).

What it does not: TLS, compression (a compressed message is UNIMPLEMENTED), deadlines
(``grpc-timeout`` is not enforced: a stream lasts as long as the gateway keeps it),
server push. The methods are ``Handler`` factories given by the caller; this module
knows no protobuf and decides nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol
from urllib.parse import quote

from placement.router.picker_hpack import Decoder, HpackError, literal

log = logging.getLogger("lorafleet.router")

_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
_PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Error codes (RFC 9113, 7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x9
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MAX_FRAME_BYTES = 16384  # ours, the protocol's default: we do not raise it
_MAX_HEADER_BLOCK_BYTES = 64 * 1024
#: A header block's CONTINUATIONs: 64 KiB needs 4 of our frames; an endless run of
#: empty ones (which add no bytes) must end too.
_MAX_CONTINUATIONS = 32
_MAX_STREAMS = 1024
#: A connection with no open stream (or no preface yet) is closed (GOAWAY NO_ERROR).
IDLE_TIMEOUT_S = 300.0
PREFACE_TIMEOUT_S = 10.0
#: Each stream may send us this much before we grant more; the connection, more.
_STREAM_WINDOW = 1 << 20
_CONNECTION_WINDOW = 1 << 30
_DEFAULT_WINDOW = 65535
_MAX_WINDOW = (1 << 31) - 1

# gRPC status codes.
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, NOT_FOUND = 0, 1, 2, 3, 5
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14

_RESPONSE_HEADERS = literal(b":status", b"200") + literal(b"content-type", b"application/grpc")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, stream id, payload."""
    return (
        len(payload).to_bytes(3, "big")
        + bytes((kind, flags))
        + stream_id.to_bytes(4, "big")
        + payload
    )


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

    def __init__(self, connection: _Connection, stream: _Stream) -> None:
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


#: Request pseudo-headers (RFC 9113, 8.3.1) and the fields HTTP/2 forbids (8.2.2).
_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_FIELDS = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


def _malformed(headers: list[tuple[bytes, bytes]]) -> str:
    """Why a request's header list is malformed (RFC 9113, 8.2-8.3), or ``""``."""
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name != name.lower():
            return f"an upper-case field name {name!r}"
        if name.startswith(b":"):
            if regular or name not in _PSEUDO or name in seen:
                return f"the pseudo-header {name!r} out of place, unknown or repeated"
            seen.add(name)
        else:
            regular = True
            if name in _CONNECTION_FIELDS or (name == b"te" and value != b"trailers"):
                return f"a connection-specific field {name!r}"
    missing = {b":method", b":scheme", b":path"} - seen
    return f"no {sorted(missing)!r}" if missing else ""


class _Stream:
    __slots__ = (
        "ended",
        "handler",
        "headers_sent",
        "inbox",
        "outbox",
        "remote_closed",
        "send_window",
        "stream_id",
        "unacked",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.stream_id = stream_id
        self.handler: Handler | None = None
        self.inbox = bytearray()
        self.send_window = send_window
        #: What waits for the peer's windows: DATA payloads, then the trailers' block.
        self.outbox: deque[bytes | tuple[bytes]] = deque()
        self.unacked = 0  # received and not yet granted back
        self.remote_closed = False
        self.headers_sent = False
        self.ended = False


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection from a gateway (or a probe)."""

    def __init__(self, server: GrpcH2Server) -> None:
        self.server = server
        self.transport: Any = None
        self.buffer = bytearray()
        self.preface = False
        self.decoder = Decoder()
        self.streams: dict[int, _Stream] = {}
        self.last_stream_id = 0
        self.send_window = _DEFAULT_WINDOW
        self.peer_window = _DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_max_frame = _MAX_FRAME_BYTES
        self.unacked = 0
        #: A header block waiting for its CONTINUATIONs: stream id, END_STREAM, parts.
        self.continuing: tuple[int, bool, list[bytes]] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.out: list[bytes] = []
        self.receiving = False
        self.flush_soon = False
        self.stopping = False

    # -- the connection ----------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        server = self.server
        settings = (0x3).to_bytes(2, "big") + server.max_streams.to_bytes(4, "big")
        settings += (0x4).to_bytes(2, "big") + _STREAM_WINDOW.to_bytes(4, "big")
        settings += (0x6).to_bytes(2, "big") + self.decoder.max_list_bytes.to_bytes(4, "big")
        grant = (_CONNECTION_WINDOW - _DEFAULT_WINDOW).to_bytes(4, "big")
        transport.write(frame(_SETTINGS, 0, 0, settings) + frame(_WINDOW_UPDATE, 0, 0, grant))
        self.server.connections.add(self)
        self._arm(min(server.preface_timeout_s, server.idle_timeout_s), "no preface")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.server.connections.discard(self)
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self._cancel(stream)
        self.server.changed()

    def data_received(self, data: bytes) -> None:
        self.receiving = True
        try:
            self._receive(data)
        except _ConnectionError as exc:
            self.fail(exc.code, str(exc))
        finally:
            self.receiving = False
            self.flush()

    def _receive(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.preface:
            if len(buffer) < len(_PREFACE):
                if not _PREFACE.startswith(bytes(buffer)):
                    raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if buffer[: len(_PREFACE)] != _PREFACE:
                raise _ConnectionError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            del buffer[: len(_PREFACE)]
            self.preface = True
            self._arm(self.server.idle_timeout_s, "idle")
        at = 0
        while len(buffer) - at >= 9 and self.transport is not None:
            size = int.from_bytes(buffer[at : at + 3], "big")
            if size > _MAX_FRAME_BYTES:
                raise _ConnectionError(FRAME_SIZE_ERROR, f"a frame of {size} bytes")
            if len(buffer) - at < 9 + size:
                break
            kind, flags = buffer[at + 3], buffer[at + 4]
            stream_id = int.from_bytes(buffer[at + 5 : at + 9], "big") & 0x7FFFFFFF
            payload = bytes(buffer[at + 9 : at + 9 + size])
            at += 9 + size
            self._frame(kind, flags, stream_id, payload)
        del buffer[:at]

    def fail(self, code: int, message: str) -> None:
        """A connection error: GOAWAY naming it, then the connection closes."""
        if self.transport is None:
            return
        log.info("endpoint picker: closing a gateway's connection: %s", message)
        debug = message.encode("utf-8", "replace")[:256]
        payload = self.last_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big") + debug
        self.out.append(frame(_GOAWAY, 0, 0, payload))
        self.flush()
        self.transport.close()
        self.transport = None

    def goaway(self) -> None:
        """The server stops: no new streams; those open may end."""
        self.stopping = True
        if self.transport is not None:
            payload = self.last_stream_id.to_bytes(4, "big") + NO_ERROR.to_bytes(4, "big")
            self.out.append(frame(_GOAWAY, 0, 0, payload))
            self.flush()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        """The peer is not reading what we write: read nothing more from it (its PINGs,
        SETTINGS and calls all make answers) until it does."""
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def _arm(self, delay_s: float, why: str) -> None:
        """Close the connection in ``delay_s`` unless a stream opens first."""
        self._disarm()
        self.timer = asyncio.get_running_loop().call_later(delay_s, self._timed_out, why)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self, why: str) -> None:
        self.timer = None
        if not self.streams:
            self.fail(NO_ERROR, f"{why}: closed after its timeout")
            self.server.changed()

    def _stream_gone(self) -> None:
        self.server.changed()
        if not self.streams and self.transport is not None:
            self._arm(self.server.idle_timeout_s, "idle")

    def flush(self) -> None:
        self.flush_soon = False
        if self.out and self.transport is not None:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def _queue(self, data: bytes) -> None:
        self.out.append(data)
        if not self.receiving and not self.flush_soon:
            # From a task: what else it sends in this turn of the loop goes in one write.
            self.flush_soon = True
            asyncio.get_running_loop().call_soon(self.flush)

    # -- frames ------------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is not None and kind != _CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block without its CONTINUATION")
        if kind in (_DATA, _RST_STREAM, _WINDOW_UPDATE) and (
            stream_id > self.last_stream_id or stream_id % 2 == 0 < stream_id
        ):  # 5.1: only HEADERS (and PRIORITY) may name an idle stream
            raise _ConnectionError(
                PROTOCOL_ERROR, f"a frame of type {kind} on idle stream {stream_id}"
            )
        if kind == _DATA:
            self._data(flags, stream_id, payload)
        elif kind == _HEADERS:
            self._headers_frame(flags, stream_id, payload)
        elif kind == _CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == _SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == _WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == _PING:
            if len(payload) != 8 or stream_id:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a PING frame not of 8 bytes")
            if not flags & _ACK:
                self.out.append(frame(_PING, _ACK, 0, payload))
        elif kind == _RST_STREAM:
            if len(payload) != 4 or not stream_id:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a RST_STREAM frame not of 4 bytes")
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._cancel(stream)
                self._stream_gone()
        elif kind == _PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        elif kind == _PRIORITY and len(payload) != 5:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a PRIORITY frame not of 5 bytes")
        # GOAWAY from the peer: it opens no more streams; those open go on. Others: ignored.

    def _unpad(self, flags: int, payload: bytes) -> bytes:
        if not flags & _PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise _ConnectionError(PROTOCOL_ERROR, "padding longer than its frame")
        return payload[1 : len(payload) - payload[0]]

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            if payload:
                raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame not a multiple of 6")
        for at in range(0, len(payload), 6):
            key = int.from_bytes(payload[at : at + 2], "big")
            value = int.from_bytes(payload[at + 2 : at + 6], "big")
            if key == 0x4:  # SETTINGS_INITIAL_WINDOW_SIZE: every stream's window moves
                if value > _MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, f"an initial window of {value}")
                delta, self.peer_window = value - self.peer_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > _MAX_WINDOW:  # 6.9.2
                        raise _ConnectionError(FLOW_CONTROL_ERROR, "a stream window over 2**31-1")
            elif key == 0x5:
                if not _MAX_FRAME_BYTES <= value <= (1 << 24) - 1:
                    raise _ConnectionError(PROTOCOL_ERROR, f"a max frame size of {value}")
                self.peer_max_frame = value
            elif key == 0x2 and value > 1:
                raise _ConnectionError(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH of {value}")
            # HEADER_TABLE_SIZE: our blocks never index, so any size suits them.
        self.out.append(frame(_SETTINGS, _ACK, 0))
        self._drain_all()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame not of 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not increment and not stream_id:  # 6.9: a protocol error, not flow control's
            raise _ConnectionError(PROTOCOL_ERROR, "a window increment of 0")
        if not stream_id:
            if self.send_window + increment > _MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, f"a window increment of {increment}")
            self.send_window += increment
            self._drain_all()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not increment:
            self._reset(stream, PROTOCOL_ERROR)
            return
        if stream.send_window + increment > _MAX_WINDOW:
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        stream.send_window += increment
        self._drain(stream)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self.unacked += size
        if self.unacked > _CONNECTION_WINDOW:  # more than we granted (6.9.1)
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        if self.unacked >= _CONNECTION_WINDOW // 2:
            self.out.append(frame(_WINDOW_UPDATE, 0, 0, self.unacked.to_bytes(4, "big")))
            self.unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise _ConnectionError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream we ended: what was in flight is dropped
        if stream.remote_closed:
            self._reset(stream, STREAM_CLOSED)
            return
        data = self._unpad(flags, payload)
        stream.unacked += size
        if stream.unacked > _STREAM_WINDOW:  # more than we granted (6.9.1)
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        if stream.ended:
            # Our answer is over (its trailers wait on the peer's window): what comes is
            # dropped, and not granted back, so the peer stops at the window.
            if flags & _END_STREAM:
                self._remote_closed(stream)
            return
        if stream.unacked >= _STREAM_WINDOW // 2 and not flags & _END_STREAM:
            grant = stream.unacked.to_bytes(4, "big")
            self.out.append(frame(_WINDOW_UPDATE, 0, stream_id, grant))
            stream.unacked = 0
        if data:
            stream.inbox += data
            self._messages(stream)
        if flags & _END_STREAM and not stream.ended:
            self._remote_closed(stream)

    def _headers_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = self._unpad(flags, payload)
        if flags & _PRIORITY_FLAG:
            if len(block) < 5:
                raise _ConnectionError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        end_stream = bool(flags & _END_STREAM)
        if flags & _END_HEADERS:
            self._header_block(stream_id, end_stream, block)
        else:
            self.continuing = (stream_id, end_stream, [block])

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is None or self.continuing[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "a CONTINUATION without its HEADERS")
        parts = self.continuing[2]
        parts.append(payload)
        if len(parts) > _MAX_CONTINUATIONS + 1:
            raise _ConnectionError(
                PROTOCOL_ERROR, f"a header block in over {len(parts) - 1} frames"
            )
        if sum(len(part) for part in parts) > _MAX_HEADER_BLOCK_BYTES:
            raise _ConnectionError(PROTOCOL_ERROR, "a header block over 64 KiB")
        if flags & _END_HEADERS:
            _, end_stream, _ = self.continuing
            self.continuing = None
            self._header_block(stream_id, end_stream, b"".join(parts))

    def _header_block(self, stream_id: int, end_stream: bool, block: bytes) -> None:
        try:
            headers = self.decoder.decode(block)  # always: the table must stay in step
        except HpackError as exc:
            raise _ConnectionError(COMPRESSION_ERROR, str(exc)) from exc
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: only END_STREAM matters
            if not end_stream:
                self._reset(stream, PROTOCOL_ERROR)
            elif not stream.ended:
                self._remote_closed(stream)
            return
        if stream_id % 2 == 0:
            raise _ConnectionError(PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}")
        if stream_id <= self.last_stream_id:
            return  # on a stream we ended (its block was decoded, for the table's sake)
        self.last_stream_id = stream_id
        stream = _Stream(stream_id, self.peer_window)
        if self.stopping or len(self.streams) >= self.server.max_streams:
            self.out.append(frame(_RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            return
        malformed = _malformed(headers)
        if malformed:  # 8.1.1: a stream error; the peer learns the code only
            log.info("endpoint picker: a malformed request: %s", malformed)
            self.out.append(frame(_RST_STREAM, 0, stream_id, PROTOCOL_ERROR.to_bytes(4, "big")))
            return
        self.streams[stream_id] = stream
        self._disarm()
        self._open(stream, headers)
        if end_stream and not stream.ended:
            self._remote_closed(stream)

    # -- gRPC on a stream ------------------------------------------------------------

    def _open(self, stream: _Stream, headers: list[tuple[bytes, bytes]]) -> None:
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
        stream.handler = self._guarded(stream, lambda: factory(call))

    def _messages(self, stream: _Stream) -> None:
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

    def _remote_closed(self, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.inbox:
            self.end(stream, INTERNAL, "the stream ended inside a message")
            return
        handler = stream.handler
        if handler is not None:
            self._guarded(stream, handler.half_closed)

    def _guarded(self, stream: _Stream, run: Callable[[], Any]) -> Any:
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

    def _cancel(self, stream: _Stream) -> None:
        stream.ended = True
        handler, stream.handler = stream.handler, None
        if handler is not None:
            try:
                handler.cancelled()
            except Exception:  # cleanup: log it, go on
                log.exception("endpoint picker: cancelling a call failed")

    def _reset(self, stream: _Stream, code: int) -> None:
        self.out.append(frame(_RST_STREAM, 0, stream.stream_id, code.to_bytes(4, "big")))
        if self.streams.pop(stream.stream_id, None) is not None:
            self._cancel(stream)
            self._stream_gone()

    # -- sending ---------------------------------------------------------------------

    def send_data(self, stream: _Stream, data: bytes) -> None:
        if not stream.headers_sent:
            stream.headers_sent = True
            self._queue(frame(_HEADERS, _END_HEADERS, stream.stream_id, _RESPONSE_HEADERS))
        stream.outbox.append(data)
        self._drain(stream)

    def end(self, stream: _Stream, code: int, message: str) -> None:
        if stream.ended:
            return
        stream.ended = True
        block = _trailers(code, message)
        if not stream.headers_sent:  # trailers-only
            stream.headers_sent = True
            block = _RESPONSE_HEADERS + block
        stream.outbox.append((block,))
        self._drain(stream)

    def _end_stream_block(self, stream: _Stream, block: bytes) -> None:
        stream.ended = True
        stream.outbox.append((block,))
        self._drain(stream)

    def _drain(self, stream: _Stream) -> None:
        outbox = stream.outbox
        while outbox:
            item = outbox[0]
            if isinstance(item, tuple):  # the trailers: the stream is done on our side
                outbox.popleft()
                self._queue(frame(_HEADERS, _END_HEADERS | _END_STREAM, stream.stream_id, item[0]))
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
            self._queue(frame(_DATA, 0, stream.stream_id, chunk))

    def _drain_all(self) -> None:
        for stream in list(self.streams.values()):
            if stream.outbox:
                self._drain(stream)

    def _closed(self, stream: _Stream) -> None:
        """Our side ended: a peer still sending is told to stop (RST_STREAM NO_ERROR)."""
        if not stream.remote_closed:
            self._queue(frame(_RST_STREAM, 0, stream.stream_id, NO_ERROR.to_bytes(4, "big")))
        stream.handler = None
        if self.streams.pop(stream.stream_id, None) is not None:
            self._stream_gone()


class GrpcH2Server:
    """The server: a listening socket on the running loop, its connections, a stop."""

    def __init__(
        self,
        methods: Mapping[str, HandlerFactory],
        *,
        max_message_bytes: int,
        max_streams: int = _MAX_STREAMS,
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
            connection.close()
        await server.wait_closed()
        await asyncio.sleep(0)  # the connections' ends: their calls cancelled, rows logged
