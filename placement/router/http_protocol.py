"""The router's HTTP/1.1 server protocol, for uvicorn: httptools' parser and as little
Python per request as an ASGI server can run.

``uvicorn.Config(http=RouterHttpProtocol)``. uvicorn keeps what it owns: the sockets,
the signals, the lifespan, the logging and the graceful shutdown (it finds this
protocol's connections and tasks in its ``ServerState`` and calls ``shutdown``). This
module owns each connection: parsing the requests, the ASGI ``scope``, ``receive`` and
``send`` of each (``router.http_cycle``), keep-alive, pipelining and flow control.
It must not know the router: any ASGI 3 app runs on it.

What it does as uvicorn's httptools protocol does, with less work per request:

- keep-alive: HTTP/1.1 unless the client says ``Connection: close`` (or speaks 1.0
  without keep-alive); an idle connection is closed after ``timeout_keep_alive``,
  checked by one timer per connection re-armed lazily rather than one per request,
  and so is a request head not complete within ``HEAD_TIMEOUT_S`` (or the keep-alive,
  if shorter) of its first byte (a client that trickles a head in byte by byte does
  not hold the connection; uvicorn's does);
- pipelining: requests parsed while one is answered wait in order, and reading pauses
  until the answer is done; request bodies past 64 KiB unread pause reading too;
- a malformed request is answered 400 (plain text, ``connection: close``) and closed;
  a request's head past ``MAX_HEAD_BYTES`` (64 KiB) is answered 431 and closed;
- a response's head leaves with its first body part in one write (a whole answer is
  one ``send`` to the socket); a stream's head is written at the end of the event
  loop's iteration at the latest, so nothing waits for the body;
- a client gone mid-answer: ``receive`` says ``http.disconnect``, ``send`` writes
  nothing more;
- ``Expect: 100-continue`` is answered when the app first reads the body; an
  app that answers without reading it (a 413 from ``Content-Length``) sends no 100.

No access log, no WebSocket (an upgrade request is served as plain HTTP, as uvicorn
does without a WebSocket library), no HTTPS.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections import deque
from typing import Any, cast

import httptools
from uvicorn.config import Config
from uvicorn.server import ServerState

from placement.router.http_cycle import HIGH_WATER_BYTES, RequestCycle

log = logging.getLogger("uvicorn.error")

_BAD_REQUEST = b"Invalid HTTP request received."
_HEAD_TOO_LARGE = b"Request head too large."
#: A request's line and headers past this many bytes are refused (431): httptools sets
#: no limit and buffers a header's value whole, so without one a client could fill
#: the memory with a head that never ends.
MAX_HEAD_BYTES = 65536
#: A request's head must be whole this many seconds after its first byte (or within
#: the keep-alive, if shorter): the keep-alive is long (it must outlast the clients'),
#: and a head trickled in a byte at a time should not hold a connection that long.
HEAD_TIMEOUT_S = 10.0


def _address(transport: asyncio.BaseTransport, *, peer: bool) -> tuple[str, int] | None:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        info = sock.getpeername() if peer else sock.getsockname()
    except OSError:
        return None
    return (str(info[0]), int(info[1])) if isinstance(info, tuple) else None


class RouterHttpProtocol(asyncio.Protocol):
    """One client connection: its parser, its requests in order, its keep-alive."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self._parser = httptools.HttpRequestParser(self)
        # Data after a ``Connection: close`` request (a pipelined request behind it) is
        # ignored, as uvicorn ignores it, instead of failing the parser: else the
        # request before it would go unanswered.
        self._parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self._keepalive_s = float(config.timeout_keep_alive)
        self._head_limit_s = min(self._keepalive_s, HEAD_TIMEOUT_S)
        self._root_path = config.root_path
        self._transport: asyncio.Transport | None = None
        self._server: tuple[str, int] | None = None
        self._client: tuple[str, int] | None = None
        #: The request being parsed (the newest), and those waiting behind the running one.
        self._parsing: RequestCycle | None = None
        self._waiting: deque[RequestCycle] = deque()
        self._running: RequestCycle | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect_100 = False
        #: Whether a request's head is being parsed, and its bytes in reads wholly
        #: within it (the read it began in is not counted: at most one read over).
        self._in_head = False
        self._head_bytes = 0
        self._head_started_s = 0.0
        self._read_paused = False
        self.write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._last_active_s = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.server_state.connections.add(self)  # type: ignore[arg-type]
        self._transport = cast(asyncio.Transport, transport)
        self._server = _address(transport, peer=False)
        self._client = _address(transport, peer=True)
        self._last_active_s = self.loop.time()
        self._idle_timer = self.loop.call_at(self._last_active_s + self._keepalive_s, self._idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server_state.connections.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        for cycle in (self._running, self._parsing, *self._waiting):
            if cycle is not None:
                cycle.lost()
        self._waiting.clear()
        self.resume_writing()
        if exc is None and self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        self._last_active_s = self.loop.time()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            log.warning("Unsupported upgrade request.")
        except httptools.HttpParserError:
            log.warning(_BAD_REQUEST.decode())
            self._refuse(b"400 Bad Request", _BAD_REQUEST)
            return
        if self._in_head:
            if self._head_bytes > MAX_HEAD_BYTES:
                log.warning(_HEAD_TOO_LARGE.decode())
                self._refuse(b"431 Request Header Fields Too Large", _HEAD_TOO_LARGE)
            else:  # a head split over reads: its own deadline, if the timer's is later
                self._check_head_by(self._head_started_s + self._head_limit_s)

    def eof_received(self) -> None:
        return None

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    # -- httptools' callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._head_started_s = self.loop.time()
        self._url = b""
        self._headers = []
        self._expect_100 = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_100 = True
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        version = parser.get_http_version()
        raw_path, _, query = self._url.partition(b"?")
        if not raw_path.startswith(b"/") or b"#" in self._url:  # absolute-form, "*", a fragment
            parsed = httptools.parse_url(self._url)
            raw_path, query = parsed.path or b"/", parsed.query or b""
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "server": self._server,
            "client": self._client,
            "scheme": "http",
            "method": parser.get_method().decode("ascii"),
            "root_path": self._root_path,
            "path": self._root_path + path,
            "raw_path": self._root_path.encode("ascii") + raw_path,
            "query_string": query,
            "headers": self._headers,
            "state": self.app_state.copy(),
        }
        keep_alive = version != "1.0" and parser.should_keep_alive()
        cycle = self._parsing = RequestCycle(
            self, scope, keep_alive=keep_alive, expect_100=self._expect_100
        )
        running = self._running
        if running is None or running.response_complete:
            self._start(cycle)
        else:  # pipelined: answered in order, once those before it are
            self._pause_reading()
            self._waiting.append(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self._parsing
        if cycle is not None and cycle.add_body(body) > HIGH_WATER_BYTES:
            self._pause_reading()

    def on_message_complete(self) -> None:
        if self._parsing is not None:
            self._parsing.end_body()

    # -- Link: what an cycle asks of its connection ---------------------------------

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None
        return self._transport

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self.server_state.default_headers

    def read_more(self) -> None:
        if self._read_paused and not self._waiting:
            self._read_paused = False
            self.transport.resume_reading()

    async def drain(self) -> None:
        if self.write_paused:
            if self._drained is None:
                self._drained = self.loop.create_future()
            await self._drained

    def answered(self, cycle: RequestCycle) -> None:
        """``cycle``'s response is complete: the next pipelined request, if any."""
        self.server_state.total_requests += 1
        self._last_active_s = self.loop.time()
        if self.transport.is_closing():
            return
        if self._waiting:
            self._start(self._waiting.popleft())
        self.read_more()

    # -- the rest ----------------------------------------------------------------------

    def _start(self, cycle: RequestCycle) -> None:
        limit = self.config.limit_concurrency
        app = self.app
        if limit is not None and (
            len(self.server_state.connections) >= limit or len(self.server_state.tasks) >= limit
        ):
            log.warning("Exceeded concurrency limit.")
            app = _service_unavailable
        self._running = cycle
        task = self.loop.create_task(cycle.run(app))
        tasks = self.server_state.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _pause_reading(self) -> None:
        if not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def _check_head_by(self, due_s: float) -> None:
        timer = self._idle_timer
        if timer is None or timer.when() > due_s:
            if timer is not None:
                timer.cancel()
            self._idle_timer = self.loop.call_at(due_s, self._idle)

    def _idle(self) -> None:
        """The keep-alive check: close a connection idle for ``timeout_keep_alive``."""
        self._idle_timer = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        cycle = self._running
        now_s = self.loop.time()
        if self._in_head and (cycle is None or cycle.response_complete):
            # A head gets ``HEAD_TIMEOUT_S`` (at most the keep-alive) from its first
            # byte, however it trickles in: a client sending a byte now and then cannot
            # hold the connection.
            due_s = self._head_started_s + self._head_limit_s
        elif cycle is not None and not cycle.response_complete:
            due_s = now_s + self._keepalive_s  # busy: look again later
        else:
            due_s = self._last_active_s + self._keepalive_s
        if due_s <= now_s:
            transport.close()
            return
        self._idle_timer = self.loop.call_at(due_s, self._idle)

    def _refuse(self, status: bytes, body: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        cycle = self._running
        # Unless an answer is under way (the 400 would cut into it): a body's framing
        # found invalid after its head started the app is answered too. The app's own
        # answer then goes nowhere: the transport is closing.
        if cycle is None or not cycle.response_started or cycle.response_complete:
            head = (
                b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n" % (status, len(body))
            )
            transport.write(head + body)
        transport.close()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close now if idle, else after this answer."""
        cycle = self._running
        if cycle is None or cycle.response_complete:
            self.transport.close()
        else:
            cycle.keep_alive = False
            self._waiting.clear()


async def _service_unavailable(scope: Any, receive: Any, send: Any) -> None:
    body = b"Service Unavailable"
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", b"%d" % len(body)),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
