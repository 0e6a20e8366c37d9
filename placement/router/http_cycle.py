"""One HTTP/1.1 request and its response on a client connection: the ASGI ``receive``
and ``send`` the app is given (``router.http_protocol`` owns the connection).

``receive`` hands over the body as the parser gave it (no copy when it came in one
piece), then waits until the client goes away or the response is complete, and says
``http.disconnect``. ``send`` writes the response: a ``Content-Length`` answer as it
is, any other as chunks (``Transfer-Encoding: chunked``), none for HEAD, 204 and 304;
header names and values with control characters are refused (``RuntimeError``, as
uvicorn refuses them), so an answer can never split into two. The head is held until
the first part of the body, or the end of the event loop's iteration, so a whole
answer leaves in one write and a stream's head never waits for its first event.

Once the response is complete the connection is told (``Link.answered``), and a body
the app did not read is dropped as it arrives: a 413 from the Content-Length never
buffers what follows it. Must not know what the app is.

An app that finds its ``send`` is a cycle's own (``cycle_of``: no middleware between)
may answer through the cycle's methods instead of ASGI messages, with the same checks:
``answer`` (a whole answer, its Content-Length added, head and body in one write with
no head held over), ``begin``, ``part`` and ``end`` (a stream), ``body_now`` (the body
if it has all arrived) and ``on_lost`` (called once if the client goes away before the
answer is complete). That skips a message dict per call and the app's own watch for
the disconnect.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Message, Receive, Send], Awaitable[object]]

log = logging.getLogger("uvicorn.error")

#: Past this many bytes of a body read and not taken by the app, reading pauses.
HIGH_WATER_BYTES = 65536
_NAME_FORBIDDEN = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_VALUE_FORBIDDEN = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: Below this size a held head and its body are joined for one write (a copy); above
#: it they go as two buffers of one ``writelines``.
_JOIN_BYTES = 16384


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


_STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}
#: Header pairs already checked, to their lower-cased name. An answer's headers are
#: nearly always the same few (the date, the server, the pod's content type), and two
#: regular expressions and a ``lower`` per header were a third of building a head.
_CHECKED: dict[tuple[bytes, bytes], bytes] = {}
#: Past this many pairs (a new date each second, odd values) the cache starts over.
_CHECKED_MAX = 1024


def _checked_name(pair: Any, given: bytes, value: bytes) -> bytes:
    """``given`` lower-cased, once the pair is known to be a valid header (else
    RuntimeError); a pair that is a tuple is remembered."""
    hashable = type(pair) is tuple
    if hashable:
        name: bytes | None = _CHECKED.get(pair)
        if name is not None:
            return name
    if _NAME_FORBIDDEN.search(given) or _VALUE_FORBIDDEN.search(value):
        raise RuntimeError("Invalid HTTP header name or value.")
    name = given.lower()
    if hashable and type(given) is bytes and type(value) is bytes:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[pair] = name
    return name


class Link(Protocol):
    """What a request's cycle needs of its connection (``RouterHttpProtocol``)."""

    loop: asyncio.AbstractEventLoop
    write_paused: bool

    @property
    def transport(self) -> asyncio.Transport: ...

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]: ...

    def read_more(self) -> None: ...

    async def drain(self) -> None: ...

    def answered(self, cycle: RequestCycle) -> None: ...


class RequestCycle:
    """One request's ``scope``, ``receive`` and ``send``."""

    __slots__ = (
        "_chunked",
        "_chunks",
        "_end_given",
        "_expect_100",
        "_head",
        "_head_only",
        "_link",
        "_remaining",
        "_waiters",
        "body_done",
        "disconnected",
        "keep_alive",
        "on_lost",
        "response_complete",
        "response_started",
        "scope",
    )

    def __init__(self, link: Link, scope: Message, *, keep_alive: bool, expect_100: bool) -> None:
        self._link = link
        self.scope = scope
        self.keep_alive = keep_alive
        self._expect_100 = expect_100
        self._head_only = scope["method"] == "HEAD"
        self._chunks: list[bytes] = []
        self.body_done = self._end_given = False
        self.disconnected = self.response_started = self.response_complete = False
        self._waiters: list[asyncio.Future[None]] = []
        self._head: bytes | None = None
        self._chunked: bool | None = None
        self._remaining = 0
        #: Called once if the client goes away before the answer is complete.
        self.on_lost: Callable[[], None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the connection, and so the request's task, runs on."""
        return self._link.loop

    # -- from the connection -----------------------------------------------------------

    def add_body(self, body: bytes) -> int:
        """A part of the request's body; how many bytes now wait to be received."""
        if self.response_complete:
            return 0
        chunks = self._chunks
        chunks.append(body)
        self._wake()
        return len(body) if len(chunks) == 1 else sum(map(len, chunks))

    def end_body(self) -> None:
        self.body_done = True
        self._wake()

    def lost(self) -> None:
        """The client closed the connection."""
        if not self.response_complete:
            self.disconnected = True
            gone, self.on_lost = self.on_lost, None
            if gone is not None:
                gone()
        self._wake()

    # -- the app's side ----------------------------------------------------------------

    async def run(self, app: App) -> None:
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self._link.transport.close()
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned '%s'.", result)
                self._link.transport.close()
            elif not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self._link.transport.close()

    async def receive(self) -> Message:
        if self._expect_100:
            self._expect_100 = False
            transport = self._link.transport
            if not transport.is_closing():
                transport.write(_CONTINUE)
        while not (self.disconnected or self.response_complete):
            chunks = self._chunks
            if chunks or (self.body_done and not self._end_given):
                body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self._chunks = []
                more = not self.body_done
                self._end_given = not more
                self._link.read_more()
                return {"type": "http.request", "body": body, "more_body": more}
            self._link.read_more()
            # Each receiver waits on its own future (an app may listen for the
            # disconnect while it reads the body), and every one is woken; a receiver
            # cancelled meanwhile leaves a cancelled future, which the wake passes over.
            waiter = self._link.loop.create_future()
            self._waiters.append(waiter)
            await waiter
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if await self._gone():
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{kind}'."
                )
            self._start(message["status"], message.get("headers", ()))
            self._link.loop.call_soon(self._flush_head)
            return
        if self.response_complete:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' after the response's end.")
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
        self._body(message.get("body", b""), more=message.get("more_body", False))

    # -- the app's side, without ASGI messages ---------------------------------------

    def body_now(self) -> bytes | None:
        """The request's whole body if it has all arrived and none of it was taken (no
        100 Continue owed), else None: ``receive`` then reads it."""
        if not self.body_done or self._end_given or self._expect_100:
            return None
        chunks, self._chunks = self._chunks, []
        self._end_given = True
        self._link.read_more()
        if len(chunks) == 1:
            return chunks[0]
        return b"".join(chunks)

    async def answer(self, status: int, headers: Any, body: bytes) -> None:
        """A whole answer, its ``content-length`` added here: one write."""
        if await self._gone():
            return
        if self.response_started:
            raise RuntimeError("An answer after the response's start.")
        self._start(status, headers, length=len(body))
        self._body(body, more=False)

    async def begin(self, status: int, headers: Any) -> None:
        """A response's status and headers (held until the body's first part, or the
        end of the event loop's iteration)."""
        if await self._gone():
            return
        if self.response_started:
            raise RuntimeError("A second response start.")
        self._start(status, headers)
        self._link.loop.call_soon(self._flush_head)

    async def part(self, body: bytes) -> None:
        """A part of the response's body, more to follow."""
        if not await self._gone():
            self._body(body, more=True)

    async def end(self, body: bytes = b"") -> None:
        """The response body's last part: the response is complete."""
        if not await self._gone():
            self._body(body, more=False)

    async def _gone(self) -> bool:
        """Waits while the connection's writes are paused; True once the client is gone
        (nothing more is written)."""
        if self._link.write_paused and not self.disconnected:
            await self._link.drain()
        return self.disconnected

    def _body(self, body: bytes, *, more: bool) -> None:
        if not self.response_started:
            raise RuntimeError("A response body before the response's start.")
        if self.response_complete:
            raise RuntimeError("A response body after the response's end.")
        if self._head_only:
            out = b""
            self._remaining = 0
        elif self._chunked:
            out = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
            if not more:
                out += b"0\r\n\r\n"
        else:
            if len(body) > self._remaining:
                raise RuntimeError("Response content longer than Content-Length")
            self._remaining -= len(body)
            out = body
        self._write(out)
        if not more:
            if self._remaining != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self._wake()
            link = self._link
            if not self.keep_alive:
                link.transport.close()
            link.answered(self)

    # -- the rest ----------------------------------------------------------------------

    def _start(self, status: int, headers: Any, *, length: int | None = None) -> None:
        """The head, held in ``_head`` until the body's first write; ``length``: the
        Content-Length to add (a whole answer's)."""
        self.response_started = True
        self._expect_100 = False
        parts = [_STATUS_LINES.get(status) or _status_line(status)]
        defaults = self._link.default_headers
        closes = False
        for pair in [*defaults, *headers] if defaults else headers:
            given, value = pair
            name = _checked_name(pair, given, value)
            if name == b"content-length" and self._chunked is None:
                self._remaining = int(value.decode())
                self._chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self._remaining = 0
                self._chunked = True
            elif name == b"connection" and b"close" in [
                t.strip() for t in value.lower().split(b",")
            ]:
                self.keep_alive = False
                closes = True
            parts += (name, b": ", value, b"\r\n")
        if length is not None and self._chunked is None:
            self._remaining = length
            self._chunked = False
            parts.append(b"content-length: %d\r\n" % length)
        if not self.keep_alive and not closes:
            parts.append(b"connection: close\r\n")
        if self._chunked is None and not self._head_only and status not in (204, 304):
            self._chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
        parts.append(b"\r\n")
        self._head = b"".join(parts)

    def _write(self, data: bytes) -> None:
        head = self._head
        transport = self._link.transport
        if head is None:
            if data:
                transport.write(data)
        elif len(data) < _JOIN_BYTES:
            self._head = None
            transport.write(head + data)
        else:
            self._head = None
            transport.writelines((head, data))

    def _flush_head(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            transport = self._link.transport
            if not transport.is_closing():
                transport.write(head)

    def _wake(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _send_500(self) -> None:
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", b"21"),
            (b"connection", b"close"),
        ]
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})


def cycle_of(send: Send) -> RequestCycle | None:
    """The cycle whose own ``send`` this is (no middleware wrapped it), else None."""
    cycle = getattr(send, "__self__", None)
    return cycle if type(cycle) is RequestCycle else None
