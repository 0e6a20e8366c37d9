"""A lean gateway side of the ext_proc stream, for benches: HTTP/2 frames built on a
blocking socket, with no Python gRPC stack.

A gateway is Envoy, C++: what its side of a ``Process`` stream costs is a few frames
written and read. Python's grpc client costs more CPU per stream than the server it
measures (500-1,000 us on a shared 2-core machine, bench/picker_latency), so a bench
driving the picker through it measures mostly itself. This client sends each stream as
one ``sendall`` of HEADERS and two DATA frames (the messages are Envoy's protobufs from
``xds-protos``, serialized once per request body), reads until the first gRPC message
(the endpoint), then half-closes and reads to the trailers. HPACK: literal fields
without indexing (no table to keep); what the server sends in its header blocks is not
decoded (the trailers' end is all it waits for).

One stream at a time on one connection. Must not be used as a gateway: no flow-control
accounting beyond a large window granted up front, no TLS, no header decoding.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY, _WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
_END_STREAM, _END_HEADERS, _ACK = 0x1, 0x4, 0x1
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_INITIAL_WINDOW_SIZE = 0x4
_BIG_WINDOW = 1 << 30
_METHOD = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"


class StreamFailedError(RuntimeError):
    """The server reset the stream, went away, or ended it without a message."""


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, stream id."""
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes((kind, flags))
        + struct.pack(">I", stream_id)
        + payload
    )


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name (RFC 7541, 6.2.2)."""
    return b"\x00" + _length(name) + name + _length(value) + value


def _length(text: bytes) -> bytes:
    """An HPACK string length, no Huffman: a 7-bit prefix, then 7 bits a byte."""
    size = len(text)
    if size < 0x7F:
        return bytes((size,))
    out, size = bytearray((0x7F,)), size - 0x7F
    while size >= 0x80:
        out.append((size & 0x7F) | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out)


def grpc_message(message: Any) -> bytes:
    """A protobuf as one gRPC length-prefixed message (not compressed)."""
    payload: bytes = message.SerializeToString()
    return b"\x00" + struct.pack(">I", len(payload)) + payload


@dataclass(frozen=True)
class StreamTimes:
    """Wall ns from the first byte sent to the first message read, and to the end."""

    first_ns: int
    ended_ns: int
    first: bytes


class LeanExtProcClient:
    """One HTTP/2 connection to an ext_proc server, one stream at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()
        self._next_id = 1
        self._header_block = b"".join(
            (
                literal(b":method", b"POST"),
                literal(b":scheme", b"http"),
                literal(b":path", _METHOD),
                literal(b":authority", f"{host}:{port}".encode()),
                literal(b"content-type", b"application/grpc"),
                literal(b"te", b"trailers"),
            )
        )
        settings = struct.pack(">HI", _INITIAL_WINDOW_SIZE, _BIG_WINDOW)
        grant = struct.pack(">I", _BIG_WINDOW - 65535)  # the connection's window
        self.sock.sendall(
            _PREFACE + frame(_SETTINGS, 0, 0, settings) + frame(_WINDOW_UPDATE, 0, 0, grant)
        )

    def close(self) -> None:
        self.sock.close()

    def stream(self, messages: list[bytes], clock: Any) -> StreamTimes:
        """Send ``messages`` (gRPC-framed) on a new stream, read the first answer, then
        half-close and read to the trailers. ``clock``: a nanosecond clock."""
        stream_id, self._next_id = self._next_id, self._next_id + 2
        out = [frame(_HEADERS, _END_HEADERS, stream_id, self._header_block)]
        out += [frame(_DATA, 0, stream_id, message) for message in messages]
        data = bytearray()
        began = clock()
        self.sock.sendall(b"".join(out))
        first = self._first_message(stream_id, data)
        answered = clock()
        self.sock.sendall(frame(_DATA, _END_STREAM, stream_id, b""))
        while True:
            kind, flags, _ = self._frame_of(stream_id)
            if kind == _HEADERS and flags & _END_STREAM:
                return StreamTimes(first_ns=answered - began, ended_ns=clock() - began, first=first)

    def _first_message(self, stream_id: int, data: bytearray) -> bytes:
        while True:
            if len(data) >= 5:
                size = int.from_bytes(data[1:5], "big")
                if len(data) >= 5 + size:
                    return bytes(data[5 : 5 + size])
            kind, flags, payload = self._frame_of(stream_id)
            if kind == _DATA:
                data += payload
            elif kind == _HEADERS and flags & _END_STREAM:
                raise StreamFailedError(f"stream {stream_id} ended without a message")

    def _frame_of(self, stream_id: int) -> tuple[int, int, bytes]:
        """The next frame of ``stream_id``; control frames answered on the way."""
        while True:
            kind, flags, frame_id, payload = self._read_frame()
            if kind == _SETTINGS and not flags & _ACK:
                self.sock.sendall(frame(_SETTINGS, _ACK, 0, b""))
            elif kind == _PING and not flags & _ACK:
                self.sock.sendall(frame(_PING, _ACK, 0, payload))
            elif kind == _GOAWAY or (kind == _RST_STREAM and frame_id == stream_id):
                raise StreamFailedError(f"frame type {kind} on stream {frame_id}: {payload!r}")
            elif frame_id == stream_id:
                return kind, flags, payload

    def _read_frame(self) -> tuple[int, int, int, bytes]:
        buffer = self._buffer
        while True:
            if len(buffer) >= 9:
                size = int.from_bytes(buffer[:3], "big")
                if len(buffer) >= 9 + size:
                    kind, flags = buffer[3], buffer[4]
                    frame_id = int.from_bytes(buffer[5:9], "big") & 0x7FFFFFFF
                    payload = bytes(buffer[9 : 9 + size])
                    del buffer[: 9 + size]
                    return kind, flags, frame_id, payload
            chunk = self.sock.recv(65536)
            if not chunk:
                raise StreamFailedError("the server closed the connection")
            buffer += chunk
