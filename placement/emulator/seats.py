"""An emulated pod's running batch: at most ``limit`` places, the rest wait in order.

vLLM's scheduler runs at most ``max_num_seqs`` requests and takes waiting ones first come
first served (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``); ``Seats`` is
that rule and nothing else. A request takes a place (waiting while the batch is full or
others wait before it) and gives it back when it ends; a place given back goes to the
oldest waiter at once, so no newcomer overtakes it. A waiter cancelled (its client went
away) leaves the queue, or gives back the place it was handed as it was cancelled.
``close`` fails every waiter, as a pod that restarts drops its queue. No time here:
the pod's clock and sleep stay the pod's.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Seats:
    """Places in the running batch (``limit`` None: as many as asked for)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        #: Places held now.
        self.taken = 0
        self._queue: deque[asyncio.Future[None]] = deque()
        #: The most places held, and requests waiting, at once.
        self.peak_taken = 0
        self.peak_queued = 0

    @property
    def queued(self) -> int:
        """Requests waiting for a place."""
        return sum(1 for waiter in self._queue if not waiter.done())

    def _room(self) -> bool:
        return self.limit is None or self.taken < self.limit

    async def take(self) -> None:
        """Hold a place, waiting behind every earlier waiter while the batch is full."""
        if not self.queued and self._room():
            self.taken += 1
            self.peak_taken = max(self.peak_taken, self.taken)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(waiter)
        self.peak_queued = max(self.peak_queued, self.queued)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back()  # handed a place just as it was cancelled
            elif waiter in self._queue:
                self._queue.remove(waiter)
            raise

    def give_back(self) -> None:
        """End a place; the oldest waiter, if any, holds it from now."""
        if self.taken > 0:  # a restart in between already forgot the place
            self.taken -= 1
        while self._queue and self._room():
            waiter = self._queue.popleft()
            if waiter.done():
                continue
            self.taken += 1
            self.peak_taken = max(self.peak_taken, self.taken)
            waiter.set_result(None)

    def close(self, error: Exception) -> None:
        """Fail every waiter with ``error`` and forget every place."""
        for waiter in self._queue:
            if not waiter.done():
                waiter.set_exception(error)
        self._queue.clear()
        self.taken = 0
