"""A router process freezes its heap once it has started (``wiring.freeze_started_heap``):
``lorafleet router`` (``run_router``'s server) and each ``--workers`` child, by the time
they say they accept connections. The collector's full passes, which hold the GIL while
they walk the heap (a big ``/metrics`` page's parse sets off several), then skip what
the process held at its start.

The servers run a bare ASGI app on port 0 in this process; what is frozen is read when
they report (the port heard, the parent's pipe written), and thawed after each test.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from placement.router.wiring import _ListeningServer
from placement.router.workers import _Worker, bind


async def _bare_app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app with a lifespan and nothing else."""
    assert scope["type"] == "lifespan"
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _config() -> uvicorn.Config:
    return uvicorn.Config(_bare_app, host="127.0.0.1", port=0, lifespan="on", log_level="warning")


@pytest.fixture
def thawed() -> Iterator[None]:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("thawed")
def test_the_router_server_has_frozen_the_heap_when_it_reports_its_port() -> None:
    frozen: list[int] = []
    server: _ListeningServer

    def listening(port: int) -> None:
        assert port > 0
        frozen.append(gc.get_freeze_count())
        server.should_exit = True

    server = _ListeningServer(_config(), on_listening=listening)
    asyncio.run(server.serve())
    assert len(frozen) == 1 and frozen[0] > 0


@pytest.mark.usefixtures("thawed")
def test_a_worker_has_frozen_the_heap_when_it_tells_the_parent_it_is_ready() -> None:
    ready_read, ready_write = os.pipe()
    sock = bind("127.0.0.1", 0, listen=True)
    server = _Worker(_config(), ready_fd=ready_write, balance=None)

    async def serve_until_ready() -> int:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        told = await asyncio.to_thread(os.read, ready_read, 1)
        frozen = gc.get_freeze_count()
        server.should_exit = True  # seen at its next tick (not handle_exit: uvicorn
        # raises a signal it handled again once served, which would end pytest)
        await asyncio.wait_for(serving, 10.0)  # bounds a broken test, never waited out
        assert told == b"1"
        return frozen

    try:
        assert asyncio.run(serve_until_ready()) > 0
    finally:
        os.close(ready_read)
        sock.close()
