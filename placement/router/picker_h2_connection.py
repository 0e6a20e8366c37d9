"""One HTTP/2 connection (RFC 9113) of the endpoint picker's own server: the preface,
frames read where they arrive, HEADERS with CONTINUATION and padding, HPACK's table
kept in step (``router.picker_hpack``), SETTINGS, PING, RST_STREAM, GOAWAY, flow control
both ways (what is received is granted back, what is sent waits for the peer's
windows), the limits a peer is held to and the idle timer.

What a stream carries (gRPC's calls) is a subclass's: ``router.picker_h2``. Must not
know gRPC.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from placement.router import picker_h2_frames as wire
from placement.router.picker_h2_frames import (
    ConnectionOwner,
    H2ConnectionError,
    Stream,
    frame,
    malformed,
    parse_settings,
    unpad,
)
from placement.router.picker_hpack import Decoder, HpackError

log = logging.getLogger("lorafleet.router")


class H2Connection(asyncio.Protocol):
    """One HTTP/2 connection from a gateway (or a probe): its frames and state. What a
    stream carries is the subclass's (``_open``, ``_messages``, ``_remote_closed``,
    ``_cancel``: ``router.picker_h2``'s gRPC)."""

    # A stream's content and our answers on it: the subclass's (router.picker_h2).
    _open: Callable[[Stream, list[tuple[bytes, bytes]]], None]
    _messages: Callable[[Stream], None]
    _remote_closed: Callable[[Stream], None]
    _cancel: Callable[[Stream], None]
    _drain: Callable[[Stream], None]
    _drain_all: Callable[[], None]

    def __init__(self, server: ConnectionOwner) -> None:
        self.server = server
        self.transport: Any = None
        self.buffer = bytearray()
        self.preface = False
        self.decoder = Decoder()
        self.streams: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.send_window = wire.DEFAULT_WINDOW
        self.peer_window = wire.DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_max_frame = wire.MAX_FRAME_BYTES
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
        settings += (0x4).to_bytes(2, "big") + wire.STREAM_WINDOW.to_bytes(4, "big")
        settings += (0x6).to_bytes(2, "big") + self.decoder.max_list_bytes.to_bytes(4, "big")
        grant = (wire.CONNECTION_WINDOW - wire.DEFAULT_WINDOW).to_bytes(4, "big")
        transport.write(
            frame(wire.SETTINGS, 0, 0, settings) + frame(wire.WINDOW_UPDATE, 0, 0, grant)
        )
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
        except H2ConnectionError as exc:
            self.fail(exc.code, str(exc))
        finally:
            self.receiving = False
            self.flush()

    def _receive(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.preface:
            if len(buffer) < len(wire.PREFACE):
                if not wire.PREFACE.startswith(bytes(buffer)):
                    raise H2ConnectionError(wire.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if buffer[: len(wire.PREFACE)] != wire.PREFACE:
                raise H2ConnectionError(wire.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            del buffer[: len(wire.PREFACE)]
            self.preface = True
            self._arm(self.server.idle_timeout_s, "idle")
        at = 0
        while len(buffer) - at >= 9 and self.transport is not None:
            size = int.from_bytes(buffer[at : at + 3], "big")
            if size > wire.MAX_FRAME_BYTES:
                raise H2ConnectionError(wire.FRAME_SIZE_ERROR, f"a frame of {size} bytes")
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
        self.out.append(frame(wire.GOAWAY, 0, 0, payload))
        self.flush()
        self.transport.close()
        self.transport = None

    def goaway(self) -> None:
        """The server stops: no new streams; those open may end."""
        self.stopping = True
        if self.transport is not None:
            payload = self.last_stream_id.to_bytes(4, "big") + wire.NO_ERROR.to_bytes(4, "big")
            self.out.append(frame(wire.GOAWAY, 0, 0, payload))
            self.flush()

    def close(self) -> None:
        """Close the connection and end its streams now: their handlers hear
        ``cancelled`` (their rows are logged) before the caller goes on. The transport's
        ``connection_lost`` waits until what it holds is written, which a peer that
        reads nothing defers past the router's stop, and its request log's close."""
        if self.transport is not None:
            self.transport.close()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            self._cancel(stream)
        if streams:
            self.server.changed()

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
            self.fail(wire.NO_ERROR, f"{why}: closed after its timeout")
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
        if self.continuing is not None and kind != wire.CONTINUATION:
            raise H2ConnectionError(wire.PROTOCOL_ERROR, "a header block without its CONTINUATION")
        if kind in (wire.DATA, wire.RST_STREAM, wire.WINDOW_UPDATE) and (
            stream_id > self.last_stream_id or stream_id % 2 == 0 < stream_id
        ):  # 5.1: only HEADERS (and PRIORITY) may name an idle stream
            raise H2ConnectionError(
                wire.PROTOCOL_ERROR, f"a frame of type {kind} on idle stream {stream_id}"
            )
        if kind == wire.DATA:
            self._data(flags, stream_id, payload)
        elif kind == wire.HEADERS:
            self._headers_frame(flags, stream_id, payload)
        elif kind == wire.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == wire.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == wire.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == wire.PING:
            if len(payload) != 8 or stream_id:
                raise H2ConnectionError(wire.FRAME_SIZE_ERROR, "a PING frame not of 8 bytes")
            if not flags & wire.ACK:
                self.out.append(frame(wire.PING, wire.ACK, 0, payload))
        elif kind == wire.RST_STREAM:
            if len(payload) != 4 or not stream_id:
                raise H2ConnectionError(wire.FRAME_SIZE_ERROR, "a RST_STREAM frame not of 4 bytes")
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._cancel(stream)
                self._stream_gone()
        elif kind == wire.PUSH_PROMISE:
            raise H2ConnectionError(wire.PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        elif kind == wire.PRIORITY and len(payload) != 5:
            raise H2ConnectionError(wire.FRAME_SIZE_ERROR, "a PRIORITY frame not of 5 bytes")
        # GOAWAY from the peer: it opens no more streams; those open go on. Others: ignored.

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise H2ConnectionError(wire.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & wire.ACK:
            if payload:
                raise H2ConnectionError(wire.FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            return
        for key, value in parse_settings(payload):
            if key == 0x4:  # SETTINGS_INITIAL_WINDOW_SIZE: every stream's window moves
                delta, self.peer_window = value - self.peer_window, value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > wire.MAX_WINDOW:  # 6.9.2
                        raise H2ConnectionError(
                            wire.FLOW_CONTROL_ERROR, "a stream window over 2**31-1"
                        )
            elif key == 0x5:
                self.peer_max_frame = value
            # HEADER_TABLE_SIZE: our blocks never index, so any size suits them.
        self.out.append(frame(wire.SETTINGS, wire.ACK, 0))
        self._drain_all()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(wire.FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame not of 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not increment and not stream_id:  # 6.9: a protocol error, not flow control's
            raise H2ConnectionError(wire.PROTOCOL_ERROR, "a window increment of 0")
        if not stream_id:
            if self.send_window + increment > wire.MAX_WINDOW:
                raise H2ConnectionError(
                    wire.FLOW_CONTROL_ERROR, f"a window increment of {increment}"
                )
            self.send_window += increment
            self._drain_all()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not increment:
            self._reset(stream, wire.PROTOCOL_ERROR)
            return
        if stream.send_window + increment > wire.MAX_WINDOW:
            self._reset(stream, wire.FLOW_CONTROL_ERROR)
            return
        stream.send_window += increment
        self._drain(stream)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(wire.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self.unacked += size
        if self.unacked > wire.CONNECTION_WINDOW:  # more than we granted (6.9.1)
            raise H2ConnectionError(wire.FLOW_CONTROL_ERROR, "DATA past the connection's window")
        if self.unacked >= wire.CONNECTION_WINDOW // 2:
            self.out.append(frame(wire.WINDOW_UPDATE, 0, 0, self.unacked.to_bytes(4, "big")))
            self.unacked = 0
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self.last_stream_id:
                raise H2ConnectionError(wire.PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream we ended: what was in flight is dropped
        if stream.remote_closed:
            self._reset(stream, wire.STREAM_CLOSED)
            return
        data = unpad(flags, payload)
        stream.unacked += size
        if stream.unacked > wire.STREAM_WINDOW:  # more than we granted (6.9.1)
            self._reset(stream, wire.FLOW_CONTROL_ERROR)
            return
        if stream.ended:
            # Our answer is over (its trailers wait on the peer's window): what comes is
            # dropped, and not granted back, so the peer stops at the window.
            if flags & wire.END_STREAM:  # its call heard it was over: not told again
                stream.remote_closed = True
            return
        if stream.unacked >= wire.STREAM_WINDOW // 2 and not flags & wire.END_STREAM:
            grant = stream.unacked.to_bytes(4, "big")
            self.out.append(frame(wire.WINDOW_UPDATE, 0, stream_id, grant))
            stream.unacked = 0
        if data:
            stream.inbox += data
            self._messages(stream)
        if flags & wire.END_STREAM and not stream.ended:
            self._remote_closed(stream)

    def _headers_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(wire.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = unpad(flags, payload)
        if flags & wire.PRIORITY_FLAG:
            if len(block) < 5:
                raise H2ConnectionError(wire.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        end_stream = bool(flags & wire.END_STREAM)
        if flags & wire.END_HEADERS:
            self._header_block(stream_id, end_stream, block)
        else:
            self.continuing = (stream_id, end_stream, [block])

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.continuing is None or self.continuing[0] != stream_id:
            raise H2ConnectionError(wire.PROTOCOL_ERROR, "a CONTINUATION without its HEADERS")
        parts = self.continuing[2]
        parts.append(payload)
        if len(parts) > wire.MAX_CONTINUATIONS + 1:
            raise H2ConnectionError(
                wire.PROTOCOL_ERROR, f"a header block in over {len(parts) - 1} frames"
            )
        if sum(len(part) for part in parts) > wire.MAX_HEADER_BLOCK_BYTES:
            raise H2ConnectionError(wire.PROTOCOL_ERROR, "a header block over 64 KiB")
        if flags & wire.END_HEADERS:
            _, end_stream, _ = self.continuing
            self.continuing = None
            self._header_block(stream_id, end_stream, b"".join(parts))

    def _header_block(self, stream_id: int, end_stream: bool, block: bytes) -> None:
        try:
            headers = self.decoder.decode(block)  # always: the table must stay in step
        except HpackError as exc:
            raise H2ConnectionError(wire.COMPRESSION_ERROR, str(exc)) from exc
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers from the client: only END_STREAM matters
            if stream.remote_closed:  # 5.1: half-closed (remote) takes no more HEADERS
                self._reset(stream, wire.STREAM_CLOSED)
            elif not end_stream:
                self._reset(stream, wire.PROTOCOL_ERROR)
            elif not stream.ended:
                self._remote_closed(stream)
            return
        if stream_id % 2 == 0:
            raise H2ConnectionError(wire.PROTOCOL_ERROR, f"HEADERS opening stream {stream_id}")
        if stream_id <= self.last_stream_id:
            if not end_stream:  # 5.1.1: new streams' ids only increase
                raise H2ConnectionError(
                    wire.PROTOCOL_ERROR,
                    f"HEADERS opening stream {stream_id} after {self.last_stream_id}",
                )
            return  # trailers on a stream we ended (decoded, for the table's sake)
        self.last_stream_id = stream_id
        stream = Stream(stream_id, self.peer_window)
        if self.stopping or len(self.streams) >= self.server.max_streams:
            self.out.append(
                frame(wire.RST_STREAM, 0, stream_id, wire.REFUSED_STREAM.to_bytes(4, "big"))
            )
            return
        why = malformed(headers)
        if why:  # 8.1.1: a stream error; the peer learns the code only
            log.info("endpoint picker: a malformed request: %s", why)
            self.out.append(
                frame(wire.RST_STREAM, 0, stream_id, wire.PROTOCOL_ERROR.to_bytes(4, "big"))
            )
            return
        self.streams[stream_id] = stream
        self._disarm()
        self._open(stream, headers)
        if end_stream and not stream.ended:
            self._remote_closed(stream)

    def _reset(self, stream: Stream, code: int) -> None:
        self.out.append(frame(wire.RST_STREAM, 0, stream.stream_id, code.to_bytes(4, "big")))
        if self.streams.pop(stream.stream_id, None) is not None:
            self._cancel(stream)
            self._stream_gone()
