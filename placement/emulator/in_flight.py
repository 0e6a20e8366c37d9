"""An emulated pod's requests in flight per adapter, as SGLang's tokenizer counts them,
and the unloads that wait for them.

SGLang counts a request against its adapter from ``LoRARegistry.acquire`` (in
``TokenizerManager``, after ``_resolve_lora_path`` has loaded an adapter the soft cap
unloaded, before the request goes to the scheduler) until ``release`` when it finishes
(sgl-project/sglang ``python/sglang/srt/lora/lora_registry.py``,
``python/sglang/srt/managers/tokenizer_manager.py``): a request queued in the
scheduler's ``waiting_queue`` counts as much as a running one. An unload first
unregisters the name, so no new request acquires it, then ``wait_for_unload`` waits for
that count to reach zero (``tokenizer_control_mixin.py``
``_unload_lora_adapter_locked``). ``InFlight`` is that count, the names between
unregister and the end of the wait, and the waits.

``RunningEntries`` counts the requests running per entry they run on, what eviction
must skip: both engines key a batch's adapters by entry, not name (vLLM's scheduler by
``lora_int_id``: vllm-project/vllm ``vllm/v1/core/sched/scheduler.py``
``Scheduler.schedule``, ``scheduled_loras``; SGLang's pool by uid:
``python/sglang/srt/lora/mem_pool.py`` ``LoRAMemoryPool.prepare_lora_batch``,
``cur_uids``), so a vLLM ghost a request runs on keeps its slot while the name's new,
idle entry may go.

No time, no HTTP, no engine state: the pod decides who acquires and when.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from placement.residency import Entry


class InFlight:
    """Requests acquired per adapter name, and unloads waiting for them to end."""

    def __init__(self) -> None:
        #: Requests acquired and not yet released, by adapter name ("": the base model).
        self.counts: Counter[str] = Counter()
        #: Names an unload has unregistered and is waiting on: new requests are refused.
        self.unregistered: set[str] = set()
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    def acquire(self, name: str) -> None:
        self.counts[name] += 1

    def release(self, name: str) -> None:
        """One request for ``name`` ended; an unload waiting on the last one goes on."""
        if self.counts[name] > 0:  # a restart in between already forgot the request
            self.counts[name] -= 1
        if self.counts[name]:
            return
        for waiter in self._waiters.pop(name, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for_zero(self, name: str) -> None:
        """Until no acquired request uses ``name`` (the soft cap's unloads wait so)."""
        if self.counts[name]:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(name, []).append(waiter)
            await waiter

    async def wait_for_unload(self, name: str) -> None:
        """An explicit unload: unregister ``name``, then wait as ``wait_for_zero``."""
        self.unregistered.add(name)
        try:
            await self.wait_for_zero(name)
        finally:
            self.unregistered.discard(name)

    def close(self, error: Exception) -> None:
        """Fail every waiting unload with ``error`` (the pod restarted) and forget all."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(error)
        self._waiters.clear()
        self.counts.clear()
        self.unregistered.clear()


class RunningEntries:
    """Requests running per engine-model entry (``placement.residency.Entry``)."""

    def __init__(self) -> None:
        self.counts: Counter[Entry] = Counter()

    def start(self, entry: Entry | None) -> None:
        if entry is not None:  # None: nothing to count (the base model)
            self.counts[entry] += 1

    def end(self, entry: Entry | None) -> None:
        if entry is not None and entry in self.counts:
            self.counts[entry] -= 1
            if self.counts[entry] <= 0:
                del self.counts[entry]

    def busy(self) -> set[Entry]:
        """The entries requests run on now: the model's ``busy``."""
        return set(self.counts)

    def longest(self, name: str) -> Entry | None:
        """The entry of ``name`` running longest: for a release that names none."""
        return next((entry for entry in self.counts if entry.name == name), None)
