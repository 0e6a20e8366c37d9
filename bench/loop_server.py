"""A server on its own event loop in a thread, for the picker benches: started on
``with``, its loop thread's CPU read on demand, stopped and joined on exit.

Subclasses say how to start (``_start``, returning the port) and stop (``_stop``).
"""

from __future__ import annotations

import asyncio
import threading
import time

import uvloop


class LoopServer:
    """A server started in ``__enter__`` on a loop of its own (uvloop by default)."""

    def __init__(self, *, use_uvloop: bool = True) -> None:
        self.loop = uvloop.new_event_loop() if use_uvloop else asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _start(self) -> int:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> int:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    def cpu_ns(self) -> int:
        """CPU time of the server's event-loop thread so far."""
        assert self.thread.ident is not None
        return time.clock_gettime_ns(time.pthread_getcpuclockid(self.thread.ident))

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
