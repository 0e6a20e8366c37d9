"""A proxied request's client, as ``router.asgi`` reads and answers it.

Two ways to the client. Served by the router's own server (``router.http_cycle``) with
no middleware wrapping ``send``, the request's ``RequestCycle`` is its ``ClientSide``:
no ASGI message per read or write, and the cycle says when the client goes away
(``RequestCycle.on_lost``, here ``ClientGone``), with no timer or watcher task per
request. Behind middleware (``router.workers``' connection balancing) or another
server, ``AsgiClient`` speaks ASGI messages, and ``DisconnectWatcher`` watches
``receive`` for ``http.disconnect`` once a request has run ``WATCH_AFTER_S``.

Owns the ASGI messages of an answer (``respond``) and the cancelling of a proxying task
whose client went away. Must not choose pods, read the body's JSON or record the
request: that is ``router.asgi``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from placement.router.forward import Client, Exchange, Headers
from placement.router.front import Receive as BodyReceive

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]

#: How long a request runs before the router watches for its client going away.
WATCH_AFTER_S = 0.05


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A whole answer as ASGI's two messages (JSON unless ``headers`` say otherwise)."""
    head = list(headers or JSON_HEADERS)
    head.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class ClientSide(Client, Protocol):
    """A proxied request's client: its body and where its answer goes (a
    ``RequestCycle`` of ``router.http_cycle`` when no middleware wraps ``send``, else
    ``AsgiClient``)."""

    @property
    def receive(self) -> BodyReceive: ...

    def body_now(self) -> bytes | None:
        """The whole body if it is in already, else None (``receive`` reads it)."""
        ...


class AsgiClient:
    """``ClientSide`` over ASGI's ``receive`` and ``send``."""

    __slots__ = ("_receive", "_send")

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive, self._send = receive, send

    @property
    def receive(self) -> Receive:
        return self._receive

    def body_now(self) -> bytes | None:
        return None

    async def answer(self, status: int, headers: Headers, body: bytes) -> None:
        await respond(self._send, status, body, headers)

    async def begin(self, status: int, headers: Headers) -> None:
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def part(self, body: bytes) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def end(self, body: bytes = b"") -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


class ClientGone:
    """The client went away: cancel the proxying task (and so the upstream call), unless
    its answer is complete (the router's own server calls this: ``RequestCycle.on_lost``)."""

    __slots__ = ("_exchange", "_handler")

    def __init__(self, handler: asyncio.Task[Any] | None, exchange: Exchange) -> None:
        self._handler, self._exchange = handler, exchange

    def __call__(self) -> None:
        if not self._exchange.finished and self._handler is not None:
            self._exchange.client_gone = True
            self._handler.cancel()


class DisconnectWatcher:
    """Starts ``_watch_disconnect`` on demand; cancelling before the start costs nothing."""

    __slots__ = ("_exchange", "_handler", "_receive", "_task")

    def __init__(
        self, receive: Receive, handler: asyncio.Task[Any] | None, exchange: Exchange
    ) -> None:
        self._receive, self._handler, self._exchange = receive, handler, exchange
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if not self._exchange.finished:
            self._task = asyncio.create_task(
                _watch_disconnect(self._receive, self._handler, self._exchange)
            )

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def _watch_disconnect(
    receive: Receive, handler: asyncio.Task[Any] | None, exchange: Exchange
) -> None:
    """Cancel the proxying task when the client goes away (and so the upstream call)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not exchange.finished and handler is not None:
                exchange.client_gone = True
                handler.cancel()
            return
