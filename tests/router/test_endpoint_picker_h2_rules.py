"""The picker's own HTTP/2 server against what RFC 9113, RFC 7541 and gRPC over HTTP/2
forbid a peer: each bad frame or block and what the server answers (a GOAWAY or
RST_STREAM with the RFC's error code), read from the bytes it writes. The connection
is driven through a transport twin (the wire as asyncio hands it over), so a peer that
never reads and an idle peer are told apart without sockets or sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from placement.router.picker_h2 import Call, GrpcH2Server
from placement.router.picker_hpack import Decoder, HpackError, integer, literal

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW, CONT = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4
PROTOCOL, FLOW, FRAME_SIZE, REFUSED, COMPRESSION, STREAM_CLOSED = 1, 3, 6, 7, 9, 5


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return (
        len(payload).to_bytes(3, "big")
        + bytes((kind, flags))
        + stream_id.to_bytes(4, "big")
        + payload
    )


def block(*fields: tuple[str, str]) -> bytes:
    return b"".join(literal(name.encode(), value.encode()) for name, value in fields)


GRPC = (
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/t.T/Echo"),
    ("content-type", "application/grpc"),
)


class Wire:
    """The transport twin: what the server wrote, whether it reads, whether it closed."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.reading = True
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        data, out, at = bytes(self.written), [], 0
        while len(data) - at >= 9:
            size = int.from_bytes(data[at : at + 3], "big")
            stream_id = int.from_bytes(data[at + 5 : at + 9], "big")
            out.append((data[at + 3], data[at + 4], stream_id, data[at + 9 : at + 9 + size]))
            at += 9 + size
        return out

    def goaway(self) -> int | None:
        codes = [int.from_bytes(p[4:8], "big") for kind, _, _, p in self.frames() if kind == GOAWAY]
        return codes[-1] if codes else None

    def resets(self) -> list[tuple[int, int]]:
        return [(s, int.from_bytes(p, "big")) for kind, _, s, p in self.frames() if kind == RST]


class Echo:
    """A call that answers each message with ``reply`` bytes and ends at the peer's end."""

    def __init__(self, call: Call, reply: int) -> None:
        self.call, self.reply = call, reply

    def message(self, payload: bytes) -> None:
        self.call.send(b"r" * self.reply if self.reply else payload)

    def half_closed(self) -> None:
        self.call.end()

    def cancelled(self) -> None:
        pass


def connected(
    *sent: bytes, reply: int = 0, max_message_bytes: int = 1 << 20, **options: Any
) -> tuple[Wire, Any]:
    """A connection that has read the preface and ``sent``, in a running loop's turn."""

    async def run() -> tuple[Wire, Any]:
        methods: dict[str, Callable[[Call], Any]] = {"/t.T/Echo": lambda call: Echo(call, reply)}
        server = GrpcH2Server(methods, max_message_bytes=max_message_bytes, **options)
        connection = server.protocol()
        wire = Wire()
        connection.connection_made(wire)
        connection.data_received(PREFACE + frame(SETTINGS, 0, 0))
        for data in sent:
            connection.data_received(data)
        await asyncio.sleep(0)
        connection.flush()
        return wire, connection

    return asyncio.run(run())


def message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


# --- stream ids ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sent",
    [frame(RST, 0, 5, b"\0\0\0\0"), frame(WINDOW, 0, 5, b"\0\0\0\1"), frame(DATA, 0, 3, b"x")],
    ids=["rst-on-idle", "window-update-on-idle", "data-on-idle"],
)
def test_a_frame_on_an_idle_stream_is_a_protocol_error(sent: bytes) -> None:
    wire, _ = connected(sent)
    assert wire.goaway() == PROTOCOL


def test_a_client_stream_with_an_even_id_is_a_protocol_error() -> None:
    wire, _ = connected(frame(HEADERS, END_HEADERS, 2, block(*GRPC)))
    assert wire.goaway() == PROTOCOL


def test_a_new_stream_below_the_last_opened_is_a_protocol_error() -> None:
    """Trailers (END_STREAM) on a stream we ended are dropped; a request's HEADERS on an
    id not above the last opened is an error (ids only increase, 5.1.1)."""
    opened = frame(HEADERS, END_HEADERS, 3, block(*GRPC))
    wire, _ = connected(opened, frame(HEADERS, END_HEADERS | END_STREAM, 1, block(*GRPC)))
    assert wire.goaway() is None
    wire, _ = connected(opened, frame(HEADERS, END_HEADERS, 1, block(*GRPC)))
    assert wire.goaway() == PROTOCOL


# --- SETTINGS, windows -------------------------------------------------------------------


def _settings(key: int, value: int) -> bytes:
    return frame(SETTINGS, 0, 0, key.to_bytes(2, "big") + value.to_bytes(4, "big"))


@pytest.mark.parametrize(
    ("sent", "code"),
    [
        (_settings(0x4, 1 << 31), FLOW),
        (_settings(0x5, 16383), PROTOCOL),
        (_settings(0x5, 1 << 24), PROTOCOL),
        (_settings(0x2, 2), PROTOCOL),
        (frame(SETTINGS, 0x1, 0, b"\0" * 6), FRAME_SIZE),
        (frame(SETTINGS, 0, 0, b"\0" * 5), FRAME_SIZE),
    ],
    ids=["initial-window", "max-frame-low", "max-frame-high", "push", "ack-payload", "not-6"],
)
def test_a_bad_setting_is_a_connection_error(sent: bytes, code: int) -> None:
    wire, _ = connected(sent)
    assert wire.goaway() == code


def test_a_setting_that_lifts_a_stream_window_past_the_limit_is_a_flow_control_error() -> None:
    opened = frame(HEADERS, END_HEADERS, 1, block(*GRPC))
    to_max = frame(WINDOW, 0, 1, ((1 << 31) - 1 - 65535).to_bytes(4, "big"))
    wire, _ = connected(opened, to_max, _settings(0x4, 65536))
    assert wire.goaway() == FLOW


def test_a_window_update_of_zero_is_a_protocol_error() -> None:
    opened = frame(HEADERS, END_HEADERS, 1, block(*GRPC))
    wire, _ = connected(opened, frame(WINDOW, 0, 1, b"\0\0\0\0"))
    assert wire.resets() == [(1, PROTOCOL)]
    wire, _ = connected(frame(WINDOW, 0, 0, b"\0\0\0\0"))
    assert wire.goaway() == PROTOCOL


def test_a_window_past_the_limit_is_a_flow_control_error() -> None:
    wire, _ = connected(frame(WINDOW, 0, 0, ((1 << 31) - 1).to_bytes(4, "big")))
    assert wire.goaway() == FLOW


def test_a_peer_that_sends_on_after_our_end_is_not_granted_more() -> None:
    """Our answer (over the peer's 64 KiB window) waits for a WINDOW_UPDATE that never
    comes; what the peer sends meanwhile is dropped, not granted back on the stream, and
    past the window we granted it is a FLOW_CONTROL_ERROR."""
    opened = frame(HEADERS, END_HEADERS, 1, block(*GRPC))
    chunks = frame(DATA, 0, 1, message(b"hi")) + frame(DATA, 0, 1, b"x" * 16384) * 65
    wire, _ = connected(opened, chunks, reply=70_000)
    updates = [s for kind, _, s, _ in wire.frames() if kind == WINDOW and s == 1]
    assert updates == []
    assert wire.resets() == [(1, FLOW)]


def test_padding_longer_than_its_frame_is_a_protocol_error() -> None:
    opened = frame(HEADERS, END_HEADERS, 1, block(*GRPC))
    wire, _ = connected(opened, frame(DATA, 0x8, 1, b"\x05abc"))
    assert wire.goaway() == PROTOCOL


def test_a_frame_over_our_max_frame_size_is_a_frame_size_error() -> None:
    wire, _ = connected(frame(PING, 0, 0, b"\0" * 16385))
    assert wire.goaway() == FRAME_SIZE


# --- header blocks ---------------------------------------------------------------------


def test_endless_empty_continuations_are_cut_off() -> None:
    opened = frame(HEADERS, 0, 1, block(*GRPC))
    wire, connection = connected(opened + frame(CONT, 0, 1) * 10_000)
    assert wire.goaway() == PROTOCOL
    assert connection.continuing is None or len(connection.continuing[2]) < 100


def test_a_header_list_past_its_limit_is_refused_however_small_its_block() -> None:
    """An entry of 4 KiB in the table, named 20 times by one byte each: 80 KiB of
    headers from a block of 4 KiB (an HPACK bomb)."""
    big = b"\x40" + integer(1, 7) + b"x" + integer(4000, 7) + b"v" * 4000
    with pytest.raises(HpackError, match="header list"):
        Decoder().decode(big + b"\xbe" * 20)
    wire, _ = connected(
        frame(HEADERS, END_HEADERS | END_STREAM, 1, block(*GRPC) + big + b"\xbe" * 20)
    )
    assert wire.goaway() == COMPRESSION


def test_a_table_size_update_after_a_field_is_a_compression_error() -> None:
    with pytest.raises(HpackError, match="table size update"):
        Decoder().decode(b"\x82\x20")
    assert Decoder().decode(b"\x20\x3f\xe1\x1f\x82") == [(b":method", b"GET")]


@pytest.mark.parametrize(
    "hex_block",
    ["8f" + "ff" * 6 + "7f", "ff80808080808001", "0085ffffffffff"],
    ids=["integer-over-the-limit", "over-long-integer", "eos-in-padding"],
)
def test_an_over_long_integer_or_huffman_eos_is_a_compression_error(hex_block: str) -> None:
    with pytest.raises(HpackError):
        Decoder().decode(bytes.fromhex(hex_block))


@pytest.mark.parametrize(
    "fields",
    [
        (("content-type", "application/grpc"), *GRPC[:3]),
        GRPC[:1] + GRPC[2:],
        (*GRPC, (":path", "/t.T/Echo")),
        (*GRPC, (":status", "200")),
        (*GRPC, ("Content-Length", "3")),
        (*GRPC, ("connection", "keep-alive")),
        (*GRPC, ("te", "gzip")),
    ],
    ids=["pseudo-after-regular", "no-scheme", "twice", "response-pseudo", "upper", "conn", "te"],
)
def test_a_malformed_request_is_reset_with_a_protocol_error(
    fields: tuple[tuple[str, str], ...],
) -> None:
    wire, _ = connected(frame(HEADERS, END_HEADERS, 1, block(*fields)))
    assert wire.resets() == [(1, PROTOCOL)]
    assert wire.goaway() is None


# --- limits ----------------------------------------------------------------------------


def test_streams_past_the_concurrent_limit_are_refused() -> None:
    opened = b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, block(*GRPC)) for i in range(3))
    wire, _ = connected(opened, max_streams=2)
    assert wire.resets() == [(5, REFUSED)]


def test_a_message_over_the_limit_ends_the_call_resource_exhausted() -> None:
    opened = frame(HEADERS, END_HEADERS, 1, block(*GRPC))
    wire, _ = connected(opened, frame(DATA, 0, 1, b"\x00\x00\x00\x01\x00"), max_message_bytes=100)
    trailers = [p for kind, flags, _, p in wire.frames() if kind == HEADERS and flags & END_STREAM]
    assert len(trailers) == 1
    assert b"grpc-status" in trailers[0] and literal(b"grpc-status", b"8") in trailers[0]


def test_a_peer_that_does_not_read_is_not_read_from_until_it_does() -> None:
    async def run() -> list[bool]:
        server = GrpcH2Server({}, max_message_bytes=100)
        connection, wire = server.protocol(), Wire()
        connection.connection_made(wire)
        connection.pause_writing()
        seen = [wire.reading]
        connection.resume_writing()
        return [*seen, wire.reading]

    assert asyncio.run(run()) == [False, True]


# --- time ------------------------------------------------------------------------------


@pytest.mark.parametrize("sent", [b"", PREFACE + frame(SETTINGS, 0, 0)], ids=["no-preface", "idle"])
def test_a_silent_connection_is_closed_after_its_timeout(sent: bytes) -> None:
    async def run() -> bytes:
        server = GrpcH2Server({}, max_message_bytes=100, idle_timeout_s=0.01)
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(sent)
            received = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            return received
        finally:
            await server.stop(None)

    wire = Wire()
    wire.written += asyncio.run(run())
    assert wire.goaway() == 0  # NO_ERROR: a polite close, the peer may reconnect


class _Waits:
    """A call that answers nothing and notes when it hears it is over."""

    def __init__(self, over: asyncio.Event) -> None:
        self.over = over

    def message(self, payload: bytes) -> None:
        pass

    def half_closed(self) -> None:
        pass

    def cancelled(self) -> None:
        self.over.set()


@pytest.mark.parametrize(
    ("timeout", "status"), [("1n", b"4"), ("1x", b"13")], ids=["passed", "not-a-timeout"]
)
def test_a_call_past_its_grpc_timeout_ends_deadline_exceeded(timeout: str, status: bytes) -> None:
    async def run() -> Wire:
        over = asyncio.Event()
        server = GrpcH2Server({"/t.T/Wait": lambda call: _Waits(over)}, max_message_bytes=100)
        connection, wire = server.protocol(), Wire()
        connection.connection_made(wire)
        fields = (*GRPC[:2], (":path", "/t.T/Wait"), GRPC[3], ("grpc-timeout", timeout))
        connection.data_received(PREFACE + frame(HEADERS, END_HEADERS, 1, block(*fields)))
        if status == b"4":
            await asyncio.wait_for(over.wait(), 30)  # the deadline's timer, not a sleep
        await asyncio.sleep(0)
        connection.flush()
        return wire

    wire = asyncio.run(run())
    trailers = [p for kind, flags, _, p in wire.frames() if kind == HEADERS and flags & END_STREAM]
    assert len(trailers) == 1
    assert literal(b"grpc-status", status) in trailers[0]


def test_headers_after_the_peer_ended_its_side_reset_the_stream_stream_closed() -> None:
    async def run() -> Wire:
        over = asyncio.Event()
        server = GrpcH2Server({"/t.T/Wait": lambda call: _Waits(over)}, max_message_bytes=100)
        connection, wire = server.protocol(), Wire()
        connection.connection_made(wire)
        fields = (*GRPC[:2], (":path", "/t.T/Wait"), GRPC[3])
        ended = frame(HEADERS, END_HEADERS | END_STREAM, 1, b"")  # trailers, the peer's end
        connection.data_received(
            PREFACE + frame(HEADERS, END_HEADERS, 1, block(*fields)) + ended + ended
        )
        return wire

    wire = asyncio.run(run())
    assert wire.resets() == [(1, STREAM_CLOSED)]


class _EndsAtOnce:
    """A call that answers its first message with more than the peer's window and ends."""

    def __init__(self, call: Call, heard: list[str]) -> None:
        self.call, self.heard = call, heard

    def message(self, payload: bytes) -> None:
        self.call.send(b"r" * 70_000)
        self.call.end()

    def half_closed(self) -> None:
        self.heard.append("half-closed")

    def cancelled(self) -> None:
        self.heard.append("cancelled")


def test_a_call_that_ended_is_not_told_of_the_peers_end_while_its_trailers_wait() -> None:
    heard: list[str] = []

    async def run() -> None:
        server = GrpcH2Server(
            {"/t.T/End": lambda call: _EndsAtOnce(call, heard)}, max_message_bytes=100
        )
        connection = server.protocol()
        connection.connection_made(Wire())
        fields = (*GRPC[:2], (":path", "/t.T/End"), GRPC[3])
        connection.data_received(
            PREFACE
            + frame(HEADERS, END_HEADERS, 1, block(*fields))
            + frame(DATA, 0, 1, message(b"hi"))
            + frame(DATA, END_STREAM, 1, b"")
        )

    asyncio.run(run())
    assert heard == []
