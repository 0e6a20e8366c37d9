"""A server that answers each path with the exact bytes a test scripts, on 127.0.0.1.

For the wire tests of the pod and Kubernetes clients: an answer is raw HTTP/1.1 (so a
test can send what no well-behaved framework would: a body cut short, a wrong
``Content-Length``, a gzip header over plain bytes, a reset mid-body, an answer slower
than the client's timeout). It runs in a thread, so both blocking clients (the
``kubernetes`` client) and asyncio ones (httpx, aiohttp) talk to it over a real socket.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus


@dataclass(frozen=True, kw_only=True)
class Answer:
    """What the server sends for one request: ``head`` then ``body``, then it closes;
    ``cut_after`` sends only that many bytes of the body and resets the connection;
    ``delay_s`` waits before answering; ``trickle_s`` sends the body a byte at a time,
    that long apart (each read is quick, the whole answer is not)."""

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    content_length: int | None = None
    cut_after: int | None = None
    delay_s: float = 0.0
    trickle_s: float = 0.0

    def raw_head(self) -> bytes:
        reason = (
            HTTPStatus(self.status).phrase if self.status in HTTPStatus._value2member_map_ else ""
        )
        lines = [f"HTTP/1.1 {self.status} {reason}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        length = len(self.body) if self.content_length is None else self.content_length
        lines += [f"Content-Length: {length}", "Connection: close", "", ""]
        return "\r\n".join(lines).encode("latin-1")


def text(
    status: int, body: str | bytes, *, content_type: str = "text/plain", **kw: object
) -> Answer:
    raw = body.encode() if isinstance(body, str) else body
    return Answer(status=status, body=raw, headers=(("Content-Type", content_type),), **kw)  # type: ignore[arg-type]


@dataclass
class WireServer:
    """``answers`` maps ``"METHOD /path"`` (no query) to an ``Answer``; an unscripted
    request answers 404. ``seen`` keeps each request line received."""

    answers: dict[str, Answer] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def start(self) -> WireServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):  # wakes accept() up
            socket.create_connection(self._sock.getsockname()[:2], timeout=1).close()
        self._thread.join(timeout=5)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stopping.is_set():
            conn, _ = self._sock.accept()
            if self._stopping.is_set():
                conn.close()
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                request_line = self._read_request(conn)
            except OSError:
                return
            if not request_line:
                return
            method, target = request_line.split(" ")[:2]
            key = f"{method} {target.split('?', 1)[0]}"
            self.seen.append(key)
            answer = self.answers.get(key, text(404, "no such route"))
            time.sleep(answer.delay_s)
            try:
                conn.sendall(answer.raw_head())
                if answer.trickle_s:
                    for index in range(len(answer.body)):
                        if self._stopping.is_set():
                            return
                        conn.sendall(answer.body[index : index + 1])
                        time.sleep(answer.trickle_s)
                    return
                if answer.cut_after is None:
                    conn.sendall(answer.body)
                    return
                conn.sendall(answer.body[: answer.cut_after])
                # SO_LINGER 0: close sends a RST, as a pod killed mid-answer does.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                return

    @staticmethod
    def _read_request(conn: socket.socket) -> str:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return ""
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
        return lines[0]
