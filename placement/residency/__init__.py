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
  - each step the worker activates every entry its batch runs on
    (vllm/v1/worker/lora_model_runner_mixin.py ``set_active_loras``): ``next_step``
    gives back the slot a load's plain-LRU activation took from a running entry.
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
  - every forward batch marks each adapter it runs on as used in the pool's LRU
    (``ForwardBatch.init_new`` -> ``LoRAManager.fetch_new_loras`` ->
    ``prepare_lora_batch``: ``eviction_policy.mark_used``; python/sglang/srt/lora/
    eviction_policy.py ``LRUEvictionPolicy``, the default ``--lora-eviction-policy``),
    and a decode batch holds every running request: a slot is as recent as its
    requests' last step (``last_step``), as on vLLM. The victim is the least recently
    used slot whose adapter is neither in the batch nor pinned. The soft cap's order
    (``LoRARegistry``) moves only as a request arrives (``acquire``).
  - not modeled: the pool's slot for the base model (uid None, taken at start by
    ``LoRAManager.init_memory_pool``; a base request takes it back), which is evicted
    only when no adapter can be (``prepare_lora_batch`` prefers the adapters): adapters
    hold ``max_loras - 1`` slots until one batch needs them all, and again after each
    base-model request; and ``--lora-eviction-policy fifo``.
  - an unload removes the adapter from the listing, the host memory and the GPU, but
    the tokenizer manager's ``lora_ref_cache`` keeps every name it ever loaded
    (python/sglang/srt/managers/tokenizer_control_mixin.py ``unload_lora_adapter`` ->
    ``_unload_lora_adapter_locked`` only unregisters it): the engine's own unload
    (``unload(..., remember=True)``) parks the name, and a request for it loads it
    again, pinned if it was (python/sglang/srt/managers/tokenizer_manager.py
    ``TokenizerManager._resolve_lora_path``, which loads every name the registry lacks
    that the cache holds). A request for a name never loaded is refused (400: "Got
    LoRA adapter that has never been loaded", from ``_resolve_lora_path``; before PR
    #11526 "The following requested LoRA adapters are not loaded", from
    lora_registry.py ``acquire``, for an unloaded name too). An unload of a parked name
    is refused as unknown (``LoRARegistry.unregister``) and leaves it parked.

``EngineModel.SGLANG_HARD_CAP``: SGLang before PR #11526, where a load past
``--max-loaded-loras`` is refused instead.

Pure: no IO, no clock. A caller with requests in flight passes what they run on as
``busy``, which eviction skips while it has another choice: the entries, as both
engines count a batch's adapters (vLLM's scheduler by ``lora_int_id``,
vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``; SGLang's pool by the adapter's
uid, python/sglang/srt/lora/mem_pool.py ``LoRAMemoryPool.prepare_lora_batch``), so a
vLLM ghost a request still runs on keeps its slot and a name's other entry may go; or,
from a caller that counts by name, names, each covering every entry of that name.

``vocabulary`` holds what the calls take and give (the engine models, the refusals,
``Effects``, ``Entry``); ``state`` holds ``PodResidency``. Import both from here.
"""

from placement.residency.state import Busy, PodResidency
from placement.residency.vocabulary import (
    AlreadyLoadedError,
    CapReachedError,
    Effects,
    EngineModel,
    Entry,
    NotLoadedError,
    PinLimitError,
    ResidencyError,
    engine_model,
)

__all__ = [
    "AlreadyLoadedError",
    "Busy",
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
