"""``PodResidency``: one pod's engine state, and its ``load``, ``unload`` and ``request``.

The state machine the package docstring describes, engine by engine, from the engines'
source; the values it takes and returns are in ``vocabulary``. Pure: no IO, no clock.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import TypeAlias

from placement.residency.vocabulary import (
    AlreadyLoadedError,
    CapReachedError,
    Effects,
    EngineModel,
    Entry,
    NotLoadedError,
    PinLimitError,
)

__all__ = ["Busy", "PodResidency"]

#: What has requests in flight, for eviction to skip: entries (as the engines key
#: them: vLLM's scheduler by ``lora_int_id``, SGLang's pool by the adapter's uid), or
#: names, for a caller that counts by name: a name covers every entry of it, a vLLM
#: ghost's too (a request may still run on it).
Busy: TypeAlias = Collection[str | Entry]


def _is_busy(entry: Entry, busy: Busy) -> bool:
    return entry in busy or entry.name in busy


class PodResidency:
    """One pod's engine state under ``engine``'s semantics; mutated by its three calls."""

    def __init__(self, engine: EngineModel, *, max_loras: int, max_cpu_loras: int | None) -> None:
        if max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {max_loras}")
        if max_cpu_loras is not None and max_cpu_loras < (
            max_loras if engine is EngineModel.VLLM else 1
        ):
            raise ValueError(f"max_cpu_loras {max_cpu_loras} is below max_loras {max_loras}")
        self.engine = engine
        self.max_loras = max_loras
        #: vLLM: the host cache's size (``--max-cpu-loras``, at least ``max_loras``);
        #: SGLang: ``--max-loaded-loras`` (None: no cap).
        self.max_cpu_loras = max_cpu_loras
        self._ids = itertools.count(1)
        self.restart()

    def restart(self) -> None:
        """Come back empty, as a restarted pod does."""
        #: Listed names (``/v1/models``) and their paths.
        self.listed: dict[str, str] = {}
        #: SGLang: names unloaded by the soft cap (or by an unload that ``remember``\ s
        #: them), still served (reloaded on use).
        self.parked: dict[str, str] = {}
        #: SGLang: parked names an unload took off a pin; their reload pins them again.
        self.parked_pins: set[str] = set()
        self._current: dict[str, Entry] = {}
        self._host: OrderedDict[Entry, None] = OrderedDict()
        self._gpu: OrderedDict[Entry, None] = OrderedDict()
        self.pinned: set[str] = set()

    # what the pod holds ------------------------------------------------------------
    def on_gpu(self) -> tuple[str, ...]:
        """Names of listed adapters on a GPU slot, least recently used first."""
        return tuple(e.name for e in self._gpu if self._current.get(e.name) == e)

    def in_host(self) -> tuple[str, ...]:
        """Names of listed adapters whose weights are in host memory, oldest first."""
        return tuple(e.name for e in self._host if self._current.get(e.name) == e)

    def ghosts_on_gpu(self) -> int:
        """GPU slots held by entries no listed name points to (vLLM after an unload)."""
        current = self._current
        ghosts = 0
        for e in self._gpu:  # a loop, not sum() over a generator: every request asks
            if current.get(e.name) is not e:
                ghosts += 1
        return ghosts

    def gpu_entries(self) -> tuple[tuple[str, bool], ...]:
        """Every GPU slot's entry, least recently used first: its name, and whether a
        listed name points to it (False: an unloaded name's entry, which keeps its slot
        on vLLM). For a ledger that must save the model and build it again."""
        return tuple((e.name, self._current.get(e.name) == e) for e in self._gpu)

    def host_entries(self) -> tuple[tuple[str, bool], ...]:
        """Every host-cache entry, oldest first, as ``gpu_entries`` gives them."""
        return tuple((e.name, self._current.get(e.name) == e) for e in self._host)

    def is_on_gpu(self, name: str) -> bool:
        entry = self._current.get(name)
        return entry is not None and entry in self._gpu

    def is_in_host(self, name: str) -> bool:
        """Whether ``name``'s current entry holds weights in the host cache."""
        entry = self._current.get(name)
        return entry is not None and entry in self._host

    def can_activate_now(self, name: str, *, busy: Busy = ()) -> bool:
        """Whether a request for ``name`` gets a GPU slot without pushing off an adapter
        that is pinned or ``busy`` (a scheduler would otherwise hold it back a step)."""
        return self.can_activate_entry(self._current.get(name), busy=busy)

    def can_activate_entry(self, entry: Entry | None, *, busy: Busy = ()) -> bool:
        """``can_activate_now`` for a request holding ``entry`` (``request_entry``).

        A ghost (an unloaded name's entry) a request still runs on holds its slot as any
        running entry does: vLLM's scheduler counts the batch's LoRAs by id
        (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``, ``scheduled_loras``)."""
        if (entry is not None and entry in self._gpu) or len(self._gpu) < self.max_loras:
            return True
        return any(e.name not in self.pinned and not _is_busy(e, busy) for e in self._gpu)

    def gpu_victim(self, *, busy: Busy = ()) -> Entry | None:
        """The entry an activation now would push off the GPU, as ``_activate`` picks it:
        the least recently used slot neither pinned nor ``busy``, else the least recently
        used unpinned one; None with a free slot, or when every slot is pinned. A vLLM
        ghost (an unloaded name's entry) is one slot among the others: ``busy`` covers
        the entries it holds, so of two ghosts of one name only the one a request runs
        on is kept."""
        gpu = self._gpu
        if len(gpu) < self.max_loras:
            return None
        # ``_victim`` over the unpinned slots, inlined: the router asks on every request.
        pinned = self.pinned
        fallback = None
        for entry in gpu:
            if entry.name in pinned:
                continue
            if entry not in busy and entry.name not in busy:
                return entry
            if fallback is None:
                fallback = entry
        return fallback

    def is_current(self, entry: Entry) -> bool:
        """Whether a listed name points to ``entry`` (False: a vLLM ghost)."""
        return self._current.get(entry.name) is entry

    def entry(self, name: str) -> Entry | None:
        """The entry a listed name points to now (vLLM: its id), for a request to hold
        from its arrival; None for a name not listed or without one."""
        return self._current.get(name) if name in self.listed else None

    def serves(self, name: str) -> bool:
        """Whether a request for ``name`` is accepted (listed, or parked on SGLang)."""
        return name in self.listed or name in self.parked

    # calls -------------------------------------------------------------------------
    def touch(self, name: str) -> bool:
        """``request`` of a name whose entry holds a GPU slot, where it does nothing but
        refresh the entry in both orders (its ``Effects`` are empty): True. False, with
        nothing changed, for any other name (``request`` then does the rest)."""
        entry = self._current.get(name)
        if (
            entry is None
            or entry not in self._gpu
            or entry not in self._host
            or name not in self.listed
            or name in self.parked
        ):
            return False
        self._gpu.move_to_end(entry)
        self._host.move_to_end(entry)
        return True

    def load(
        self,
        name: str,
        path: str,
        *,
        pinned: bool = False,
        inplace: bool = False,
        busy: Busy = (),
    ) -> Effects:
        """``load_lora_adapter``; raises ``AlreadyLoadedError``, ``CapReachedError`` (SGLang
        before the soft cap) or ``PinLimitError``."""
        if self.engine is EngineModel.VLLM:
            return self._vllm_load(name, path, inplace=inplace, busy=busy)
        return self._sglang_load(name, path, pinned=pinned)  # its soft cap is blind to busy

    def unload(self, name: str, *, remember: bool = False) -> Effects:
        """``unload_lora_adapter``: raises ``NotLoadedError`` for a name the pod does not list.

        SGLang refuses a name its soft cap unloaded too (``LoRARegistry.unregister`` finds
        no such name), and it stays parked: the next request loads it again.

        ``remember``: the engine's own unload (the emulator's). Since the soft cap
        (``EngineModel.SGLANG``) the tokenizer manager keeps every name it ever loaded in
        ``lora_ref_cache``, which an unload does not touch (sgl-project/sglang
        python/sglang/srt/managers/tokenizer_control_mixin.py ``unload_lora_adapter`` ->
        ``_unload_lora_adapter_locked``: ``LoRARegistry.unregister``, nothing else), so
        the name is parked: a request for it loads it again, pinned if it was
        (tokenizer_manager.py ``TokenizerManager._resolve_lora_path``). Without it (a
        ledger that learns the pod lacks the name) the name is forgotten."""
        if name not in self.listed:
            raise NotLoadedError(name)
        path = self.listed.pop(name)
        entry = self._current.pop(name, None)
        if self.engine is EngineModel.VLLM or entry is None:
            return Effects()  # vLLM: the host entry and the GPU slot stay (a ghost)
        if remember and self.engine is EngineModel.SGLANG:
            self.parked[name] = path
            if name in self.pinned:
                self.parked_pins.add(name)
        self.pinned.discard(name)
        self._host.pop(entry, None)
        was_on_gpu = entry in self._gpu
        self._gpu.pop(entry, None)
        return Effects(gpu_evicted=(name,) if was_on_gpu else ())

    def withdraw(self, name: str) -> None:
        """Take back a ``load`` the engine never made: ``name`` and its entry leave the
        listing, the host cache and the GPU as if never loaded, on either engine (no
        vLLM ghost: the pod never gave it a slot). Not an engine call: for a caller that
        applied a load it expected (a plan's) which the pod's listing then lacks."""
        self.listed.pop(name, None)
        self.parked.pop(name, None)  # SGLang: the soft cap may have parked the guess
        self.parked_pins.discard(name)
        self.pinned.discard(name)
        entry = self._current.pop(name, None)
        if entry is not None:
            self._host.pop(entry, None)
            self._gpu.pop(entry, None)

    def reinstate(self, name: str, *, behind: int = 0) -> bool:
        """Put back, as the oldest host-cache entry (where the LRU victim was), a name a
        load taken back (``withdraw``) pushed out: a listed vLLM name's weights, or a
        name SGLang's soft cap parked (listed again); ``behind`` the oldest that many
        entries (names put back before it that were older on the pod). True if it did;
        False, with nothing changed, for a name not served, still in the host cache, or
        when the cache is full (``max_cpu_loras``; SGLang's soft cap counts the listed
        names). Not an engine call: for a caller whose expected load the pod never
        made, so on the pod the name never left."""
        cap = self.max_cpu_loras
        if self.engine is EngineModel.VLLM:
            entry = self._current.get(name)
            if name not in self.listed or entry is None or entry in self._host:
                return False
            if cap is not None and len(self._host) >= cap:
                return False
        else:
            if name not in self.parked or (cap is not None and len(self.listed) >= cap):
                return False
            self.listed[name] = self.parked.pop(name)
            entry = self._current[name] = Entry(next(self._ids), name)
        older = list(itertools.islice(self._host, behind))
        self._host[entry] = None
        self._host.move_to_end(entry, last=False)
        for before in reversed(older):
            self._host.move_to_end(before, last=False)
        return True

    def reinstate_on_gpu(self, name: str, *, behind: int = 0) -> bool:
        """Give back, as the least recently used GPU slot (where the LRU victim was), a
        slot a load taken back (``withdraw``) pushed ``name`` off; ``behind`` the least
        recently used that many slots (names given back before it that were older on the
        pod), as ``reinstate``. The host order stays as it is (on the pod the name never
        moved). True if it did; False, with nothing
        changed, for a name not listed, whose weights are not in the host cache, already
        on the GPU, or when every slot is held. Not an engine call, as ``reinstate``."""
        entry = self._current.get(name)
        if (
            name not in self.listed
            or entry is None
            or entry not in self._host
            or entry in self._gpu
            or len(self._gpu) >= self.max_loras
        ):
            return False
        older = list(itertools.islice(self._gpu, behind))
        self._gpu[entry] = None
        self._gpu.move_to_end(entry, last=False)
        for before in reversed(older):
            self._gpu.move_to_end(before, last=False)
        return True

    def deactivate(self, name: str) -> bool:
        """Take ``name``'s entry off its GPU slot, its weights left in the host cache:
        for a caller that learns the pod pushed it off where the model kept it (the
        model took a slot it had free, which on the pod another name held). True if it
        did; False, with nothing changed, for a name whose entry holds no slot. Not an
        engine call, as ``reinstate``."""
        entry = self._current.get(name)
        if entry is None or entry not in self._gpu:
            return False
        del self._gpu[entry]
        return True

    def request(self, name: str, *, busy: Busy = ()) -> Effects:
        """A completion (or a warm-up) naming ``name``; raises ``NotLoadedError`` if refused,
        ``PinLimitError`` for a parked name to be pinned again with the pins taken."""
        if not self.serves(name):
            raise NotLoadedError(name)
        unlisted: tuple[str, ...] = ()
        left_gpu: tuple[str, ...] = ()
        if name in self.parked:
            if name in self.parked_pins and len(self.pinned) >= self.max_loras - 1:
                raise PinLimitError(name)  # the reload, pinned as loaded, is refused
            path = self.parked.pop(name)
            if name in self.parked_pins:
                self.parked_pins.discard(name)
                self.pinned.add(name)
            self.listed[name] = path
            unlisted, left_gpu = self._park_over_cap(keep=name)
            self._current[name] = Entry(next(self._ids), name)
        entry = self._current.get(name)
        if entry is None:  # vLLM: listed, but the id's entry was dropped
            entry = self._current[name] = Entry(next(self._ids), name)
        return self._run_on(entry, busy=busy, unlisted=unlisted, left_gpu=left_gpu)

    def request_entry(self, entry: Entry, *, busy: Busy = ()) -> Effects:
        """A request that runs on ``entry``, captured as it arrived (``entry``).

        While its name still points to it, this is ``request``. On vLLM an entry whose
        name was unloaded, or loaded again under a new id, still runs: it is read into the
        host cache again if it left it, and activated on a GPU slot, evicting the least
        recently used one as any activation does (``LRUCacheWorkerLoRAManager`` keys its
        caches by id). SGLang raises ``NotLoadedError``: its unload waits for the name's
        requests, so none runs on an entry gone."""
        if self._current.get(entry.name) is entry:
            return self.request(entry.name, busy=busy)
        if self.engine is not EngineModel.VLLM:
            raise NotLoadedError(entry.name)
        return self._run_on(entry, busy=busy)

    def next_step(self, running: Collection[Entry]) -> tuple[tuple[Entry, Effects], ...]:
        """vLLM's next step: the worker activates every entry its batch runs on
        (vllm/v1/worker/lora_model_runner_mixin.py ``set_active_loras`` ->
        vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager._apply_adapters``), so an
        entry pushed off the GPU while a request ran on it (a load's activation is plain
        LRU) takes a slot back, pushing off the least recently used entry outside the
        batch: the load's own, when every other slot runs. Returns each activation; none
        on SGLang, whose loads take no GPU slot."""
        if self.engine is not EngineModel.VLLM:
            return ()
        return tuple(
            (entry, self.request_entry(entry, busy=running))
            for entry in running
            if entry not in self._gpu
        )

    def last_step(self, entry: Entry | None) -> None:
        """A request on ``entry`` ran its last step: both engines mark every adapter of
        every batch they run as used, so an entry's GPU slot is as recent as its
        requests' last step, not their first. None (the base model) and an entry no
        longer on the GPU are left as they are.

        vLLM touches it in both caches each step (vllm/lora/worker_manager.py
        ``LRUCacheWorkerLoRAManager.add_adapter``: ``get_adapter``, then
        ``activate_adapter``, whose ``_active_adapters.touch`` refreshes the GPU slot).
        SGLang touches the GPU pool only (sgl-project/sglang
        python/sglang/srt/model_executor/forward_batch_info.py ``ForwardBatch.init_new``
        -> python/sglang/srt/lora/lora_manager.py ``LoRAManager.fetch_new_loras`` ->
        python/sglang/srt/lora/mem_pool.py ``LoRAMemoryPool.prepare_lora_batch``, which
        calls ``eviction_policy.mark_used`` for each uid of the batch; the default
        ``--lora-eviction-policy lru``, python/sglang/srt/lora/eviction_policy.py
        ``LRUEvictionPolicy``): the soft cap's order (``LoRARegistry``, the host order
        here) moves only as a request arrives (lora_registry.py ``acquire``)."""
        if entry is None or entry not in self._gpu:
            return
        self._gpu.move_to_end(entry)
        if self.engine is EngineModel.VLLM:
            self._host.move_to_end(entry)

    # vLLM --------------------------------------------------------------------------
    def _vllm_load(self, name: str, path: str, *, inplace: bool, busy: Busy) -> Effects:
        if name in self.listed and not inplace:
            raise AlreadyLoadedError(name)
        entry = self._current.get(name) if inplace else None
        if entry is None:
            entry = Entry(next(self._ids), name)
        self.listed[name] = path
        self._current[name] = entry
        # The weights are read again either way; in place, the worker removes the old
        # ones first (``remove_adapter`` deactivates too), so they are copied to the GPU again.
        self._host.pop(entry, None)
        self._gpu.pop(entry, None)
        return self._run_on(entry, busy=busy)  # cold: the entry just left the host cache

    # SGLang ------------------------------------------------------------------------
    def _sglang_load(self, name: str, path: str, *, pinned: bool) -> Effects:
        if name in self.listed:
            raise AlreadyLoadedError(name)
        if pinned and len(self.pinned) >= self.max_loras - 1:
            raise PinLimitError(name)
        cap = self.max_cpu_loras
        hard = self.engine is EngineModel.SGLANG_HARD_CAP
        if hard and cap is not None and len(self.listed) >= cap:
            raise CapReachedError(name)
        self.parked.pop(name, None)
        self.parked_pins.discard(name)  # ``lora_ref_cache`` holds this load's ``pinned``
        entry = Entry(next(self._ids), name)
        self.listed[name] = path
        self._current[name] = entry
        self._host[entry] = None
        if pinned:
            # A pinned load stays in host memory like any other: it enters the GPU pool
            # at its first batch, and from then on is never evicted.
            self.pinned.add(name)
        unlisted, left_gpu = ((), ()) if hard else self._park_over_cap(keep=name)
        return Effects(cold=True, gpu_evicted=left_gpu, unlisted=unlisted)

    def _park_over_cap(self, *, keep: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """SGLang's soft cap: unload least recently used unpinned adapters past it, with
        requests in flight or not (sgl-project/sglang
        python/sglang/srt/managers/tokenizer_manager.py ``load_lora_adapter`` takes
        ``LoRARegistry.lru_lora_name(exclude_pinned=True)``, blind to the in-flight
        counters, and its unload waits for them: ``LoRARegistry.wait_for_unload``).

        Returns the names unloaded, and those of them that left a GPU slot."""
        cap = self.max_cpu_loras
        parked: list[str] = []
        left_gpu: list[str] = []
        while cap is not None and len(self.listed) > cap:
            victim = next(
                (e for e in self._host if e.name != keep and e.name not in self.pinned), None
            )
            if victim is None:
                break
            self.parked[victim.name] = self.listed.pop(victim.name)
            self._current.pop(victim.name, None)
            self._host.pop(victim, None)
            if victim in self._gpu:
                del self._gpu[victim]
                left_gpu.append(victim.name)
            parked.append(victim.name)
        return tuple(parked), tuple(left_gpu)

    # shared ------------------------------------------------------------------------
    def _run_on(
        self,
        entry: Entry,
        *,
        busy: Busy,
        unlisted: tuple[str, ...] = (),
        left_gpu: tuple[str, ...] = (),
    ) -> Effects:
        """What a load or a request does to ``entry``: its weights read into the host
        cache if they are not there (a cold read), then activated on a GPU slot; the
        ``Effects`` of both. ``unlisted`` and ``left_gpu`` are what the soft cap did
        first (``request`` of a parked name): the names it unloaded, and those of them
        that left a GPU slot."""
        cold = entry not in self._host
        host_evicted, host_left_gpu = self._into_host(entry, busy=busy) if cold else ((), ())
        activated, gpu_evicted = self._activate(entry, busy=busy)
        return Effects(
            cold=cold,
            activated=activated,
            gpu_evicted=left_gpu + host_left_gpu + gpu_evicted,
            host_evicted=host_evicted,
            unlisted=unlisted,
        )

    def _into_host(self, entry: Entry, *, busy: Busy) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Put ``entry`` in the host cache; returns the names dropped from it, and those
        of them that left a GPU slot with it: vLLM's host cache calls
        ``deactivate_adapter`` on the entry it drops (vllm/lora/model_manager.py,
        ``LRUCacheLoRAModelManager``: ``_registered_adapters`` is an ``AdapterLRUCache``
        whose ``_on_remove`` deactivates; ``remove_oldest_adapter`` drops it)."""
        self._host[entry] = None
        evicted: list[str] = []
        left_gpu: list[str] = []
        cap = self.max_cpu_loras
        if self.engine is not EngineModel.VLLM or cap is None:
            return (), ()
        while len(self._host) > cap:
            victim = self._victim((e for e in self._host if e != entry), busy)
            if victim is None:
                break
            del self._host[victim]
            evicted.append(victim.name)
            if victim in self._gpu:
                del self._gpu[victim]
                left_gpu.append(victim.name)
        return tuple(evicted), tuple(left_gpu)

    def _activate(self, entry: Entry, *, busy: Busy) -> tuple[bool, tuple[str, ...]]:
        if entry in self._gpu:
            self._gpu.move_to_end(entry)
            self._host.move_to_end(entry)
            return False, ()
        evicted: list[str] = []
        while len(self._gpu) >= self.max_loras:
            victim = self._victim((e for e in self._gpu if e.name not in self.pinned), busy)
            if victim is None:
                break
            del self._gpu[victim]
            evicted.append(victim.name)
        self._gpu[entry] = None
        self._host.move_to_end(entry)
        return True, tuple(evicted)

    @staticmethod
    def _victim(candidates: Iterable[Entry], busy: Busy) -> Entry | None:
        """The least recently used candidate not busy, else the least recently used."""
        fallback = None
        for entry in candidates:
            if not _is_busy(entry, busy):
                return entry
            if fallback is None:
                fallback = entry
        return fallback
