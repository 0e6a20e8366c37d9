"""The state and timing of one emulated pod, whatever HTTP dialect it speaks.

What the pod holds is ``placement.residency.PodResidency``, the one engine model the
replay and the ledgers run too: this module asks it what each load, unload and request
does (``Effects``) and keeps only what the model does not: time (a cold read timed by
size and by the pool's storage, which stalls the running batch as each engine's one loop
reads; the drain while weights move onto the GPU), the locks loads and unloads take
(both in ``placement.emulator.engine_loop``), requests running (passed to the model as
``busy``, by the entry they run on), SGLang's unload waiting for the adapter's requests
in flight, queued or running (both in ``placement.emulator.in_flight``), failure
injection, and counters that let tests see thrashing. A request waits in the engine's
queue (``placement.emulator.seats``) until it can run: a GPU slot its adapter takes
without pushing off a running or pinned one and, with a ``BatchTiming`` (the replay's
pod), a place in the batch (at most ``max_num_seqs``); then its first token after a
prefill of its prompt, and each token after one decode step, whose time is read at that
step from the batch's size and distinct adapters.

Configuration, adapter existence and where a cold read's time comes from (the storage
the engine reads through, not the engine) live in ``placement.emulator.config``. Every
wait goes through the pod's ``sleep`` (``asyncio.sleep`` by default): a test passes one
that moves its clock instead, and reads each wait on that clock without sleeping.

Raises ``placement.emulator.refusals``' errors, which the dialect modules answer. No HTTP.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import replace

from placement import residency
from placement.emulator.config import AdapterFile, Faults, PodConfig
from placement.emulator.engine_loop import EngineLoop
from placement.emulator.in_flight import InFlight, RunningEntries
from placement.emulator.refusals import (
    InjectedError,
    NotLoadedError,
    PodDownError,
    check_load,
    refusal,
)
from placement.emulator.seats import Seats
from placement.residency import Effects, EngineModel, Entry, PodResidency

Sleep = Callable[[float], Awaitable[None]]


class EmulatedPod:
    """One pod's engine: the engine model, its timing, requests in flight, counters."""

    def __init__(
        self,
        config: PodConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.config = config
        #: Seconds on a monotonic clock: down windows and residencies. Tests pass their own.
        self.clock = clock
        #: Waits this many seconds: every simulated time (reads, swaps, tokens) passes here.
        self.sleep = sleep
        self.faults = config.faults
        self.rng = random.Random(config.seed)
        self.counters: Counter[str] = Counter()
        self.peaks: Counter[str] = Counter()
        #: How long each adapter stayed on a GPU slot before it left (the latest ones).
        self.residencies_s: deque[float] = deque(maxlen=10_000)
        self.generation = 0
        self.down_until = 0.0
        self.residency = PodResidency(
            config.model, max_loras=config.max_loras, max_cpu_loras=config.residency_cap
        )
        self._restart()

    def _restart(self) -> None:
        self.generation += 1
        for old in (getattr(self, "seats", None), getattr(self, "in_flight", None)):
            if old is not None:  # a restarted pod drops its queue and fails waiting unloads
                old.close(PodDownError())
        batch = self.config.batch
        #: Places in the running batch (``max_num_seqs``); None: no cap.
        self.seats = Seats(None if batch is None else batch.max_num_seqs)
        self.residency.restart()
        #: The adapter file behind each name the pod knows (listed or parked).
        self.files: dict[str, AdapterFile] = {}
        #: When each GPU entry of a name was activated, oldest first (a vLLM ghost first).
        self.activated_at: dict[str, deque[float]] = {}
        self.running: Counter[str] = Counter()
        #: Requests running per entry they run on: what eviction skips.
        self.running_entries = RunningEntries()
        self.waiting: Counter[str] = Counter()
        self.running_tokens = 0
        #: The batch's one loop (reads and swaps stall it) and the load and unload locks.
        self.loop = EngineLoop(self.config.model, pause=self._pause)
        #: Requests in flight per adapter, queued or running, and unloads waiting on them.
        self.in_flight = InFlight()
        self.lora_info: dict[tuple[str, str], float] = {}

    # what the pod holds (read from the engine model) ---------------------------------
    @property
    def listed(self) -> dict[str, AdapterFile]:
        """Names ``/v1/models`` lists, with their files (SGLang: not one an unload waits on)."""
        gone = self.in_flight.unregistered
        return {name: self.files[name] for name in self.residency.listed if name not in gone}

    @property
    def gpu(self) -> tuple[str, ...]:
        """Listed names on a GPU slot, least recently used first."""
        return self.residency.on_gpu()

    @property
    def host(self) -> tuple[str, ...]:
        """Listed names whose weights are in host memory, oldest first."""
        return self.residency.in_host()

    @property
    def pinned(self) -> set[str]:
        return set(self.residency.pinned)

    async def _pause(self, ms: float) -> None:
        if ms > 0:
            await self.sleep(ms / 1000.0)

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

    # loads and unloads -------------------------------------------------------------
    def _alive(self, generation: int) -> None:
        if generation != self.generation:
            raise PodDownError()

    async def load(
        self, name: str, path: str, *, pinned: bool = False, inplace: bool = False
    ) -> AdapterFile:
        """``load_lora_adapter``: read the weights, then do what the engine model says."""
        generation = self.generation
        async with self.loop.updates(name):
            self._alive(generation)
            adapter = check_load(
                self.residency, self.config, name, path, pinned=pinned, inplace=inplace
            )
            read_ms = self.config.cold_read_ms(adapter.size_bytes)
            # Both engines read on their one loop (``EngineLoop.read``), vLLM activating in
            # the same call; an injected slow load is a slow read: it stalls the batch too.
            async with self.loop.step:
                await self._pause(read_ms + self.faults.slow_load_ms)
                self._alive(generation)
                effects = self._register(name, path, adapter, pinned=pinned, inplace=inplace)
                # before the queue looks again: the scheduler counts the running LoRAs
                back = self.residency.next_step(self.running_entries.busy())
                await self._apply(name, effects, size_bytes=adapter.size_bytes, held=True)
            await self._back_on_gpu(back)
            await self._drain_unlisted(effects.unlisted)
            return adapter

    async def _back_on_gpu(self, back: Iterable[tuple[Entry, Effects]]) -> None:
        """vLLM: entries requests run on that a load pushed off the GPU come back."""
        for entry, again in back:
            size_bytes = self.files[entry.name].size_bytes
            if again.cold:  # left the host cache too: read again inside the step
                await self.loop.read(self.config.cold_read_ms(size_bytes))
            await self._apply(entry.name, again, size_bytes=size_bytes)

    def _register(
        self, name: str, path: str, adapter: AdapterFile, *, pinned: bool, inplace: bool
    ) -> Effects:
        """The engine model's load, once the weights are read."""
        # SGLang's soft cap takes the LRU, running or not, then waits for its requests.
        busy = () if self.config.model.is_sglang else self.running_entries.busy()
        try:
            effects = self.residency.load(name, path, pinned=pinned, inplace=inplace, busy=busy)
        except residency.ResidencyError as exc:
            raise refusal(exc) from exc
        self.files[name] = adapter
        self.counters["loads"] += 1
        cap = self.config.residency_cap
        if cap is not None and len(self.residency.listed) > cap:
            self.counters["over_limit"] += 1  # vLLM took it, dropping weights silently
        return effects

    async def unload(self, name: str) -> None:
        """``unload_lora_adapter``: SGLang waits for the adapter's requests in flight."""
        generation = self.generation
        async with self.loop.updates(name):
            self._alive(generation)
            if name not in self.residency.listed:
                raise NotLoadedError()
            if self.config.model.is_sglang:  # unregistered: new requests are refused
                await self.in_flight.wait_for_unload(name)
            self._alive(generation)
            try:  # SGLang keeps the name to load again on use (``PodResidency.unload``)
                effects = self.residency.unload(name, remember=True)
            except residency.ResidencyError as exc:
                raise refusal(exc) from exc
            self.counters["unloads"] += 1
            self._note_evictions(effects.gpu_evicted)

    async def _drain_unlisted(self, names: Iterable[str]) -> None:
        """SGLang's soft cap unloads through the unload path: it waits for their requests."""
        for name in names:
            self.counters["unlisted"] += 1
            await self.in_flight.wait_for_zero(name)

    async def _apply(
        self, name: str, effects: Effects, *, size_bytes: int, held: bool = False
    ) -> None:
        """Count and time what one call did; a swap onto the GPU stalls the batch
        (``held``: the caller holds the engine's step already)."""
        self.counters["host_evictions"] += len(effects.host_evicted)
        self._note_evictions(effects.gpu_evicted)
        if effects.activated:
            self.counters["gpu_activations"] += 1
            self.activated_at.setdefault(name, deque()).append(self.clock())
        self._peak()
        if effects.activated:
            swap_ms = self.config.latency.swap_ms(size_bytes)
            await (self._pause(swap_ms) if held else self.loop.swap(swap_ms))

    def _note_evictions(self, names: Iterable[str]) -> None:
        """End the oldest GPU residency of each name (a vLLM ghost's before its successor's)."""
        for name in names:
            self.counters["gpu_evictions"] += 1
            stamps = self.activated_at.get(name)
            if stamps:
                self.residencies_s.append(self.clock() - stamps.popleft())
        self.seats.reconsider()  # a freed GPU slot (or an unload) moves the queue on

    def _peak(self) -> None:
        self.peaks["registered"] = max(self.peaks["registered"], len(self.residency.listed))
        self.peaks["host"] = max(self.peaks["host"], len(self.residency.in_host()))
        self.peaks["gpu"] = max(self.peaks["gpu"], len(self.residency.on_gpu()))

    # requests ----------------------------------------------------------------------
    def _record_info(self) -> None:
        running = ",".join(sorted(n for n, c in self.running.items() if c > 0 and n))
        waiting = ",".join(sorted(n for n, c in self.waiting.items() if c > 0 and n))
        self.lora_info[(waiting, running)] = time.time()

    async def admit(self, name: str | None) -> Entry | None:
        """Wait until ``name`` (None: the base model) runs, reading it in as needed;
        returns the entry it runs on (None for the base model), for ``release``.

        Raises ``NotLoadedError`` when the engine does not serve ``name`` (SGLang before
        the soft cap: also while an unload that unregistered it waits for its requests),
        ``PinLimitError`` when the reload of an unloaded pinned adapter is refused."""
        self.counters["requests"] += 1
        in_flight, key, held = self.in_flight, name or "", self.residency
        unregistered = key in in_flight.unregistered
        hard = self.config.model is EngineModel.SGLANG_HARD_CAP
        if name is not None and (not held.serves(name) or (unregistered and hard)):
            raise NotLoadedError()
        reload = held.parked.get(key) or (held.listed.get(key) if unregistered else None)
        arrived = None if name is None or self.config.model.is_sglang else held.entry(name)
        adapter = self.files.get(key)  # vLLM: the arrival's path, though loaded again since
        generation, waiting = self.generation, self.waiting
        waiting[key] += 1
        self._record_info()
        try:
            if name is not None and reload is not None:
                await self._reload(name, reload, generation)
            in_flight.acquire(key)  # SGLang's ``LoRARegistry.acquire``: queued ones count
            try:
                scheduled = await self._schedule(name, generation, arrived)
            except BaseException:
                in_flight.release(key)
                raise
        finally:
            waiting[key] -= 1
            self._record_info()
        if name is None or scheduled is None:
            return None
        effects, entry = scheduled
        self.counters["cold_reloads"] += int(effects.cold)
        size_bytes = (adapter or self.files[name]).size_bytes
        try:
            if effects.cold:  # vLLM reads it in the step that runs it (``EngineLoop.read``)
                await self.loop.read(self.config.cold_read_ms(size_bytes))
            await self._apply(name, effects, size_bytes=size_bytes)
            await self._drain_unlisted(effects.unlisted)
        except BaseException:  # the client left during the read or swap: no release comes
            await self.release(name, entry)
            raise
        return entry

    async def _reload(self, name: str, path: str, generation: int) -> None:
        """SGLang loads an adapter the registry lacks (the soft cap or an unload unloaded
        it, or an unload waits for its requests) before the scheduler sees the request,
        from the ``lora_ref_cache`` entry read as it arrives, pinned as it was loaded
        (``TokenizerManager._resolve_lora_path`` -> ``load_lora_adapter``): under
        ``lora_update_lock``, after the unloads holding it. A refused reload (the pins
        taken since) raises ``PinLimitError``."""
        async with self.loop.updates(name):
            self._alive(generation)
            if name in self.residency.listed:  # loaded again meanwhile: "already loaded"
                return
            adapter = self.files[name]
            pinned = name in self.residency.parked_pins
            if pinned and len(self.residency.pinned) >= self.config.max_loras - 1:
                raise refusal(residency.PinLimitError(name))  # before any weights are read
            await self.loop.read(self.config.cold_read_ms(adapter.size_bytes))
            self._alive(generation)
            try:  # the load path's soft cap: the LRU unpinned adapter, running or not
                effects = self.residency.load(name, path, pinned=pinned)
            except residency.ResidencyError as exc:
                raise refusal(exc) from exc
            self.counters["cold_reloads"] += 1
            await self._apply(name, effects, size_bytes=adapter.size_bytes)
            await self._drain_unlisted(effects.unlisted)

    async def _schedule(
        self, name: str | None, generation: int, arrived: Entry | None
    ) -> tuple[Effects, Entry | None] | None:
        """Wait in the queue (``Seats.take``), holding nothing, until the request runs: on
        vLLM on ``arrived``, the entry (id) its name pointed to as it arrived, though the
        name was unloaded or loaded again since; SGLang's unload waits for the name's
        requests, so on the name's entry now. Returns what it did, and that entry."""
        key, started, held = name or "", list[tuple[Effects, Entry | None]](), self.residency

        def start() -> bool:
            if name is not None:
                busy, entry = self.running_entries.busy(), arrived or held.entry(name)
                if not held.can_activate_entry(entry, busy=busy):
                    return False
                if entry is None:  # not served (refused), or parked (listed again)
                    effects = held.request(name, busy=busy)
                else:
                    effects = held.request_entry(entry, busy=busy)
                started.append((effects, entry or held.entry(name)))
                self.running_entries.start(started[0][1])
            self.running[key] += 1
            return True

        await self.seats.take(  # abandon: the waiter was cancelled as it started
            start, abandon=lambda: self._end(key, started[0][1] if started else None)
        )
        self._alive(generation)
        return started[0] if started else None

    def _end(self, key: str, entry: Entry | None) -> None:
        """A request for ``key`` ("": the base model), on ``entry``, leaves the batch."""
        if self.running[key] > 0:  # a restart in between already forgot the request
            self.running[key] -= 1
            self.running_entries.end(entry)
            self.residency.last_step(entry)  # both engines: as recent as its last step
            self.seats.give_back()

    async def release(self, name: str | None, entry: Entry | None = None) -> None:
        """A request ended, run on ``entry`` (``admit``'s; None: the name's running longest)."""
        if entry is None or entry in self.running_entries.counts:  # else a restart forgot it
            self._end(name or "", entry or (self.running_entries.longest(name) if name else None))
            self.in_flight.release(name or "")  # SGLang's ``LoRARegistry.release``
        self._record_info()

    def step_ms(self) -> float:
        """One decode step of the batch running now (``PodConfig.decode_step_ms``)."""
        return self.config.decode_step_ms(self.running)

    async def generate(self, *, prompt_tokens: int, max_tokens: int) -> AsyncIterator[int]:
        """Yield token indices: the first after ``ttft_ms`` and the prompt's prefill,
        each one after a decode step read as it starts (``step_ms``)."""
        self.running_tokens += prompt_tokens + max_tokens
        try:
            await self._pause(self.config.first_token_ms(prompt_tokens))
            for index in range(max_tokens):
                if index:
                    await self._pause(self.step_ms())
                async with self.loop.step:
                    pass
                yield index
        finally:
            self.running_tokens -= prompt_tokens + max_tokens

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.running_tokens / max(1, self.config.kv_capacity_tokens))
