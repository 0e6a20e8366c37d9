"""The router's uvicorn protocol: a whole answer in one send, and a stream's head never
held back waiting for its body."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import uvicorn

from placement.router.lean_http import LeanHttpToolsProtocol

from .processes import wait_for

Message = MutableMapping[str, Any]


class _App:
    """``/whole``: head and body at once. ``/stream``: the head, then a chunk only once
    the test says so (``release``), proving the client saw the head before."""

    def __init__(self) -> None:
        self.release = threading.Event()

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/whole":
            head = [(b"content-type", b"text/plain"), (b"content-length", b"5")]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": b"hello"})
            return
        head = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        while not self.release.is_set():
            await asyncio.sleep(0)  # yield to the loop: the head must leave meanwhile
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})


@contextmanager
def _serving(app: _App) -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    config = uvicorn.Config(
        app, http=LeanHttpToolsProtocol, loop="asyncio", lifespan="off", log_level="warning"
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


def _get(port: int, path: str) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    return client


def _read_until(client: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = client.recv(65536)
        assert chunk, f"connection closed before {marker!r}: {data!r}"
        data += chunk
    return data


def test_a_whole_answer_arrives_with_its_head() -> None:
    with _serving(_App()) as port, _get(port, "/whole") as client:
        data = _read_until(client, b"hello")
        assert data.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"content-length: 5\r\n\r\nhello" in data


def test_a_streams_head_leaves_before_its_first_chunk() -> None:
    app = _App()
    with _serving(app) as port, _get(port, "/stream") as client:
        head = _read_until(client, b"\r\n\r\n")  # would time out if held for the body
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"data: 1" not in head
        app.release.set()
        assert b"data: 1" in _read_until(client, b"0\r\n\r\n")
