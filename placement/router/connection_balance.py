"""Router workers' client connections kept even (``lorafleet router --workers N``).

The kernel's hash over a few long-lived keep-alive connections often gives one worker
far more than its share (21 of 32 over two workers), and that worker saturates first.
Each worker writes its count of open client connections into memory the parent shared
before the fork (``ConnectionCounts``) every ``router.workers.TICK_S``; a worker
holding more than one over its share (the total over N, rounded up) answers its next
few responses with ``connection: close`` (``BalancedApp``), whole as ever: the client
opens a new connection, which the kernel hands to any worker, until no worker is more
than one over its share.

Must not fork, bind or serve: that is ``router.workers``.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement.router.asgi import RouterApp

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]


class ConnectionCounts:
    """Every worker's open client connections, in an anonymous shared mapping that the
    parent makes before the fork (so every worker writes and reads the same memory)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._memory = mmap.mmap(-1, 4 * workers)  # MAP_SHARED: forked workers see it
        self._form = struct.Struct(f"<{workers}i")

    def record(self, worker: int, connections: int) -> None:
        struct.pack_into("<i", self._memory, 4 * worker, connections)

    def each(self) -> tuple[int, ...]:
        return tuple(self._form.unpack_from(self._memory))


def over_share(connections: Sequence[int], worker: int) -> int:
    """How many of ``worker``'s connections to close: down to its share (the total over
    the workers, rounded up) once it holds more than one over it; else 0. Pure."""
    share = -(-sum(connections) // len(connections))
    mine = connections[worker]
    return mine - share if mine > share + 1 else 0


def _closing(send: Send) -> Send:
    """``send`` with ``connection: close`` added to the response's head."""

    async def closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            message = {**message, "headers": headers}
        await send(message)

    return closing


@dataclass(eq=False)
class BalancedApp:
    """``app`` as worker ``worker`` of those in ``counts``: while the worker holds more
    than its share of the router's client connections, its next responses (as many as
    it is over) close their connections once answered."""

    app: RouterApp
    counts: ConnectionCounts
    worker: int
    #: Responses still to close their connection.
    closing: int = field(default=0)

    async def __call__(self, scope: Message, receive: Any, send: Send) -> None:
        if self.closing and scope["type"] == "http":
            self.closing -= 1
            send = _closing(send)
        await self.app(scope, receive, send)

    def rebalance(self, connections: int) -> None:
        """Record this worker's ``connections`` and read how far over its share it is."""
        self.counts.record(self.worker, connections)
        self.closing = over_share(self.counts.each(), self.worker)
