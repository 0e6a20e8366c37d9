"""One keep-alive connection to one pod and the answer it is reading: ``Reply``, the
upstream client's protocol (``placement.router.upstream`` owns the pools).

The answer is parsed by httptools' response parser as it arrives; ``read`` takes it
whole, ``chunk`` as the pod wrote it (reading pauses past ``_HIGH_WATER`` unread bytes
while a stream's chunks wait to be taken; a whole read never pauses). The errors a pod
can cause are ``OSError``s naming it (``UpstreamError``, ``UpstreamTimeoutError``);
``PoolFullError`` is the router's own limit. A connection goes back to its pool only
when its answer was read to the end and the pod keeps it alive.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol, cast

import httptools

#: Past this many bytes read and not yet taken, the pod's socket is not read.
_HIGH_WATER = 256 * 1024


class Pool(Protocol):
    """What a connection needs of its pool (``placement.router.upstream.Upstreams``)."""

    loop: asyncio.AbstractEventLoop
    timeout_s: float

    def put(self, reply: Reply) -> None: ...

    def forget(self, reply: Reply) -> None: ...

    def drop_idle(self, reply: Reply) -> None: ...


class UpstreamError(ConnectionError):
    """A pod could not be reached, or answered something that is not HTTP/1.1."""


class UpstreamTimeoutError(TimeoutError):
    """A pod did not accept a connection, or did not finish its answer, in time."""


class PoolFullError(Exception):
    """Every upstream connection stayed in use until the request's deadline: the
    router's limit, not the pod's failure."""


class _StaleError(Exception):
    """A pooled connection closed before the answer's first byte: try a fresh one."""


class Reply(asyncio.Protocol):
    """One keep-alive connection to one pod, and the answer it is reading."""

    def __init__(self, pool: Pool, key: tuple[str, int], pod: str) -> None:
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
        #: The deadline's timer: one per connection, re-armed when it fires for a request
        #: since answered (a timer per request costs more than the request's own work).
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        #: A request was sent and its connection not yet released.
        self._asked = False
        self.reused = False
        #: In its pod's pool, idle since this time on the loop's clock.
        self.idle = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._asked:  # idle: a pod does not speak unasked
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
        if not self._whole:  # a whole read waits for the end alone
            self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._whole:
            return
        if self._buffered > _HIGH_WATER and not self._paused:
            self._paused = True
            if self._transport is not None:
                self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._on_message_complete()

    async def read(self) -> bytes:
        """The whole body."""
        if not self._whole:
            self._whole = True
            self._resume()
        while not self._done:
            await self._wait()
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
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
        self._asked = False
        if self._done and self._keep_alive and not self._closed and not self._chunks:
            self._reset()
            self._pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        if not self._done and self._error is None:  # never an answer cut short by us
            self._error = UpstreamError(f"pod {self.pod}: the router closed the connection")
        self._closed = True
        self._asked = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.close()
        self._pool.forget(self)

    def send(self, head: bytes, body: bytes, deadline: float) -> None:
        """Write one request; the answer's end or ``deadline`` (the loop's time) ends it."""
        assert self._transport is not None
        self._deadline, self._asked = deadline, True
        timer = self._timer
        # A timer armed for an earlier deadline fires and re-arms; one armed for a later
        # one (a request that waited for this connection has the earlier deadline) is
        # set again, or this request's timeout would come late.
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._check_deadline)
        self._transport.writelines((head, body))

    async def head(self) -> None:
        """Until the answer's status line and headers are in."""
        while not self._head_done:
            await self._wait()

    async def whole(self) -> None:
        """Until the whole answer is in, without waking at its head or each part of
        its body (a pod's head and body often come in two reads): ``read`` then
        takes it at once. Never pauses reading."""
        self._whole = True
        self._resume()
        while not self._done:
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
        self._wake()

    def _check_deadline(self) -> None:
        self._timer = None
        if not self._asked or self._done:  # answered in time: no timer until the next
            return
        if self._loop.time() < self._deadline:  # armed for an earlier request's deadline
            self._timer = self._loop.call_at(self._deadline, self._check_deadline)
            return
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
