"""uvicorn's httptools protocol, writing a response's head and its first body part in one
send.

ASGI sends a response as two messages (``http.response.start``, then the body), and
uvicorn writes each to the socket as it comes: two ``send`` calls per proxied answer,
each of which, on a loopback or a busy host, costs more CPU than the bytes it carries.
Here the status line and headers are held until the body's first write, or until the
end of the event loop's current iteration, whichever comes first: a whole answer (the
router's own replies, a non-streamed completion) leaves in one ``writelines``; a
stream's head is never held past the iteration that wrote it, so nothing waits.

Only the transport seen by the request-response cycle is wrapped; uvicorn's protocol,
flow control and keep-alive are untouched. Relies on uvicorn's
``HttpToolsProtocol.on_headers_complete`` setting ``self.cycle`` (uvicorn 0.30 onwards).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _HeldHead:
    """A transport that holds a response head until the next write or the loop's turn."""

    __slots__ = ("_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.writelines((head, data))
        elif bytes(data[:5]) == b"HTTP/" and bytes(data[-4:]) == b"\r\n\r\n":
            self._head = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def _flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LeanHttpToolsProtocol(HttpToolsProtocol):
    """``uvicorn.Config(http=LeanHttpToolsProtocol)``: one send per whole answer."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not isinstance(cycle.transport, _HeldHead):
            cycle.transport = _HeldHead(self.transport, self.loop)
