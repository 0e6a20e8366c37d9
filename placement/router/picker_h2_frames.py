"""HTTP/2's vocabulary for the endpoint picker's own server (``router.picker_h2``):
frame types, flags and error codes (RFC 9113), our limits and windows, one frame's
bytes, a stream's state, and the rules a request's header list must keep (8.2-8.3).

Must not read or write a connection (``router.picker_h2_connection`` does) nor know
gRPC (``router.picker_h2``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# Error codes (RFC 9113, 7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x9
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_FRAME_BYTES = 16384  # ours, the protocol's default: we do not raise it
MAX_HEADER_BLOCK_BYTES = 64 * 1024
#: A header block's CONTINUATIONs: 64 KiB needs 4 of our frames; an endless run of
#: empty ones (which add no bytes) must end too.
MAX_CONTINUATIONS = 32
MAX_STREAMS = 1024
#: A connection with no open stream (or no preface yet) is closed (GOAWAY NO_ERROR).
IDLE_TIMEOUT_S = 300.0
PREFACE_TIMEOUT_S = 10.0
#: Each stream may send us this much before we grant more; the connection, more.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 30
DEFAULT_WINDOW = 65535
MAX_WINDOW = (1 << 31) - 1


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame: 24-bit length, type, flags, stream id, payload."""
    return (
        len(payload).to_bytes(3, "big")
        + bytes((kind, flags))
        + stream_id.to_bytes(4, "big")
        + payload
    )


#: Request pseudo-headers (RFC 9113, 8.3.1) and the fields HTTP/2 forbids (8.2.2).
PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))
CONNECTION_FIELDS = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


def malformed(headers: list[tuple[bytes, bytes]]) -> str:
    """Why a request's header list is malformed (RFC 9113, 8.2-8.3), or ``""``."""
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name != name.lower():
            return f"an upper-case field name {name!r}"
        if name.startswith(b":"):
            if regular or name not in PSEUDO or name in seen:
                return f"the pseudo-header {name!r} out of place, unknown or repeated"
            seen.add(name)
        else:
            regular = True
            if name in CONNECTION_FIELDS or (name == b"te" and value != b"trailers"):
                return f"a connection-specific field {name!r}"
    missing = {b":method", b":scheme", b":path"} - seen
    return f"no {sorted(missing)!r}" if missing else ""


class Stream:
    __slots__ = (
        "deadline",
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
        self.deadline: Any = None  # the call's grpc-timeout, an asyncio.TimerHandle
        self.handler: Any = None  # the gRPC call's Handler (router.picker_h2)
        self.inbox = bytearray()
        self.send_window = send_window
        #: What waits for the peer's windows: DATA payloads, then the trailers' block.
        self.outbox: deque[bytes | tuple[bytes]] = deque()
        self.unacked = 0  # received and not yet granted back
        self.remote_closed = False
        self.headers_sent = False
        self.ended = False


class H2ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def unpad(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise H2ConnectionError(PROTOCOL_ERROR, "padding longer than its frame")
    return payload[1 : len(payload) - payload[0]]


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """A SETTINGS frame's (key, value) pairs, each value checked (6.5.2)."""
    if len(payload) % 6:
        raise H2ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS frame not a multiple of 6")
    pairs = []
    for at in range(0, len(payload), 6):
        key = int.from_bytes(payload[at : at + 2], "big")
        value = int.from_bytes(payload[at + 2 : at + 6], "big")
        if key == 0x4 and value > MAX_WINDOW:
            raise H2ConnectionError(FLOW_CONTROL_ERROR, f"an initial window of {value}")
        if key == 0x5 and not MAX_FRAME_BYTES <= value <= (1 << 24) - 1:
            raise H2ConnectionError(PROTOCOL_ERROR, f"a max frame size of {value}")
        if key == 0x2 and value > 1:
            raise H2ConnectionError(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH of {value}")
        pairs.append((key, value))
    return pairs


class ConnectionOwner(Protocol):
    """What a connection reads from its server (``router.picker_h2.GrpcH2Server``)."""

    connections: set[Any]
    max_streams: int
    idle_timeout_s: float
    preface_timeout_s: float

    def changed(self) -> None:
        """A stream or a connection went (a stop waits on this)."""
