"""The state and timing of one emulated pod, whatever HTTP dialect it speaks.

Models what POD-API.md says of the engines: registrations (``/v1/models``), a host
LRU of ``max_cpu_loras`` and a GPU LRU of ``max_loras`` slots, a per-name lock on
loads and unloads, cold loads timed by size, activations that stall the running batch
(the drain), and failure injection. vLLM evicts silently past ``max_cpu_loras`` and
keeps listing the evicted adapter; SGLang refuses loads past ``max_loaded_loras`` and
keeps pinned adapters on the GPU. Counters let tests see thrashing.

Configuration and adapter existence live in ``placement.emulator.config``.

Raises the ``EmulatorError`` subclasses below; the dialect modules turn them into
each engine's status codes and texts. No HTTP here.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from placement.domain import Engine
from placement.emulator.config import AdapterFile, Faults, PodConfig, resolve_adapter


class EmulatorError(Exception):
    """Something the engine refuses; the dialect decides status and text."""


class PodDownError(EmulatorError):
    """The pod is dead (until it comes back empty)."""


class InjectedError(EmulatorError):
    """A failure injected by ``error_rate``."""


class AlreadyLoadedError(EmulatorError): ...


class NotLoadedError(EmulatorError): ...


class BadPathError(EmulatorError): ...


class RankTooLargeError(EmulatorError):
    def __init__(self, rank: int) -> None:
        self.rank = rank
        super().__init__(rank)


class PoolFullError(EmulatorError): ...


class PinLimitError(EmulatorError): ...


async def _pause(ms: float) -> None:
    if ms > 0:
        await asyncio.sleep(ms / 1000.0)


class EmulatedPod:
    """One pod's engine: registrations, the two LRU tiers, requests in flight."""

    def __init__(self, config: PodConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        #: Seconds on a monotonic clock: down windows and residencies. Tests pass their own.
        self.clock = clock
        self.faults = config.faults
        self.rng = random.Random(config.seed)
        self.counters: Counter[str] = Counter()
        self.peaks: Counter[str] = Counter()
        #: How long each adapter stayed on a GPU slot before it left (the latest ones).
        self.residencies_s: deque[float] = deque(maxlen=10_000)
        self.generation = 0
        self.down_until = 0.0
        self._restart()

    def _restart(self) -> None:
        self.generation += 1
        self.listed: dict[str, AdapterFile] = {}
        self.host: OrderedDict[str, None] = OrderedDict()
        self.gpu: OrderedDict[str, float] = OrderedDict()
        self.pinned: set[str] = set()
        self.running: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self.running_tokens = 0
        self.locks: dict[str, asyncio.Lock] = {}
        self.slots = asyncio.Condition()
        self.engine_step = asyncio.Lock()
        self.lora_info: dict[tuple[str, str], float] = {}

    # faults ------------------------------------------------------------------------
    def restart(self) -> None:
        """Come back empty, as a restarted pod does."""
        self.counters["restarts"] += 1
        self._restart()

    def kill(self, down_s: float) -> None:
        """Die now; answer as down for ``down_s`` seconds, then come back empty."""
        self.restart()
        self.down_until = self.clock() + down_s

    def check(self, *, inject: bool = True) -> None:
        """Raise if the pod is down, or if this call draws an injected failure."""
        if self.down_until:
            if self.is_down():
                raise PodDownError()
            self.down_until = 0.0
        if inject and self.faults.error_rate > 0 and self.rng.random() < self.faults.error_rate:
            self.counters["injected_errors"] += 1
            raise InjectedError()

    def is_down(self) -> bool:
        """Whether the pod is inside a window opened by ``kill``."""
        return bool(self.down_until) and self.clock() < self.down_until

    def set_faults(self, **changes: float) -> Faults:
        self.faults = replace(self.faults, **changes)
        return self.faults

    # registrations -----------------------------------------------------------------
    def _lock(self, name: str) -> asyncio.Lock:
        return self.locks.setdefault(name, asyncio.Lock())

    def _alive(self, generation: int) -> None:
        if generation != self.generation:
            raise PodDownError()

    async def load(self, name: str, path: str, *, pinned: bool = False) -> AdapterFile:
        generation = self.generation
        async with self._lock(name):
            self._alive(generation)
            if name in self.listed:
                raise AlreadyLoadedError()
            adapter = resolve_adapter(path, self.config)
            if adapter is None:
                raise BadPathError()
            if adapter.rank is not None and adapter.rank > self.config.max_lora_rank:
                raise RankTooLargeError(adapter.rank)
            self._check_room(pinned=pinned)
            await _pause(self.config.latency.cold_ms(adapter.size_bytes) + self.faults.slow_load_ms)
            self._alive(generation)
            self._check_room(pinned=pinned)
            self.listed[name] = adapter
            self.counters["loads"] += 1
            self._into_host(name)
            if len(self.listed) > self.config.cpu_slots:  # vLLM took it, evicting silently
                self.counters["over_limit"] += 1
            if pinned:
                await self._pin(name, adapter)
            self._peak()
            return adapter

    def _check_room(self, *, pinned: bool) -> None:
        if self.config.engine is not Engine.SGLANG:
            return
        if len(self.listed) >= self.config.cpu_slots:
            raise PoolFullError()
        if pinned and len(self.pinned) >= self.config.max_loras - 1:
            raise PinLimitError()

    async def _pin(self, name: str, adapter: AdapterFile) -> None:
        self.pinned.add(name)
        async with self.slots:
            await self._claim_slot(name)
            self.running[name] -= 1
        await self._swap(adapter)

    def _into_host(self, name: str) -> None:
        self.host[name] = None
        self.host.move_to_end(name)
        while len(self.host) > self.config.cpu_slots:
            victim = next((n for n in self.host if not self.running[n]), None)
            if victim is None:
                break
            del self.host[victim]
            self._leave_gpu(victim)
            self.counters["host_evictions"] += 1

    async def unload(self, name: str) -> None:
        generation = self.generation
        async with self._lock(name):
            self._alive(generation)
            if name not in self.listed:
                raise NotLoadedError()
            if self.config.engine is Engine.SGLANG:
                async with self.slots:  # SGLang waits for the adapter's requests in flight
                    await self.slots.wait_for(lambda: not self.running[name])
            self._alive(generation)
            del self.listed[name]
            self.host.pop(name, None)
            self._leave_gpu(name)
            self.pinned.discard(name)
            self.counters["unloads"] += 1
            async with self.slots:
                self.slots.notify_all()

    def _leave_gpu(self, name: str) -> None:
        """Free ``name``'s GPU slot, remembering how long it stayed (its residency)."""
        activated = self.gpu.pop(name, None)
        if activated is not None:
            self.residencies_s.append(self.clock() - activated)

    def _peak(self) -> None:
        self.peaks["registered"] = max(self.peaks["registered"], len(self.listed))
        self.peaks["host"] = max(self.peaks["host"], len(self.host))
        self.peaks["gpu"] = max(self.peaks["gpu"], len(self.gpu))

    # requests ----------------------------------------------------------------------
    def _record_info(self) -> None:
        running = ",".join(sorted(n for n, c in self.running.items() if c > 0 and n))
        waiting = ",".join(sorted(n for n, c in self.waiting.items() if c > 0 and n))
        self.lora_info[(waiting, running)] = time.time()

    async def _claim_slot(self, name: str) -> None:
        """Under ``slots``: put ``name`` on a GPU slot, waiting while all are busy."""
        while name not in self.gpu and len(self.gpu) >= self.config.max_loras:
            victim = next(
                (n for n in self.gpu if not self.running[n] and n not in self.pinned), None
            )
            if victim is not None:
                self._leave_gpu(victim)
                self.counters["gpu_evictions"] += 1
                break
            await self.slots.wait()
        if name in self.gpu:
            self.gpu.move_to_end(name)
        else:
            self.gpu[name] = self.clock()
            self.counters["gpu_activations"] += 1
        self.running[name] += 1
        self._peak()

    async def _swap(self, adapter: AdapterFile) -> None:
        # Weights move between batch steps: every running request stalls (the drain).
        async with self.engine_step:
            await _pause(self.config.latency.swap_ms(adapter.size_bytes))

    async def admit(self, name: str | None) -> None:
        """Wait until ``name`` (None: the base model) can run, loading it as needed."""
        self.counters["requests"] += 1
        if name is None:
            self.running[""] += 1
            return
        generation = self.generation
        adapter = self.listed[name]
        self.waiting[name] += 1
        self._record_info()
        try:
            if name not in self.host:
                self.counters["cold_reloads"] += 1
                await _pause(self.config.latency.cold_ms(adapter.size_bytes))
                self._alive(generation)
                self._into_host(name)
            async with self.slots:
                was_active = name in self.gpu
                await self._claim_slot(name)
        finally:
            self.waiting[name] -= 1
        self._record_info()
        if not was_active:
            await self._swap(adapter)

    async def release(self, name: str | None) -> None:
        key = name or ""
        async with self.slots:
            if self.running[key] > 0:  # a restart in between already forgot the request
                self.running[key] -= 1
            self.slots.notify_all()
        self._record_info()

    async def generate(self, *, prompt_tokens: int, max_tokens: int) -> AsyncIterator[int]:
        """Yield token indices at the simulated TTFT and time per token."""
        self.running_tokens += prompt_tokens + max_tokens
        try:
            await _pause(self.config.latency.ttft_ms)
            for index in range(max_tokens):
                if index:
                    await _pause(self.config.latency.tpot_ms)
                async with self.engine_step:
                    pass
                yield index
        finally:
            self.running_tokens -= prompt_tokens + max_tokens

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.running_tokens / max(1, self.config.kv_capacity_tokens))

    def stats(self) -> dict[str, object]:
        return {
            "pod": self.config.name,
            "engine": self.config.engine.value,
            "registered": list(self.listed),
            "host": list(self.host),
            "gpu": list(self.gpu),
            "residency_s": {
                "ended": [round(v, 3) for v in self.residencies_s],
                "ongoing": [round(self.clock() - t, 3) for t in self.gpu.values()],
            },
            "pinned": sorted(self.pinned),
            "running": sum(self.running.values()),
            "waiting": sum(self.waiting.values()),
            "limits": {"max_loras": self.config.max_loras, "max_cpu_loras": self.config.cpu_slots},
            "counters": dict(self.counters),
            "peaks": dict(self.peaks),
            "faults": {
                "error_rate": self.faults.error_rate,
                "slow_load_ms": self.faults.slow_load_ms,
                "down": self.is_down(),
            },
        }
