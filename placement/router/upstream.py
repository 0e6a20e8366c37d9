"""The proxy's upstream client: HTTP/1.1 keep-alive to the pods on asyncio protocols.

``Upstreams`` owns one pool of idle connections per pod address and sends a request
(``post``) as its head and body in one ``writelines``; the answer is parsed by
httptools' response parser (the one uvicorn's server side uses) and read back whole
(``Reply.read``) or chunk by chunk as the pod wrote it (``Reply.chunk``), so an SSE
stream passes through unchanged. ``post(whole=True)`` returns once the whole answer is
in, waking its caller once rather than at the head and again at the body (uvicorn, as
vLLM and SGLang run it, writes them apart). Nothing is decompressed, and no header is added
beyond Host, Content-Type, Content-Length and the client's Authorization.

Failures are ``OSError``s that name the pod, as the proxy's callers expect of a pod
that could not be reached: ``UpstreamError`` (a ``ConnectionError``: refused, reset,
closed before the answer ended, or an answer that is not HTTP) and ``UpstreamTimeoutError``
(a ``TimeoutError``: no connection within ``connect_timeout_s``, or the whole exchange
past ``timeout_s``). A pooled connection that closes before the answer's first byte is
retried once on a fresh one: most often the pod closed it while it sat idle and the
request never reached it, but a pod that read the request and then dropped the
connection gets it twice; for a completion that is a second generation, not a second
effect, so the retry is deliberate. An idle connection is kept ``keepalive_s`` at most,
under the engines' own keep-alive (uvicorn and vLLM close one after 5 s idle).

With ``max_connections`` open, a request waits for one to be given back, within its own
deadline; past it ``PoolFullError``, which is not the pod's failure (not an ``OSError``):
the router answers 503 and keeps the pod in rotation.

``Reply.release`` gives the connection back to the pool when its answer was read to
the end and the pod keeps it alive, and closes it otherwise (an answer left unread,
a cancelled request). Owns no routing: the caller passes the pod and the URL.
"""

from __future__ import annotations

import asyncio
import collections
from urllib.parse import urlsplit

from placement.router.upstream_reply import (
    PoolFullError,
    Reply,
    UpstreamError,
    UpstreamTimeoutError,
    _StaleError,
)

__all__ = ["PoolFullError", "Reply", "UpstreamError", "UpstreamTimeoutError", "Upstreams"]


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

    async def post(
        self, pod: str, url: str, body: bytes, *, auth: bytes | None = None, whole: bool = False
    ) -> Reply:
        """POST ``body`` (JSON) to ``url`` on ``pod``: the reply with its head read, or
        with all of it (``whole``: ``Reply.read`` then returns at once).

        The caller must ``release`` it, whatever happens next."""
        key, prefix = self._head_of(pod, url)
        if auth is not None:
            if b"\r" in auth or b"\n" in auth:
                raise ValueError("an Authorization header holds a line break")
            prefix = b"%sAuthorization: %s\r\n" % (prefix, auth)
        head = b"%sContent-Length: %d\r\n\r\n" % (prefix, len(body))
        deadline = self.loop.time() + self.timeout_s
        reply = await self._acquire(key, pod, deadline)
        for fresh in (False, True):
            try:
                reply.send(head, body, deadline)
                await (reply.whole() if whole else reply.head())
                return reply
            except _StaleError:
                reply.release()
                if fresh:  # a fresh connection is never stale: _StaleError needs reuse
                    raise
            except BaseException:
                reply.release()
                raise
            reply = await self._connect(key, pod, deadline)
        raise AssertionError("unreachable")

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
            await self._released(deadline)

    async def _released(self, deadline: float) -> None:
        """Until a connection is closed or given back (``max_connections`` are open), or
        ``PoolFullError`` at ``deadline``."""
        waiter = self.loop.create_future()
        self._waiting.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # woken in the turn the deadline passed: pass it on
            raise PoolFullError(
                f"no upstream connection came free before the request's deadline "
                f"({self.max_connections} open)"
            ) from None
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # woken, then cancelled: the free one goes to the next
            raise

    async def _connect(self, key: tuple[str, int], pod: str, deadline: float) -> Reply:
        if self._closing:
            raise UpstreamError(f"pod {pod}: the router's upstream client is closed")
        while len(self._open) >= self.max_connections and not self._close_an_idle():
            await self._released(deadline)
        limit = min(self.connect_timeout_s, deadline - self.loop.time())
        if limit <= 0.0:
            raise PoolFullError("the request's deadline passed while it waited for a connection")
        reply = Reply(self, key, pod)
        self._open.add(reply)
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
