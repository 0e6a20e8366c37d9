"""The contract for requests in flight, on emulated pods: what a request waiting or
running holds while its adapter is unloaded, loaded again or evicted, and what an
unload waits for, engine by engine. Each test's docstring names the engine source.
"""

from __future__ import annotations

import asyncio

import pytest

from placement.domain import Engine
from placement.emulator import ZERO_LATENCY, EmulatedPod, PodConfig
from placement.emulator.refusals import NotLoadedError
from placement.emulator.wire import pod_stats
from placement.residency import EngineModel
from tests.pods.contract_target import (
    HARD,
    SGLANG,
)

pytestmark = pytest.mark.anyio


async def _spin() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _two_slots_busy(engine: Engine) -> EmulatedPod:
    """A pod with two GPU slots (SGLang: ``max_loras_per_batch`` 2), adapters a, b and
    c loaded, and one request each for a and b running."""
    pod = EmulatedPod(PodConfig(engine=engine, latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4))
    for name in ("a", "b", "c"):
        await pod.load(name, f"s3://adapters/{name}")
    await pod.admit("a")
    await pod.admit("b")
    return pod


async def test_vllm_a_waiting_request_runs_though_its_adapter_was_unloaded_meanwhile() -> None:
    """The API server checks the name only as a request arrives (vllm-project/vllm
    vllm/entrypoints/openai/engine/serving.py ``OpenAIServing._check_model``, then
    ``_maybe_get_adapters`` hands the request its ``LoRARequest`` from
    ``OpenAIServingModels.lora_requests``); an unload only deletes that entry
    (vllm/entrypoints/openai/models/serving.py ``unload_lora_adapter``). The request in
    the engine keeps its ``LoRARequest`` (id and path): when it is scheduled the worker
    loads and activates it (vllm/v1/worker/lora_model_runner_mixin.py
    ``set_active_loras`` -> vllm/lora/worker_manager.py
    ``LRUCacheWorkerLoRAManager._apply_adapters`` -> ``add_adapter``). So it runs; a
    request arriving after the unload is refused."""
    pod = await _two_slots_busy(Engine.VLLM)
    waiting = asyncio.ensure_future(pod.admit("c"))  # both GPU slots run a and b
    await _spin()
    await pod.unload("c")
    await _spin()
    early = waiting.done()
    await pod.release("b")  # b's slot: c runs
    await waiting
    assert not early
    assert pod.running["c"] == 1
    with pytest.raises(NotLoadedError):
        await pod.admit("c")
    for name in ("a", "c"):
        await pod.release(name)


async def test_sglang_an_unload_waits_for_the_adapters_queued_requests_too() -> None:
    """The tokenizer counts a request against its adapter from ``LoRARegistry.acquire``,
    before the request reaches the scheduler's waiting queue, until ``release`` as it
    finishes (sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py
    ``_resolve_lora_path``; python/sglang/srt/lora/lora_registry.py ``acquire``,
    ``release``), and ``_unload_lora_adapter_locked``
    (python/sglang/srt/managers/tokenizer_control_mixin.py) waits in
    ``LoRARegistry.wait_for_unload`` for that count to reach zero: a queued request
    holds the unload as a running one does, and runs."""
    pod = await _two_slots_busy(Engine.SGLANG)
    queued = asyncio.ensure_future(pod.admit("c"))  # the batch has two adapters already
    await _spin()
    unloading = asyncio.ensure_future(pod.unload("c"))
    await _spin()
    early = (queued.done(), unloading.done())
    await pod.release("b")  # c's request runs
    await queued
    await _spin()
    running = unloading.done()
    await pod.release("c")
    await unloading
    assert early == (False, False)
    assert not running
    assert "c" not in pod.listed
    await pod.release("a")


@pytest.mark.parametrize("model", [SGLANG, HARD], ids=["soft-cap", "hard-cap"])
async def test_sglang_a_request_arriving_while_an_unload_waits_does_not_hold_it(
    model: EngineModel,
) -> None:
    """``_unload_lora_adapter_locked`` unregisters the name before it waits
    (sgl-project/sglang python/sglang/srt/lora/lora_registry.py
    ``LoRARegistry.unregister``), so ``/v1/models``, which lists the registry
    (python/sglang/srt/entrypoints/http_server.py ``available_models`` ->
    ``get_all_adapters``), drops it at once, and a request arriving then acquires
    nothing. Before the soft cap ``acquire`` refuses it ("The following requested LoRA
    adapters are not loaded"); since, ``TokenizerManager._resolve_lora_path`` finds the
    name missing from the registry but in ``lora_ref_cache`` and loads it again through
    ``load_lora_adapter``, which waits for ``lora_update_lock``: for the unload to end."""
    config = PodConfig(engine=Engine.SGLANG, engine_model=model, latency=ZERO_LATENCY, max_loras=2)
    pod = EmulatedPod(config)
    await pod.load("a", "s3://adapters/a")
    await pod.admit("a")
    unloading = asyncio.ensure_future(pod.unload("a"))
    await _spin()
    arriving = asyncio.ensure_future(pod.admit("a"))
    await _spin()
    during = ("a" in pod.listed, unloading.done(), arriving.done())
    await pod.release("a")  # the request that arrived first ends
    await _spin()
    after = (unloading.done(), arriving.done())
    refused = arriving.done() and isinstance(arriving.exception(), NotLoadedError)
    for pending in (unloading, arriving):  # before any assert: a failure must not hang
        pending.cancel()
    if model is HARD:
        assert (during, after, refused) == ((False, False, True), (True, True), True)
        assert "a" not in pod.listed
    else:
        assert (during, after, refused) == ((False, False, False), (True, True), False)
        assert "a" in pod.listed and pod.counters["cold_reloads"] == 1
        await pod.release("a")


def _held(pod: EmulatedPod) -> tuple[object, ...]:
    stats = pod_stats(pod)
    counters = stats["counters"]
    assert isinstance(counters, dict)
    return stats["host"], stats["gpu"], stats["ghosts"], counters["gpu_evictions"]


async def test_vllm_a_request_waiting_through_an_unload_takes_a_gpu_slot() -> None:
    """The request runs on the id it arrived with (vllm-project/vllm
    vllm/entrypoints/openai/engine/serving.py ``OpenAIServing._maybe_get_adapters``), and
    the worker activates that id as any other: vllm/lora/worker_manager.py
    ``LRUCacheWorkerLoRAManager._apply_adapters`` -> ``add_adapter`` (its caches keyed by
    ``lora_int_id``) -> vllm/lora/model_manager.py ``LRUCacheLoRAModelManager.activate_adapter``,
    evicting the least recently used slot. The unload freed none (``unload_lora_adapter``
    in vllm/entrypoints/openai/models/serving.py deletes the name only), so /admin/stats
    shows c's entry as a ghost on the GPU and b, the LRU idle one, pushed off."""
    pod = await _two_slots_busy(Engine.VLLM)  # gpu [a, b]; c's entry in the host cache
    waiting = asyncio.ensure_future(pod.admit("c"))
    await _spin()
    await pod.unload("c")
    before = _held(pod)
    await pod.release("b")
    await waiting
    assert before == (["a", "b"], ["a", "b"], 0, 3)
    assert _held(pod) == (["a", "b"], ["a"], 1, 4)
    assert pod.counters["gpu_activations"] == 6  # three loads, a, b, then c's old entry
    for name in ("a", "c"):
        await pod.release(name)


async def test_vllm_a_request_waiting_through_a_reload_runs_on_its_old_id() -> None:
    """Loading the name again gives it a new ``lora_int_id``
    (vllm/entrypoints/openai/models/serving.py ``OpenAIServingModels.load_lora_adapter``);
    the waiting request's ``LoRARequest`` keeps the old one. While a and b run, the
    scheduler holds it back (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``:
    ``scheduled_loras`` has ``max_loras`` ids), though the load pushed a off its slot: the
    next step takes it back (``test_vllm_a_load_while_every_slot_runs_...``). Once b ends
    the worker activates the old entry (``LRUCacheWorkerLoRAManager.add_adapter`` looks it
    up by id), not the new one the name now lists."""
    pod = await _two_slots_busy(Engine.VLLM)
    waiting = asyncio.ensure_future(pod.admit("c"))
    await _spin()
    await pod.unload("c")
    await pod.load("c", "s3://adapters/c")  # a new id on a's slot; a takes it back
    await _spin()
    held, early = _held(pod), waiting.done()
    await pod.release("b")
    await waiting  # b's slot: c's old entry takes it
    assert (held, early) == ((["b", "c", "a"], ["b", "a"], 0, 5), False)
    assert _held(pod) == (["c", "a", "b"], ["a"], 1, 6)  # b's last step touched it
    for name in ("a", "c"):
        await pod.release(name)


async def test_vllm_a_load_while_every_slot_runs_leaves_the_running_adapters_on_the_gpu() -> None:
    """A load over HTTP activates the adapter by plain LRU (vllm-project/vllm
    vllm/lora/model_manager.py ``LRUCacheLoRAModelManager.activate_adapter``:
    ``_active_adapters.remove_oldest()``, blind to the batch), so it pushes off a, which a
    request runs on. At the next step the worker activates every id the batch runs on
    (vllm/v1/worker/lora_model_runner_mixin.py ``set_active_loras`` ->
    vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager._apply_adapters``): a takes
    a slot back and pushes off the least recently used id outside the batch, d itself.
    d stays loaded, in host memory, and its first request waits for a slot."""
    pod = await _two_slots_busy(Engine.VLLM)  # gpu [a, b], both running
    await pod.load("d", "s3://adapters/d")
    assert _held(pod) == (["c", "b", "d", "a"], ["b", "a"], 0, 5)
    assert pod.counters["gpu_activations"] == 7  # four loads, a, b, then a again
    for name in ("a", "b"):
        await pod.release(name)


async def test_vllm_a_request_running_on_an_unloaded_names_old_id_keeps_its_gpu_slot() -> None:
    """The scheduler counts the running batch's LoRAs by id (vllm-project/vllm
    vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``: ``scheduled_loras`` holds
    ``lora_request.lora_int_id``), and each step the worker activates every id in the
    batch (vllm/v1/worker/lora_model_runner_mixin.py ``set_active_loras`` ->
    vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager._apply_adapters``), so the
    slot that goes is the least recently used id outside the batch. A request running on
    c's first id holds that id's slot through an unload and a load of c; a request for a
    pushes off c's new, idle id, not the old one it runs on."""
    config = PodConfig(engine=Engine.VLLM, latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    pod = EmulatedPod(config)
    for name in ("a", "c"):
        await pod.load(name, f"s3://adapters/{name}")
    running = await pod.admit("c")  # on c's first id
    await pod.unload("c")
    await pod.load("c", "s3://adapters/c")  # a new id: a, idle, leaves its slot
    reloaded = _held(pod)
    second = await pod.admit("a")
    assert reloaded == (["a", "c"], ["c"], 1, 1)
    assert _held(pod) == (["c", "a"], ["a"], 1, 2)  # the old id runs on: a ghost on the GPU
    await pod.release("c", running)
    await pod.release("a", second)
    assert not pod.running_entries.busy()


async def test_vllm_an_adapter_is_used_last_at_its_requests_last_step_not_its_first() -> None:
    """Each step the worker activates every id its batch runs on, touching it in both
    LRU caches (vllm-project/vllm vllm/lora/worker_manager.py
    ``LRUCacheWorkerLoRAManager._apply_adapters`` -> ``add_adapter``: ``get_adapter``,
    then vllm/lora/model_manager.py ``LRUCacheLoRAModelManager.activate_adapter``:
    ``_active_adapters.touch``). A long request on a, a short one on b inside it: a ran
    last, so the next activation (c's load) pushes off b, not a."""
    config = PodConfig(engine=Engine.VLLM, latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    pod = EmulatedPod(config)
    for name in ("a", "b"):
        await pod.load(name, f"s3://adapters/{name}")
    long = await pod.admit("a")
    short = await pod.admit("b")
    await pod.release("b", short)
    await pod.release("a", long)
    await pod.load("c", "s3://adapters/c")
    assert pod.gpu == ("a", "c")


async def test_sglang_an_adapter_is_used_last_at_its_requests_last_step_not_its_first() -> None:
    """Each forward batch marks every adapter it runs on as used in the GPU pool's LRU
    (sgl-project/sglang python/sglang/srt/model_executor/forward_batch_info.py
    ``ForwardBatch.init_new`` -> python/sglang/srt/lora/lora_manager.py
    ``LoRAManager.fetch_new_loras`` -> python/sglang/srt/lora/mem_pool.py
    ``LoRAMemoryPool.prepare_lora_batch``: ``eviction_policy.mark_used`` for each uid,
    python/sglang/srt/lora/eviction_policy.py ``LRUEvictionPolicy``), and a decode
    batch holds every running request. A long request on a, a short one on b inside
    it: a ran last, so c's first batch evicts b (``select_victim``: the least recently
    used slot outside the batch, not pinned), not a. (The real pool gives the base
    model a slot of its own as well, ``LoRAManager.init_memory_pool``; it is evicted
    only when no adapter can be, so it does not change the victim here.)"""
    config = PodConfig(engine=Engine.SGLANG, latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    pod = EmulatedPod(config)
    for name in ("a", "b", "c"):
        await pod.load(name, f"s3://adapters/{name}")
    long = await pod.admit("a")
    short = await pod.admit("b")
    await pod.release("b", short)
    await pod.release("a", long)
    third = await pod.admit("c")
    assert pod.gpu == ("a", "c")
    assert list(pod.residency.in_host()) == ["a", "b", "c"], "the registry moves on arrival"
    await pod.release("c", third)


async def test_a_release_from_before_a_restart_leaves_the_new_requests_entry_counted() -> None:
    """A restarted pod forgets its requests; a request from before it that ends later
    ends nothing of the new pod's. Its release must not end the running request the new
    pod admitted for the same name, or that request's entry stays counted as running
    once it ends too, and no load can ever take its slot."""
    config = PodConfig(engine=Engine.VLLM, latency=ZERO_LATENCY, max_loras=1, max_cpu_loras=2)
    pod = EmulatedPod(config)
    await pod.load("a", "s3://adapters/a")
    old = await pod.admit("a")
    pod.restart()
    await pod.load("a", "s3://adapters/a")
    new = await pod.admit("a")
    await pod.release("a", old)  # the old pod's request ends
    still = pod.running_entries.busy()
    await pod.release("a", new)
    await pod.load("b", "s3://adapters/b")  # a runs nothing now: b takes its slot
    assert (still, pod.running_entries.busy(), pod.gpu) == ({new}, set(), ("b",))


async def test_vllm_a_host_cache_eviction_takes_the_adapter_off_the_gpu_and_counts() -> None:
    """Past ``--max-cpu-loras`` the worker drops the oldest host-cache entry
    (vllm-project/vllm vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager.add_adapter``
    -> vllm/lora/model_manager.py ``LRUCacheLoRAModelManager.remove_oldest_adapter``), and
    the host cache deactivates what it drops (``_registered_adapters`` is an
    ``AdapterLRUCache`` built with ``deactivate_adapter``; its ``_on_remove`` calls it):
    the adapter leaves its GPU slot too, a GPU eviction as well as a host one."""
    config = PodConfig(engine=Engine.VLLM, latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=2)
    pod = EmulatedPod(config)
    for name in ("a", "b", "c"):  # c's load drops a from the host cache, so from the GPU
        await pod.load(name, f"s3://adapters/{name}")
    assert _held(pod) == (["b", "c"], ["b", "c"], 0, 1)
    assert pod.counters["host_evictions"] == 1 and len(pod.residencies_s) == 1


async def test_sglang_a_request_waits_while_the_batch_has_max_loras_per_batch_adapters() -> None:
    """The scheduler admits a waiting request only when its adapter and the running
    batch's fit the LoRA memory pool (sgl-project/sglang
    python/sglang/srt/managers/scheduler.py ``Scheduler.get_new_batch_prefill`` skips it
    otherwise; python/sglang/srt/lora/lora_manager.py ``LoRAManager.validate_lora_batch``:
    at most ``--max-loras-per-batch`` distinct adapters); the batch's weights are copied
    into the pool's slots before the step (``fetch_new_loras`` ->
    python/sglang/srt/lora/mem_pool.py ``LoRAMemoryPool.prepare_lora_batch``)."""
    config = PodConfig(engine=Engine.SGLANG, latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    pod = EmulatedPod(config)
    for name in ("a", "b", "c"):
        await pod.load(name, f"s3://adapters/{name}")
    assert not pod.gpu  # a load reads into host memory only
    await pod.admit("a")
    await pod.admit("b")
    third = asyncio.ensure_future(pod.admit("c"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not third.done()
    await pod.release("a")
    await third
    assert pod.gpu == ("b", "c")
    for name in ("b", "c"):
        await pod.release(name)


async def test_sglang_a_reload_on_a_request_holds_the_update_lock_through_its_unloads_wait() -> (
    None
):
    """A request for an adapter the soft cap unloaded loads it again through the load
    path (sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py
    ``TokenizerManager._resolve_lora_path`` -> ``load_lora_adapter``), which holds the
    one ``lora_update_lock`` (python/sglang/srt/managers/tokenizer_control_mixin.py
    ``load_lora_adapter``) while its soft cap unloads the least recently used unpinned
    adapter, running or not (``LoRARegistry.lru_lora_name(exclude_pinned=True)``), and
    waits for that adapter's requests in flight (``_unload_lora_adapter_locked`` ->
    ``LoRARegistry.wait_for_unload``): the request, and a load sent meanwhile, wait for
    those requests."""
    config = PodConfig(engine=Engine.SGLANG, latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=2)
    pod = EmulatedPod(config)
    for name in ("a", "b", "c"):  # c past --max-loaded-loras 2 unloads a
        await pod.load(name, f"s3://adapters/{name}")
    await pod.admit("b")  # b runs throughout ...
    await pod.admit("c")
    await pod.release("c")  # ... and is the least recently used
    request = asyncio.ensure_future(pod.admit("a"))  # reloads a: unloads b, waits for it
    for _ in range(20):
        await asyncio.sleep(0)
    loading = asyncio.ensure_future(pod.load("d", "s3://adapters/d"))
    for _ in range(20):
        await asyncio.sleep(0)
    done_early = (request.done(), loading.done())
    await pod.release("b")  # before any assert: a failure must not hang
    await asyncio.gather(request, loading)
    assert done_early == (False, False)
    assert "b" in pod.residency.parked and pod.counters["cold_reloads"] == 1
    await pod.release("a")
