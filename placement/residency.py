"""What a pod's engine holds, and what each call does to it: one model for every part.

Neither vLLM nor SGLang reports which adapters sit on its GPU, so every part of
lorafleet that needs to know (the emulator, the replay simulator, the router's and the
controller's ledgers, reconcile's ordering and its property tests) runs this model of
the engine instead of keeping its own. ``PodResidency`` is a state machine: names the
API server lists, the host (CPU) cache, the GPU slots, pins, and LRU orders; ``load``,
``unload`` and ``request`` (a warm-up is a request; ``request_entry`` one on the entry
it arrived with) change them and return ``Effects`` saying what moved. Three engine
models, from the engines' source:

``EngineModel.VLLM`` (vllm-project/vllm)
  - a load registers the name with a new integer id
    (vllm/entrypoints/openai/models/serving.py, ``OpenAIServingModels.load_lora_adapter``)
    and the worker's ``add_adapter`` (vllm/lora/worker_manager.py,
    ``LRUCacheWorkerLoRAManager.add_adapter``) reads the weights into the host cache,
    dropping its oldest entry past ``max_cpu_loras`` (that entry leaves the GPU too),
    and then *activates* the adapter on a GPU slot, evicting the least recently used
    active one (vllm/lora/model_manager.py, ``LRUCacheLoRAModelManager.activate_adapter``).
    Every load takes a GPU slot: there is no host-only load over HTTP.
  - an unload only forgets the name in the API server (``unload_lora_adapter`` deletes
    it from ``lora_requests``); the host entry and the GPU slot stay, under their old
    id, until LRU eviction. Loading the name again gives a new id and a second entry.
  - a request for a listed name whose weights left the host cache reads them again
    from its path, then activates them; ``load_inplace`` reloads under the same id
    (``add_adapter`` removes the old weights first, so they are activated again).
  - a request keeps the ``LoRARequest`` (id, path) its name pointed to as it arrived
    (vllm/entrypoints/openai/engine/serving.py, ``OpenAIServing._maybe_get_adapters``):
    if the name is unloaded, or loaded again under a new id, while it waits, it still
    runs on that id, read again if it left the host cache and activated on a GPU slot
    (vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager._apply_adapters`` ->
    ``add_adapter``, keyed by id): ``entry`` as it arrives, ``request_entry`` as it runs.
  - no pins over HTTP (``pin_lora`` is engine API only).

``EngineModel.SGLANG`` (sgl-project/sglang, since PR #11526)
  - a load reads the weights into host memory (python/sglang/srt/lora/lora_manager.py,
    ``LoRAManager.load_lora_adapter``); ``--max-loaded-loras`` is a soft cap: past it
    the least recently used unpinned adapter is unloaded (it leaves ``/v1/models``) and
    is loaded again by itself on its next request (the tokenizer manager's
    ``load_lora_adapter``: ``lora_registry.lru_lora_name(exclude_pinned=True)``, then the
    unload path, which waits for that adapter's requests in flight).
  - the GPU pool has ``--max-loras-per-batch`` slots (python/sglang/srt/lora/mem_pool.py,
    ``LoRAMemoryPool.prepare_lora_batch``): a request moves its adapter in, evicting
    the least recently used one not pinned; a pinned adapter (at most slots - 1) is
    loaded into host memory like the others (``LoRAManager.load_lora_adapter``) and,
    once its first batch brings it onto the GPU, stays there.
  - an unload removes the adapter everywhere; a request for a name never loaded, or
    unloaded, is refused (400: "Got LoRA adapter that has never been loaded", from
    python/sglang/srt/managers/tokenizer_manager.py ``TokenizerManager._resolve_lora_path``,
    which also loads a parked adapter again; before PR #11526 "The following
    requested LoRA adapters are not loaded", from lora_registry.py ``acquire``). An
    unload of a name the soft cap unloaded is refused as unknown
    (``LoRARegistry.unregister``) and leaves it parked, to be loaded again on use.

``EngineModel.SGLANG_HARD_CAP``: SGLang before PR #11526, where a load past
``--max-loaded-loras`` is refused instead.

Pure: no IO, no clock. A caller with requests in flight passes ``busy`` names, which
eviction skips while it has another choice.
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from placement.domain import Engine

__all__ = [
    "AlreadyLoadedError",
    "CapReachedError",
    "Effects",
    "EngineModel",
    "Entry",
    "NotLoadedError",
    "PinLimitError",
    "PodResidency",
    "ResidencyError",
    "engine_model",
]


class EngineModel(enum.StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"
    SGLANG_HARD_CAP = "sglang-hard-cap"

    @property
    def is_sglang(self) -> bool:
        return self is not EngineModel.VLLM


def engine_model(engine: Engine) -> EngineModel:
    """The model of a pool's engine: SGLang is taken as current SGLang (the soft cap)."""
    return EngineModel.VLLM if engine is Engine.VLLM else EngineModel.SGLANG


class ResidencyError(Exception):
    """A call the engine refuses; the pod's dialect chooses the status code and text."""

    def __init__(self, adapter: str) -> None:
        self.adapter = adapter
        super().__init__(adapter)


class AlreadyLoadedError(ResidencyError):
    """The name is loaded already (vLLM 400 without ``load_inplace``; SGLang 400)."""


class NotLoadedError(ResidencyError):
    """The name is not loaded (vLLM: 404 on unload and on requests; SGLang: 400)."""


class CapReachedError(ResidencyError):
    """SGLang before the soft cap: ``--max-loaded-loras`` adapters are loaded already."""


class PinLimitError(ResidencyError):
    """SGLang: pinned adapters may hold at most ``max_loras - 1`` GPU slots."""


@dataclass(frozen=True, kw_only=True)
class Effects:
    """What one call did to the pod, for timing (a cold read, a swap) and for ledgers."""

    #: The weights were read from storage (a cold load).
    cold: bool = False
    #: The adapter took a GPU slot it did not hold (a swap: the batch drains).
    activated: bool = False
    #: Names pushed off the GPU by this call (vLLM ghosts of unloaded names included).
    gpu_evicted: tuple[str, ...] = ()
    #: Names dropped from the host cache (on vLLM still listed; reloaded on next use).
    host_evicted: tuple[str, ...] = ()
    #: SGLang's soft cap: names that left ``/v1/models`` (reloaded on their next request).
    unlisted: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False, slots=True)
class Entry:
    """One host-cache entry: vLLM keys them by id, so an unloaded name can leave one.
    A request holds the entry its name pointed to as it arrived (``PodResidency.entry``).

    Compared and hashed by identity (each is made once, with a fresh id), so the orders
    keyed by entries cost no Python-level ``__hash__`` or ``__eq__`` per lookup."""

    entry_id: int
    name: str


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
        #: SGLang: names unloaded by the soft cap, still served (reloaded on use).
        self.parked: dict[str, str] = {}
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
        return sum(1 for e in self._gpu if self._current.get(e.name) != e)

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

    def can_activate_now(self, name: str, *, busy: Collection[str] = ()) -> bool:
        """Whether a request for ``name`` gets a GPU slot without pushing off an adapter
        that is pinned or ``busy`` (a scheduler would otherwise hold it back a step)."""
        return self.can_activate_entry(self._current.get(name), busy=busy)

    def can_activate_entry(self, entry: Entry | None, *, busy: Collection[str] = ()) -> bool:
        """``can_activate_now`` for a request holding ``entry`` (``request_entry``)."""
        if (entry is not None and entry in self._gpu) or len(self._gpu) < self.max_loras:
            return True
        return any(
            e.name not in self.pinned and (self._current.get(e.name) != e or e.name not in busy)
            for e in self._gpu
        )

    def entry(self, name: str) -> Entry | None:
        """The entry a listed name points to now (vLLM: its id), for a request to hold
        from its arrival; None for a name not listed or without one."""
        return self._current.get(name) if name in self.listed else None

    def serves(self, name: str) -> bool:
        """Whether a request for ``name`` is accepted (listed, or parked on SGLang)."""
        return name in self.listed or name in self.parked

    # calls -------------------------------------------------------------------------
    def load(
        self,
        name: str,
        path: str,
        *,
        pinned: bool = False,
        inplace: bool = False,
        busy: Collection[str] = (),
    ) -> Effects:
        """``load_lora_adapter``; raises ``AlreadyLoadedError``, ``CapReachedError`` (SGLang
        before the soft cap) or ``PinLimitError``."""
        if self.engine is EngineModel.VLLM:
            return self._vllm_load(name, path, inplace=inplace, busy=busy)
        return self._sglang_load(name, path, pinned=pinned, busy=busy)

    def unload(self, name: str) -> Effects:
        """``unload_lora_adapter``: raises ``NotLoadedError`` for a name the pod does not list.

        SGLang refuses a name its soft cap unloaded too (``LoRARegistry.unregister`` finds
        no such name), and it stays parked: the next request loads it again."""
        if name not in self.listed:
            raise NotLoadedError(name)
        self.listed.pop(name, None)
        entry = self._current.pop(name, None)
        if self.engine is EngineModel.VLLM or entry is None:
            return Effects()  # vLLM: the host entry and the GPU slot stay (a ghost)
        self.pinned.discard(name)
        self._host.pop(entry, None)
        was_on_gpu = entry in self._gpu
        self._gpu.pop(entry, None)
        return Effects(gpu_evicted=(name,) if was_on_gpu else ())

    def request(self, name: str, *, busy: Collection[str] = ()) -> Effects:
        """A completion (or a warm-up) naming ``name``; raises ``NotLoadedError`` if refused."""
        if not self.serves(name):
            raise NotLoadedError(name)
        cold = False
        host_evicted: tuple[str, ...] = ()
        unlisted: tuple[str, ...] = ()
        left_gpu: tuple[str, ...] = ()
        if name in self.parked:
            path = self.parked.pop(name)
            self.listed[name] = path
            unlisted, left_gpu = self._park_over_cap(keep=name, busy=busy)
            self._current[name] = Entry(next(self._ids), name)
        entry = self._current.get(name)
        if entry is None:  # vLLM: listed, but the id's entry was dropped
            entry = self._current[name] = Entry(next(self._ids), name)
        if entry not in self._host:
            cold = True
            host_evicted = self._into_host(entry, busy=busy)
        activated, gpu_evicted = self._activate(entry, busy=busy)
        return Effects(
            cold=cold,
            activated=activated,
            gpu_evicted=left_gpu + gpu_evicted,
            host_evicted=host_evicted,
            unlisted=unlisted,
        )

    def request_entry(self, entry: Entry, *, busy: Collection[str] = ()) -> Effects:
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
        cold = entry not in self._host
        host_evicted = self._into_host(entry, busy=busy) if cold else ()
        activated, gpu_evicted = self._activate(entry, busy=busy)
        return Effects(
            cold=cold, activated=activated, gpu_evicted=gpu_evicted, host_evicted=host_evicted
        )

    # vLLM --------------------------------------------------------------------------
    def _vllm_load(self, name: str, path: str, *, inplace: bool, busy: Collection[str]) -> Effects:
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
        host_evicted = self._into_host(entry, busy=busy)
        activated, gpu_evicted = self._activate(entry, busy=busy)
        return Effects(
            cold=True, activated=activated, gpu_evicted=gpu_evicted, host_evicted=host_evicted
        )

    # SGLang ------------------------------------------------------------------------
    def _sglang_load(self, name: str, path: str, *, pinned: bool, busy: Collection[str]) -> Effects:
        if name in self.listed:
            raise AlreadyLoadedError(name)
        if pinned and len(self.pinned) >= self.max_loras - 1:
            raise PinLimitError(name)
        cap = self.max_cpu_loras
        hard = self.engine is EngineModel.SGLANG_HARD_CAP
        if hard and cap is not None and len(self.listed) >= cap:
            raise CapReachedError(name)
        self.parked.pop(name, None)
        entry = Entry(next(self._ids), name)
        self.listed[name] = path
        self._current[name] = entry
        self._host[entry] = None
        if pinned:
            # A pinned load stays in host memory like any other: it enters the GPU pool
            # at its first batch, and from then on is never evicted.
            self.pinned.add(name)
        unlisted, left_gpu = ((), ()) if hard else self._park_over_cap(keep=name, busy=busy)
        return Effects(cold=True, gpu_evicted=left_gpu, unlisted=unlisted)

    def _park_over_cap(
        self, *, keep: str, busy: Collection[str]
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """SGLang's soft cap: unload least recently used unpinned adapters past it.

        Returns the names unloaded, and those of them that left a GPU slot."""
        cap = self.max_cpu_loras
        parked: list[str] = []
        left_gpu: list[str] = []
        while cap is not None and len(self.listed) > cap:
            victim = self._victim(
                (e for e in self._host if e.name != keep and e.name not in self.pinned), busy
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
    def _into_host(self, entry: Entry, *, busy: Collection[str]) -> tuple[str, ...]:
        self._host[entry] = None
        evicted: list[str] = []
        cap = self.max_cpu_loras
        if self.engine is not EngineModel.VLLM or cap is None:
            return ()
        while len(self._host) > cap:
            victim = self._victim((e for e in self._host if e != entry), busy)
            if victim is None:
                break
            del self._host[victim]
            self._gpu.pop(victim, None)  # leaving the host cache leaves the GPU too
            evicted.append(victim.name)
        return tuple(evicted)

    def _activate(self, entry: Entry, *, busy: Collection[str]) -> tuple[bool, tuple[str, ...]]:
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
    def _victim(candidates: Iterable[Entry], busy: Collection[str]) -> Entry | None:
        """The least recently used candidate not busy, else the least recently used."""
        fallback = None
        for entry in candidates:
            if entry.name not in busy:
                return entry
            if fallback is None:
                fallback = entry
        return fallback
