"""The router's HTTP/1.1 server protocol at the wire (``router.http_protocol``): raw
sockets against uvicorn serving a small ASGI app on port 0. Nothing sleeps: the app
tells the test what it saw through events, and reads end at what they wait for."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

from placement.router import http_protocol
from placement.router.http_protocol import MAX_HEAD_BYTES, RouterHttpProtocol

from .processes import wait_for

Message = MutableMapping[str, Any]


class _App:
    """``/whole``: head and body at once. ``/stream``: the head, then a chunk once the
    test says so (``release``). ``/echo``: the request's body back. ``/refuse``: 413
    without reading the body. ``/events``: one event, then waits for the client to go."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.disconnected = threading.Event()

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/whole":
            await _answer(send, 200, b"hello", b"text/plain")
        elif path == "/echo":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            await _answer(send, 200, body, b"application/octet-stream")
        elif path == "/refuse":
            await _answer(send, 413, b"too large", b"text/plain")
        elif path in ("/events", "/events-two-listeners"):
            head = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
            listeners = 2 if path == "/events-two-listeners" else 1
            await asyncio.gather(*(_until_disconnect(receive) for _ in range(listeners)))
            self.disconnected.set()
        else:
            head = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            while not self.release.is_set():
                await asyncio.sleep(0)  # yield to the loop: the head must leave meanwhile
            await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _answer(send: Any, status: int, body: bytes, kind: bytes) -> None:
    head = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def _serving(app: _App, *, keep_alive_s: float = 5.0) -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    config = uvicorn.Config(
        app,
        http=RouterHttpProtocol,
        loop="asyncio",
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]  # uvicorn says int; a float works
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout_s=10, what="uvicorn")
        yield int(sock.getsockname()[1])
    finally:
        app.release.set()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


class _Client:
    """A raw connection that reads answers one by one (Content-Length or chunked)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            chunk = self.sock.recv(65536)
            assert chunk, f"connection closed before {marker!r}: {self.buffer!r}"
            self.buffer += chunk
        end = self.buffer.index(marker) + len(marker)
        data, self.buffer = self.buffer[:end], self.buffer[end:]
        return data

    def answer(self) -> tuple[bytes, bytes]:
        """The next answer's head and body (a Content-Length body)."""
        head = self.read_until(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(self.buffer) < length:
            chunk = self.sock.recv(65536)
            assert chunk, f"connection closed in a body: {self.buffer!r}"
            self.buffer += chunk
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return head, body

    def closed(self) -> bool:
        """True once the server closed the connection (all it sent read first)."""
        while chunk := self.sock.recv(65536):
            self.buffer += chunk
        return True


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "host: x", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


# -- one send per answer, streams never held ----------------------------------------------


def test_a_whole_answer_arrives_with_its_head() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(b"GET /whole HTTP/1.1\r\nhost: x\r\n\r\n")
        data = client.read_until(b"hello")
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"content-length: 5\r\n\r\nhello" in data


def test_a_streams_head_leaves_before_its_first_chunk() -> None:
    app = _App()
    with _serving(app) as port, _Client(port) as client:
        client.send(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        head = client.read_until(b"\r\n\r\n")  # would time out if held for the body
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked" in head
        assert b"data: 1" not in head
        app.release.set()
        assert b"data: 1" in client.read_until(b"0\r\n\r\n")


# -- connections -----------------------------------------------------------------------


def test_a_kept_alive_connection_serves_one_request_after_another() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        for i in range(3):
            client.send(_post("/echo", b"request %d" % i))
            head, body = client.answer()
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection" not in head
            assert body == b"request %d" % i


def test_a_body_split_across_packets_is_received_whole() -> None:
    body = b'{"model": "a", "prompt": "' + b"x" * 100_000 + b'"}'
    with _serving(_App()) as port, _Client(port) as client:
        request = _post("/echo", body)
        for start in range(0, len(request), 7_000):  # the head split too
            client.send(request[start : start + 7_000])
        assert client.answer()[1] == body


def test_a_chunked_request_body_is_received_whole() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        client.send(b"5\r\nhello\r\n")
        client.send(b"6\r\n world\r\n0\r\n\r\n")
        assert client.answer()[1] == b"hello world"


def test_pipelined_requests_are_answered_in_order() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(b"".join(_post("/echo", b"number %d" % i) for i in range(5)))
        assert [client.answer()[1] for _ in range(5)] == [b"number %d" % i for i in range(5)]


def test_connection_close_is_honoured() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(_post("/echo", b"last", "connection: close"))
        head, body = client.answer()
        assert b"connection: close\r\n" in head and body == b"last"
        assert client.closed()


def test_a_request_pipelined_behind_connection_close_leaves_the_first_answered() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(_post("/echo", b"last", "connection: close") + _post("/echo", b"ignored"))
        head, body = client.answer()
        assert b"connection: close\r\n" in head and body == b"last"
        assert client.closed() and client.buffer == b""


def test_an_http_1_0_request_gets_its_answer_and_the_connection_closes() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(b"GET /whole HTTP/1.0\r\n\r\n")
        head, body = client.answer()
        assert b"connection: close\r\n" in head and body == b"hello"
        assert client.closed()


# -- bodies: Expect, refused, oversize ---------------------------------------------------


def test_expect_100_continue_is_answered_when_the_app_reads_the_body() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(_post("/echo", b"", "expect: 100-continue").replace(b"length: 0", b"length: 4"))
        assert client.read_until(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        client.send(b"body")
        assert client.answer()[1] == b"body"


def test_an_answer_without_reading_sends_no_100_and_drops_the_body() -> None:
    big = b"x" * 2_000_000
    with _serving(_App()) as port, _Client(port) as client:
        head = _post("/refuse", b"", "expect: 100-continue")
        client.send(head.replace(b"length: 0", b"length: %d" % len(big)))
        answer_head, _ = client.answer()
        assert answer_head.startswith(b"HTTP/1.1 413 ")
        # A client that sends the body anyway: it is dropped, the connection goes on.
        client.send(big + _post("/echo", b"next"))
        assert client.answer()[1] == b"next"


# -- failures ----------------------------------------------------------------------------


def test_malformed_http_is_a_400_and_the_connection_closes() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(b"NOT HTTP AT ALL\r\n\x00\x01\r\n\r\n")
        head, body = client.answer()
        assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert b"connection: close\r\n" in head and body == b"Invalid HTTP request received."
        assert client.closed()


def test_a_head_that_never_ends_is_a_431_and_the_connection_closes() -> None:
    """A header value that goes on and on: refused once past the limit, not buffered."""
    flood = b"x" * (16 * MAX_HEAD_BYTES)

    def send_all(client: _Client) -> None:
        with contextlib.suppress(OSError):  # the server closes while this still sends
            client.send(b"GET /whole HTTP/1.1\r\nhost: x\r\nx-long: " + flood)

    with _serving(_App()) as port, _Client(port) as client:
        sender = threading.Thread(target=send_all, args=(client,), daemon=True)
        sender.start()
        head, body = client.answer()
        assert head.startswith(b"HTTP/1.1 431 ") and b"connection: close\r\n" in head
        assert body == b"Request head too large."
        sender.join(timeout=10)


@pytest.mark.parametrize(
    "framing",
    [
        pytest.param(b"transfer-encoding: chunked\r\n\r\nzz\r\nabcd\r\n0\r\n\r\n", id="chunk-size"),
        pytest.param(b"transfer-encoding: chunked\r\n\r\n4;x\nabcd\r\n0\r\n\r\n", id="bare-lf"),
        pytest.param(b"transfer-encoding: gzip\r\n\r\nabcd", id="not-chunked-last"),
    ],
)
def test_a_body_framed_invalidly_after_a_valid_head_is_a_400(framing: bytes) -> None:
    """The head started the app; the body's framing fails the parser: still a 400."""
    with _serving(_App()) as port, _Client(port) as client:
        client.send(b"POST /echo HTTP/1.1\r\nhost: x\r\n" + framing)
        head, body = client.answer()
        assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert body == b"Invalid HTTP request received." and client.closed()


@pytest.mark.parametrize("path", ["/events", "/events-two-listeners"], ids=["one", "two"])
def test_a_client_gone_mid_stream_is_a_disconnect_for_every_receiver(path: str) -> None:
    """Two ``receive`` calls waiting at once (a disconnect listener beside the app's
    own) are both told."""
    app = _App()
    with _serving(app) as port:
        with _Client(port) as client:
            client.send(b"GET %s HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
            assert b"data: 1" in client.read_until(b"data: 1\n\n")
        assert app.disconnected.wait(timeout=10)
        with _Client(port) as client:  # the server goes on
            client.send(b"GET /whole HTTP/1.1\r\nhost: x\r\n\r\n")
            assert client.answer()[1] == b"hello"


def test_a_fragment_in_the_url_is_not_part_of_the_path() -> None:
    with _serving(_App()) as port, _Client(port) as client:
        client.send(b"GET /whole#section HTTP/1.1\r\nhost: x\r\n\r\n")
        assert client.answer()[1] == b"hello"


def _trickle_until_closed(client: _Client) -> bool:
    """Send a head a byte every 50 ms that never ends; True once the server closed."""
    client.send(b"GET /whole HTTP/1.1\r\nhost: x\r\n")
    client.sock.settimeout(0.05)
    for _ in range(400):  # up to 20 s of bytes, one a wait of 50 ms on the socket
        try:
            if client.sock.recv(65536) == b"":
                return True  # closed by the server
        except TimeoutError:
            pass
        try:
            client.send(b"x")
        except OSError:
            return True  # closed by the server as the byte went
    return False


def test_a_head_trickled_in_byte_by_byte_is_closed_after_the_keep_alive() -> None:
    """Each byte comes well inside the keep-alive, but the head never completes: the
    connection closes once the head is ``timeout_keep_alive`` old (here 0.5 s), where
    before every byte kept it open."""
    with _serving(_App(), keep_alive_s=0.5) as port, _Client(port) as client:
        assert _trickle_until_closed(client), "a head that never ended kept its connection"


def test_a_head_trickled_in_is_closed_at_its_own_limit_under_a_long_keep_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keep-alive outlasts the clients' (75 s by default); a head that never ends
    still closes at ``HEAD_TIMEOUT_S`` from its first byte (here 0.5 s, keep-alive 60 s),
    the timer moved forward for it."""
    monkeypatch.setattr(http_protocol, "HEAD_TIMEOUT_S", 0.5)
    with _serving(_App(), keep_alive_s=60.0) as port, _Client(port) as client:
        assert _trickle_until_closed(client), "a head that never ended kept its connection"
        with _Client(port) as second:  # a whole request on a new connection is served
            second.send(b"GET /whole HTTP/1.1\r\nhost: x\r\n\r\n")
            assert second.answer()[0].startswith(b"HTTP/1.1 200")
