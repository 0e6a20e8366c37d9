"""The proxy's upstream client: HTTP/1.1 keep-alive to the pods on asyncio protocols.

``Upstreams`` owns one pool of idle connections per pod address and sends a request
(``post``) as its head and body in one ``writelines``; the answer is parsed by
httptools' response parser (the one uvicorn's server side uses) and read back whole
(``Reply.read``) or chunk by chunk as the pod wrote it (``Reply.chunk``), so an SSE
stream passes through unchanged. Nothing is decompressed, and no header is added
beyond Host, Content-Type, Content-Length and the client's Authorization.

Failures are ``OSError``s that name the pod, as the proxy's callers expect of a pod
that could not be reached: ``UpstreamError`` (a ``ConnectionError``: refused, reset,
closed before the answer ended, or an answer that is not HTTP) and ``UpstreamTimeoutError``
(a ``TimeoutError``: no connection within ``connect_timeout_s``, or the whole exchange
past ``timeout_s``). A pooled connection that fails before the answer's first byte is
retried once on a fresh one: the pod may have closed it while it sat idle, and the
request never reached it. An idle connection is kept ``keepalive_s`` at most, under the
engines' own keep-alive (uvicorn and vLLM close one after 5 s idle).

``Reply.release`` gives the connection back to the pool when its answer was read to
the end and the pod keeps it alive, and closes it otherwise (an answer left unread,
a cancelled request). Owns no routing: the caller passes the pod and the URL.
"""

from __future__ import annotations

import asyncio
import collections
from typing import cast
from urllib.parse import urlsplit

import httptools

#: Past this many bytes read and not yet taken, the pod's socket is not read.
_HIGH_WATER = 256 * 1024

__all__ = ["Reply", "UpstreamError", "UpstreamTimeoutError", "Upstreams"]


class UpstreamError(ConnectionError):
    """A pod could not be reached, or answered something that is not HTTP/1.1."""


class UpstreamTimeoutError(TimeoutError):
    """A pod did not accept a connection, or did not finish its answer, in time."""


class _StaleError(Exception):
    """A pooled connection closed before the answer's first byte: try a fresh one."""


class Reply(asyncio.Protocol):
    """One keep-alive connection to one pod, and the answer it is reading."""

    def __init__(self, pool: Upstreams, key: tuple[str, int], pod: str) -> None:
        self._pool = pool
        self.key = key
        self.pod = pod
        self._loop = pool.loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        #: The answer's status and headers (names in lower case), once it has them.
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        #: Reading is paused (too much unread); ``read`` takes the whole body (never).
        self._paused = self._whole = False
        self._waiter: asyncio.Future[None] | None = None
        self._head_done = self._done = self._keep_alive = self._got_bytes = False
        self._error: BaseException | None = None
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self.reused = False
        #: In its pod's pool, idle since this time on the loop's clock.
        self.idle = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._timer is None:  # idle: a pod does not speak unasked
            self._fail(UpstreamError(f"pod {self.pod} sent bytes no request asked for"))
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"pod {self.pod} answered malformed HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self.idle:  # the pod closed it while it sat in the pool
            self._pool.drop_idle(self)
            return
        if self._done or self._error is not None:
            self._wake()
            return
        if self._head_done and not self._framed():
            self._on_message_complete()  # a body delimited by the connection's end
            return
        if not self._got_bytes and self.reused:
            self._error = _StaleError()
        else:
            where = "during its answer" if self._got_bytes else "before answering"
            reason = f": {exc}" if exc is not None else ""
            self._error = UpstreamError(f"pod {self.pod} closed the connection {where}{reason}")
        self._wake()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not (self._paused or self._whole):
            self._paused = True
            if self._transport is not None:
                self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._on_message_complete()

    async def read(self) -> bytes:
        """The whole body."""
        self._whole = True
        self._resume()
        while not self._done:
            await self._wait()
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return data

    async def chunk(self) -> bytes:
        """The next part of the body as it came from the pod; b"" at its end."""
        while True:
            if self._chunks:
                data = self._chunks.popleft()
                self._buffered -= len(data)
                if self._paused and self._buffered <= _HIGH_WATER // 2:
                    self._resume()
                return data
            if self._done:
                return b""
            await self._wait()

    def release(self) -> None:
        """Back to the pool if the answer was read to its end, else closed."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._done and self._keep_alive and not self._closed and not self._chunks:
            self._reset()
            self._pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        self._closed = True
        if self._transport is not None:
            self._transport.close()
        self._pool.forget(self)

    def send(self, head: bytes, body: bytes, deadline: float) -> None:
        """Write one request; the answer's end or ``deadline`` (the loop's time) ends it."""
        assert self._transport is not None
        self._timer = self._loop.call_at(deadline, self._timed_out)
        self._transport.writelines((head, body))

    async def head(self) -> None:
        """Until the answer's status line and headers are in."""
        while not self._head_done:
            await self._wait()

    @property
    def usable(self) -> bool:
        return not self._closed and self._transport is not None

    def _framed(self) -> bool:
        """The answer says where its body ends (a length, chunks), or has none."""
        if self.status in (204, 304) or 100 <= self.status < 200:
            return True
        return b"content-length" in self.headers or b"transfer-encoding" in self.headers

    def _on_message_complete(self) -> None:
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self._wake()

    def _timed_out(self) -> None:
        self._timer = None
        self._fail(
            UpstreamTimeoutError(f"pod {self.pod} did not answer within {self._pool.timeout_s:g} s")
        )

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._done:
            self._error = error
        self._closed = True
        if self._transport is not None:
            self._transport.abort()
        self._wake()

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            if self._transport is not None and not self._closed:
                self._transport.resume_reading()

    def _reset(self) -> None:
        self.status, self.headers, self._buffered = 0, {}, 0
        self._head_done = self._done = self._got_bytes = self._keep_alive = self._whole = False

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self._loop.create_future()
        await waiter
        if self._error is not None:
            raise self._error


class Upstreams:
    """Keep-alive connections to the pods, at most ``max_connections`` open at once."""

    def __init__(
        self,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        keepalive_s: float,
        max_connections: int,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.max_connections = max_connections
        self._idle: dict[tuple[str, int], list[Reply]] = {}
        self._open: set[Reply] = set()
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        #: A URL's pod address and the head of a POST to it, up to its length.
        self._heads: dict[str, tuple[tuple[str, int], bytes]] = {}
        self._closing = False

    async def post(self, pod: str, url: str, body: bytes, *, auth: bytes | None = None) -> Reply:
        """POST ``body`` (JSON) to ``url`` on ``pod``: the reply with its head read.

        The caller must ``release`` it, whatever happens next."""
        key, prefix = self._head_of(pod, url)
        if auth is not None:
            if b"\r" in auth or b"\n" in auth:
                raise ValueError("an Authorization header holds a line break")
            prefix = b"%sAuthorization: %s\r\n" % (prefix, auth)
        head = b"%sContent-Length: %d\r\n\r\n" % (prefix, len(body))
        deadline = self.loop.time() + self.timeout_s
        reply = await self._acquire(key, pod, deadline)
        try:
            reply.send(head, body, deadline)
            await reply.head()
        except _StaleError:
            reply.release()
            reply = await self._connect(key, pod, deadline)
            try:
                reply.send(head, body, deadline)
                await reply.head()
            except BaseException:
                reply.release()
                raise
        except BaseException:
            reply.release()
            raise
        return reply

    def _head_of(self, pod: str, url: str) -> tuple[tuple[str, int], bytes]:
        known = self._heads.get(url)
        if known is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or parts.hostname is None:
                raise UpstreamError(f"pod {pod}: {url!r} is not an http:// URL")
            port = parts.port or 80
            target = parts.path or "/"
            if parts.query:
                target = f"{target}?{parts.query}"
            prefix = (
                f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                "Content-Type: application/json\r\n"
            ).encode("latin-1")
            known = self._heads[url] = ((parts.hostname, port), prefix)
        return known

    async def _acquire(self, key: tuple[str, int], pod: str, deadline: float) -> Reply:
        """A kept-alive connection to ``key`` if one is idle, else a new one."""
        while True:
            idle = self._idle.get(key)
            oldest = self.loop.time() - self.keepalive_s
            while idle:
                reply = idle.pop()
                reply.idle = False
                if reply.usable and reply.idle_since >= oldest:
                    reply.reused = True
                    return reply
                reply.close()
            if len(self._open) < self.max_connections or self._close_an_idle():
                return await self._connect(key, pod, deadline)
            await self._released()

    async def _released(self) -> None:
        """Until a connection is closed or given back (``max_connections`` are open)."""
        waiter = self.loop.create_future()
        self._waiting.append(waiter)
        await waiter

    async def _connect(self, key: tuple[str, int], pod: str, deadline: float) -> Reply:
        if self._closing:
            raise UpstreamError(f"pod {pod}: the router's upstream client is closed")
        while len(self._open) >= self.max_connections and not self._close_an_idle():
            await self._released()
        reply = Reply(self, key, pod)
        self._open.add(reply)
        limit = min(self.connect_timeout_s, deadline - self.loop.time())
        try:
            async with asyncio.timeout(limit):
                await self.loop.create_connection(lambda: reply, key[0], key[1])
        except TimeoutError:
            reply.close()
            raise UpstreamTimeoutError(
                f"pod {pod} did not accept a connection to {key[0]}:{key[1]} in {limit:g} s"
            ) from None
        except OSError as exc:
            reply.close()
            address = f"{key[0]}:{key[1]}"
            raise UpstreamError(f"pod {pod}: connecting to {address} failed: {exc}") from exc
        except BaseException:
            reply.close()
            raise
        return reply

    def _close_an_idle(self) -> bool:
        for idle in self._idle.values():
            while idle:
                reply = idle.pop(0)
                reply.idle = False
                if reply in self._open:
                    reply.close()
                    return True
        return False

    def put(self, reply: Reply) -> None:
        """An idle connection, back in its pod's pool (``Reply.release`` calls this)."""
        if self._closing:
            reply.close()
            return
        reply.idle, reply.idle_since = True, self.loop.time()
        self._idle.setdefault(reply.key, []).append(reply)
        self._wake_one()

    def drop_idle(self, reply: Reply) -> None:
        """An idle connection the pod closed: out of its pool, no longer counted."""
        reply.idle = False
        idle = self._idle.get(reply.key)
        if idle is not None and reply in idle:
            idle.remove(reply)
        self.forget(reply)

    def forget(self, reply: Reply) -> None:
        """A connection closed: no longer counted (``Reply.close`` calls this)."""
        if reply in self._open:
            self._open.discard(reply)
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    @property
    def idle_connections(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        """Close every connection; a request in flight fails as its pod closing it."""
        self._closing = True
        for reply in list(self._open):
            reply.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports' connection_lost run
