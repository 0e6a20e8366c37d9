"""An emulated pod's waiting queue and running batch: at most ``limit`` places.

Both engines keep a request in their waiting queue until their scheduler can run it,
and look at the queue in arrival order: vLLM stops at the first request that finds the
batch full (``if len(self.running) == self.max_num_running_reqs: break``) and passes
over, leaving it waiting, one whose adapter would take the batch past ``max_loras``
distinct adapters (vllm-project/vllm ``vllm/v1/core/sched/scheduler.py``,
``Scheduler.schedule``: the request goes to ``skipped_waiting_requests``, put back at
the head of the queue after the pass); SGLang likewise passes over one whose adapter
the LoRA memory pool cannot add (sgl-project/sglang
``python/sglang/srt/managers/scheduler.py``, ``_get_new_batch_prefill_raw``:
``_can_schedule_lora_req`` -> ``LoRAManager.validate_lora_batch``, then ``continue``)
and only the requests it takes leave ``waiting_queue``. A request passed over holds no
place, and those behind it may run first.

``Seats`` is that rule and nothing else. A request waits with its ``start``: called in
queue order while a place is free, it returns whether the request runs now (and has
taken what it needs, synchronously), or raises to fail the request. A place given back,
and ``reconsider`` (the batch's adapters changed), look at the queue again. A waiter
cancelled (its client went away) leaves the queue, or, started just as it was
cancelled, calls its ``abandon``. ``close`` fails every waiter, as a pod that restarts
drops its queue. No time here: the pod's clock and sleep stay the pod's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


def _runs_now() -> bool:
    return True


@dataclass(eq=False, slots=True)
class _Waiter:
    future: asyncio.Future[None]
    start: Callable[[], bool]
    abandon: Callable[[], None]


class Seats:
    """Places in the running batch (``limit`` None: as many as asked for)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        #: Places held now.
        self.taken = 0
        self._queue: deque[_Waiter] = deque()
        #: The most places held, and requests waiting, at once.
        self.peak_taken = 0
        self.peak_queued = 0

    @property
    def queued(self) -> int:
        """Requests waiting, for a place or for what their ``start`` needs."""
        return sum(1 for waiter in self._queue if not waiter.future.done())

    def _room(self) -> bool:
        return self.limit is None or self.taken < self.limit

    async def take(
        self,
        start: Callable[[], bool] = _runs_now,
        *,
        abandon: Callable[[], None] | None = None,
    ) -> None:
        """Wait until a place is free and ``start`` says the request runs; raises what
        ``start`` raised. ``abandon`` (default: give the place back) undoes a start
        whose waiter was cancelled before it resumed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, start, abandon or self.give_back)
        self._queue.append(waiter)
        self.reconsider()
        if not waiter.future.done():
            self.peak_queued = max(self.peak_queued, self.queued)
        try:
            await waiter.future
        except asyncio.CancelledError:
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                waiter.abandon()  # started just as it was cancelled
            elif waiter in self._queue:
                self._queue.remove(waiter)
            raise

    def reconsider(self) -> None:
        """Look at the queue in order while a place is free: each waiter whose ``start``
        runs it takes a place; the others keep their turn."""
        if not self._room():
            return
        waiting, self._queue = self._queue, deque()
        for waiter in waiting:
            if waiter.future.done():
                continue
            if not (self._room() and self._started(waiter)):
                self._queue.append(waiter)

    def _started(self, waiter: _Waiter) -> bool:
        """Whether ``waiter`` leaves the queue: it runs, or its ``start`` failed it."""
        try:
            runs = waiter.start()
        except Exception as exc:  # the waiter's own failure: handed to it
            waiter.future.set_exception(exc)
            return True
        if runs:
            self.taken += 1
            self.peak_taken = max(self.peak_taken, self.taken)
            waiter.future.set_result(None)
        return runs

    def give_back(self) -> None:
        """End a place; the queue is looked at again."""
        if self.taken > 0:  # a restart in between already forgot the place
            self.taken -= 1
        self.reconsider()

    def close(self, error: Exception) -> None:
        """Fail every waiter with ``error`` and forget every place."""
        for waiter in self._queue:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        self._queue.clear()
        self.taken = 0
