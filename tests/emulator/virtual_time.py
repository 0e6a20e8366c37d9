"""Virtual time for emulated pods: every wait is a timer on a heap, and time jumps to the
next timer once every task is blocked. Tests read each wait on this clock and never
sleep, even with many requests waiting at once (a sleep that moves the clock as it is
called would add concurrent waits up)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable
from typing import TypeVar

_T = TypeVar("_T")

#: Turns of the event loop that let every runnable task reach its next wait.
SETTLE_TURNS = 200


class VirtualTime:
    def __init__(self) -> None:
        self.now_s = 0.0
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, seconds: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now_s + seconds, next(self._order), waiter))
        await waiter

    async def settle(self) -> None:
        """Let every task run until each waits on a timer or on another task."""
        for _ in range(SETTLE_TURNS):
            await asyncio.sleep(0)

    async def step(self) -> bool:
        """Settle, then move to the next timer and wake it; False when none is left."""
        await self.settle()
        while self._timers:
            at_s, _, waiter = heapq.heappop(self._timers)
            if waiter.done():
                continue
            self.now_s = max(self.now_s, at_s)
            waiter.set_result(None)
            await self.settle()
            return True
        return False

    async def run(self, *calls: Awaitable[_T]) -> list[_T]:
        """Run ``calls`` together to their end on this clock."""
        tasks = [asyncio.ensure_future(call) for call in calls]
        while not all(task.done() for task in tasks):
            if not await self.step() and not all(task.done() for task in tasks):
                await self.settle()
                if not all(task.done() for task in tasks):
                    raise AssertionError("the calls wait on nothing: a deadlock")
        return [task.result() for task in tasks]
