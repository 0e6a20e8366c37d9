"""The engine model: what a load, an unload and a request do on each engine.

Each table row names the engine behaviour it encodes; ``placement/residency``'s
docstring names the engine source (repository, file, function) of each.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.residency import (
    AlreadyLoadedError,
    CapReachedError,
    EngineModel,
    NotLoadedError,
    PinLimitError,
    PodResidency,
)

VLLM, SGLANG, HARD = EngineModel.VLLM, EngineModel.SGLANG, EngineModel.SGLANG_HARD_CAP


def _pod(engine: EngineModel, max_loras: int = 2, max_cpu_loras: int | None = 4) -> PodResidency:
    return PodResidency(engine, max_loras=max_loras, max_cpu_loras=max_cpu_loras)


def test_vllm_every_load_takes_a_gpu_slot_evicting_the_lru_active() -> None:
    pod = _pod(VLLM)
    pod.load("a", "/a")
    pod.load("b", "/b")
    effects = pod.load("c", "/c")
    assert effects.cold and effects.activated and effects.gpu_evicted == ("a",)
    assert pod.on_gpu() == ("b", "c")
    assert pod.in_host() == ("a", "b", "c")


def test_vllm_warm_first_then_hot_ends_with_the_hot_set_on_the_gpu() -> None:
    pod = _pod(VLLM)
    for name in ("w1", "w2", "h1", "h2"):
        pod.load(name, f"/{name}")
    assert pod.on_gpu() == ("h1", "h2")
    pod.request("w1")  # a request for a warm one pushes the least recently used hot one
    assert pod.on_gpu() == ("h2", "w1")


def test_vllm_unload_frees_nothing_and_a_reload_takes_a_second_entry() -> None:
    pod = _pod(VLLM)
    pod.load("a", "/a")
    pod.load("b", "/b")
    assert pod.unload("a").gpu_evicted == ()
    assert pod.ghosts_on_gpu() == 1 and "a" not in pod.listed
    effects = pod.load("a", "/a")  # a new id: the ghost still holds its slot
    assert effects.gpu_evicted == ("a",)  # the LRU active was a's own ghost
    assert pod.on_gpu() == ("b", "a") and pod.ghosts_on_gpu() == 0


def test_vllm_an_unload_of_a_hot_adapter_leaves_its_slot_taken() -> None:
    pod = _pod(VLLM)
    pod.load("a", "/a")
    pod.load("b", "/b")
    pod.unload("b")
    effects = pod.load("c", "/c")
    assert effects.gpu_evicted == ("a",)  # not b's ghost: a is older
    assert pod.on_gpu() == ("c",) and pod.ghosts_on_gpu() == 1


def test_vllm_host_eviction_keeps_the_name_listed_and_reloads_cold() -> None:
    pod = _pod(VLLM, max_loras=1, max_cpu_loras=2)
    for name in ("a", "b", "c"):
        pod.load(name, f"/{name}")
    assert set(pod.listed) == {"a", "b", "c"} and pod.in_host() == ("b", "c")
    effects = pod.request("a")
    assert effects.cold and effects.activated and effects.host_evicted == ("b",)


def test_deactivate_frees_the_slot_and_keeps_the_weights() -> None:
    pod = _pod(VLLM)
    pod.load("a", "/a")
    pod.load("b", "/b")
    assert pod.deactivate("a")
    assert pod.on_gpu() == ("b",)
    assert pod.in_host() == ("a", "b")
    assert not pod.deactivate("a")  # off the GPU already
    assert not pod.deactivate("c")  # not loaded
    effects = pod.load("c", "/c")  # the slot is free: nothing pushed off
    assert effects.gpu_evicted == ()
    assert pod.on_gpu() == ("b", "c")


def test_vllm_refusals() -> None:
    pod = _pod(VLLM)
    pod.load("a", "/a")
    with pytest.raises(AlreadyLoadedError):
        pod.load("a", "/a")
    assert pod.load("a", "/a2", inplace=True).cold  # load_inplace: new weights, same name
    with pytest.raises(NotLoadedError):
        pod.unload("zz")
    with pytest.raises(NotLoadedError):
        pod.request("zz")


def test_vllm_load_inplace_keeps_the_id_and_copies_the_weights_to_the_gpu_again() -> None:
    pod = _pod(VLLM)
    pod.load("a", "/a")
    pod.load("b", "/b")
    effects = pod.load("a", "/a2", inplace=True)
    assert effects.cold and effects.activated and effects.gpu_evicted == ()
    assert pod.listed["a"] == "/a2" and pod.on_gpu() == ("b", "a")
    assert pod.ghosts_on_gpu() == 0  # the same id: no second entry


@pytest.mark.parametrize(
    ("busy", "pinned", "expected"),
    [
        pytest.param(set(), False, True, id="an-idle-adapter-can-go"),
        pytest.param({"a", "b"}, False, False, id="every-slot-running"),
        pytest.param({"b"}, True, False, id="the-idle-one-is-pinned"),
    ],
)
def test_a_request_waits_only_while_every_slot_is_busy_or_pinned(
    busy: set[str], pinned: bool, expected: bool
) -> None:
    pod = _pod(SGLANG, max_loras=2, max_cpu_loras=None)
    pod.load("a", "/a", pinned=pinned)
    pod.load("b", "/b")
    pod.load("c", "/c")
    pod.request("a")
    pod.request("b")
    assert pod.can_activate_now("a", busy=busy)  # on the GPU already
    assert pod.can_activate_now("c", busy=busy) is expected


def test_a_vllm_ghost_holds_a_request_back_only_while_a_request_runs_on_it() -> None:
    """vLLM's scheduler counts the batch's LoRAs by id (vllm/v1/core/sched/scheduler.py
    ``Scheduler.schedule``, ``scheduled_loras``), an unloaded name's id too: a ghost
    with a request on it holds its slot, an idle one does not."""
    pod = _pod(VLLM)
    pod.load("a", "/a")
    pod.load("b", "/b")
    pod.unload("a")
    pod.load("c", "/c")  # evicts a's ghost
    ghost = pod.entry("b")
    pod.unload("b")
    running_c = pod.entry("c")
    assert ghost is not None and running_c is not None
    assert pod.can_activate_now("zz", busy={running_c})
    assert not pod.can_activate_now("zz", busy={ghost, running_c})
    assert not pod.can_activate_now("zz", busy={"b", "c"})  # a name covers its ghost


def test_vllm_a_ghost_a_request_runs_on_keeps_its_slot_and_its_idle_twin_goes() -> None:
    """Busy is per entry, as the engine's is: each step the worker activates every id
    in the batch (vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager._apply_adapters``
    -> ``add_adapter`` -> vllm/lora/model_manager.py ``activate_adapter``), so the slot
    that goes is the least recently used entry outside the batch. After an unload and a
    load of the same name, the old id a request runs on stays; the new, idle one goes."""
    pod = _pod(VLLM, max_loras=2, max_cpu_loras=4)
    pod.load("a", "/a")
    pod.load("c", "/c")
    running = pod.entry("c")  # a request runs on c's first id
    assert running is not None
    pod.unload("c")
    pod.load("c", "/c", busy={running})  # a new id; a, idle, goes
    assert pod.gpu_entries() == (("c", False), ("c", True))
    assert pod.can_activate_now("a", busy={running})
    effects = pod.request("a", busy={running})
    assert effects.gpu_evicted == ("c",)
    assert pod.gpu_entries() == (("c", False), ("a", True))


def test_vllm_next_step_takes_back_the_slots_of_running_entries_a_load_pushed_off() -> None:
    """A load activates by plain LRU (vllm/lora/model_manager.py
    ``LRUCacheLoRAModelManager.activate_adapter``); the next step activates every id the
    batch runs on (vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager._apply_adapters``)."""
    pod = _pod(VLLM, max_loras=2, max_cpu_loras=4)
    pod.load("a", "/a")
    pod.load("b", "/b")
    a, b = pod.entry("a"), pod.entry("b")
    assert a is not None and b is not None
    assert pod.load("c", "/c", busy={a, b}).gpu_evicted == ("a",)  # every slot runs
    ((entry, back),) = pod.next_step({a, b})
    assert entry is a and back.activated and back.gpu_evicted == ("c",)
    assert pod.on_gpu() == ("b", "a") and pod.next_step({a, b}) == ()
    assert _pod(SGLANG).next_step({a}) == ()  # SGLang's loads take no GPU slot


def test_vllm_a_host_eviction_reports_the_gpu_slot_it_frees() -> None:
    """vLLM's host cache deactivates what it drops (vllm/lora/model_manager.py
    ``LRUCacheLoRAModelManager``: ``_registered_adapters`` is an ``AdapterLRUCache`` whose
    ``_on_remove`` calls ``deactivate_adapter``; vllm/lora/worker_manager.py
    ``LRUCacheWorkerLoRAManager.add_adapter`` -> ``remove_oldest_adapter``): the adapter
    leaves its GPU slot too, and the call says so."""
    pod = _pod(VLLM, max_loras=2, max_cpu_loras=2)
    pod.load("a", "/a")
    pod.load("b", "/b")
    loaded = pod.load("c", "/c")  # the host cache [a, b] is full: a leaves it and the GPU
    assert (loaded.host_evicted, loaded.gpu_evicted) == (("a",), ("a",))
    asked = pod.request("a")  # read again: b leaves the host cache and the GPU
    assert (asked.host_evicted, asked.gpu_evicted) == (("b",), ("b",))
    assert pod.on_gpu() == ("c", "a")


def test_vllm_a_request_runs_on_the_entry_it_arrived_with_after_an_unload() -> None:
    """vLLM's worker caches key by id (vllm/lora/worker_manager.py
    ``LRUCacheWorkerLoRAManager._apply_adapters`` -> ``add_adapter``): the unloaded name's
    entry takes a GPU slot again, evicting the LRU, and is read again once it left the host."""
    pod = _pod(VLLM, max_loras=2, max_cpu_loras=2)
    pod.load("a", "/a")
    pod.load("b", "/b")
    arrived = pod.entry("a")
    assert arrived is not None
    pod.unload("a")
    pod.load("c", "/c")  # host [b, c]: a's entry leaves the host and the GPU
    assert pod.host_entries() == (("b", True), ("c", True))
    assert pod.can_activate_entry(arrived, busy={"c"})  # b can go
    effects = pod.request_entry(arrived, busy={"c"})
    assert effects.cold and effects.activated
    # b leaves the host cache, and so the GPU (``AdapterLRUCache._on_remove`` deactivates)
    assert effects.host_evicted == ("b",) and effects.gpu_evicted == ("b",)
    assert pod.gpu_entries() == (("c", True), ("a", False)) and pod.ghosts_on_gpu() == 1
    assert pod.host_entries() == (("c", True), ("a", False))
    again = pod.request_entry(arrived)  # on the GPU now: no read, no swap, most recent
    assert not again.cold and not again.activated
    assert pod.entry("a") is None


def test_vllm_a_request_keeps_the_old_id_when_its_name_is_loaded_again() -> None:
    pod = _pod(VLLM, max_loras=2, max_cpu_loras=4)
    pod.load("a", "/a")
    pod.load("b", "/b")
    pod.load("c", "/c")  # gpu [b, c]; a's entry stays in the host cache
    arrived = pod.entry("a")
    assert arrived is not None
    pod.unload("a")
    pod.load("a", "/a2")  # a new id; evicts b
    assert pod.entry("a") is not arrived
    effects = pod.request_entry(arrived)
    assert not effects.cold and effects.activated and effects.gpu_evicted == ("c",)
    assert pod.gpu_entries() == (("a", True), ("a", False))
    assert pod.ghosts_on_gpu() == 1


def test_request_entry_on_the_current_entry_is_a_request() -> None:
    for engine in (VLLM, SGLANG):
        pod, twin = _pod(engine), _pod(engine)
        for model in (pod, twin):
            model.load("a", "/a")
            model.load("b", "/b")
        arrived = pod.entry("a")
        assert arrived is not None
        assert pod.request_entry(arrived) == twin.request("a")
        assert pod.gpu_entries() == twin.gpu_entries()
        assert pod.host_entries() == twin.host_entries()


def test_sglang_refuses_a_request_on_an_unloaded_entry() -> None:
    pod = _pod(SGLANG)
    pod.load("a", "/a")
    arrived = pod.entry("a")
    assert arrived is not None
    pod.unload("a")
    with pytest.raises(NotLoadedError):
        pod.request_entry(arrived)


def test_sglang_a_load_stays_in_host_until_a_request() -> None:
    pod = _pod(SGLANG)
    effects = pod.load("a", "/a")
    assert effects.cold and not effects.activated and pod.on_gpu() == ()
    assert pod.request("a").activated and pod.on_gpu() == ("a",)
    assert not pod.request("a").activated


def test_sglang_soft_cap_unloads_the_lru_unpinned_and_reloads_it_on_use() -> None:
    pod = _pod(SGLANG, max_loras=2, max_cpu_loras=2)
    pod.load("a", "/a", pinned=True)
    pod.load("b", "/b")
    effects = pod.load("c", "/c")
    assert effects.unlisted == ("b",) and set(pod.listed) == {"a", "c"}
    assert pod.serves("b")
    again = pod.request("b")
    assert again.cold and again.unlisted == ("c",) and set(pod.listed) == {"a", "b"}


def test_sglang_soft_cap_reports_an_unloaded_adapter_that_held_a_gpu_slot() -> None:
    pod = _pod(SGLANG, max_loras=2, max_cpu_loras=2)
    pod.load("a", "/a")
    pod.load("b", "/b")
    pod.request("a")
    effects = pod.load("c", "/c")
    assert (effects.unlisted, effects.gpu_evicted) == (("b",), ())  # b never ran
    effects = pod.load("d", "/d")
    assert (effects.unlisted, effects.gpu_evicted) == (("a",), ("a",))
    assert pod.on_gpu() == ()


def test_sglang_soft_cap_unloads_the_lru_though_a_request_runs_on_it() -> None:
    """The load path takes the registry's least recently used unpinned name, blind to
    its requests in flight, and the unload then waits for them (sgl-project/sglang
    python/sglang/srt/managers/tokenizer_manager.py ``load_lora_adapter``:
    ``LoRARegistry.lru_lora_name(exclude_pinned=True)``; ``wait_for_unload``)."""
    pod = _pod(SGLANG, max_loras=2, max_cpu_loras=2)
    pod.load("a", "/a")
    running = pod.entry("a")
    assert running is not None
    pod.request("a")  # a runs from here on
    pod.load("b", "/b")
    pod.request("b")  # b is the more recent in the registry
    assert pod.load("c", "/c", busy={running, "a"}).unlisted == ("a",)
    assert pod.request("a", busy={"b"}).unlisted == ("b",)


def test_sglang_an_adapter_the_soft_cap_unloaded_cannot_be_unloaded_and_comes_back() -> None:
    pod = _pod(SGLANG, max_loras=2, max_cpu_loras=1)
    pod.load("a", "/a")
    pod.load("b", "/b")
    with pytest.raises(NotLoadedError):
        pod.unload("a")
    assert pod.serves("a") and pod.request("a").unlisted == ("b",)


def test_sglang_before_the_soft_cap_refuses_a_load_past_it() -> None:
    pod = _pod(HARD, max_loras=2, max_cpu_loras=1)
    pod.load("a", "/a")
    with pytest.raises(CapReachedError):
        pod.load("b", "/b")


def test_sglang_pins_stay_on_the_gpu_once_used_and_are_bounded() -> None:
    """LoRAManager.load_lora_adapter reads a pinned adapter into host memory only;
    LoRAMemoryPool.prepare_lora_batch brings it in at its first batch and never out."""
    pod = _pod(SGLANG, max_loras=2, max_cpu_loras=None)
    assert not pod.load("p", "/p", pinned=True).activated
    assert pod.on_gpu() == ()
    with pytest.raises(PinLimitError):
        pod.load("q", "/q", pinned=True)
    pod.request("p")
    for name in ("a", "b", "c"):
        pod.load(name, f"/{name}")
        pod.request(name)
    assert pod.on_gpu() == ("p", "c")


def test_sglang_unload_removes_everywhere_and_requests_are_then_refused() -> None:
    pod = _pod(SGLANG)
    pod.load("a", "/a")
    pod.request("a")
    assert pod.unload("a").gpu_evicted == ("a",)
    with pytest.raises(NotLoadedError):
        pod.request("a")
    pod.load("b", "/b")
    with pytest.raises(AlreadyLoadedError):
        pod.load("b", "/b")


def test_busy_adapters_are_not_evicted_while_another_can_go() -> None:
    pod = _pod(VLLM)
    pod.load("a", "/a")
    pod.load("b", "/b")
    assert pod.load("c", "/c", busy={"a"}).gpu_evicted == ("b",)


def test_restart_comes_back_empty() -> None:
    pod = _pod(SGLANG)
    pod.load("a", "/a", pinned=True)
    pod.restart()
    assert (pod.listed, pod.on_gpu(), pod.pinned) == ({}, (), set())


NAMES = st.sampled_from(["a", "b", "c", "d", "e", "f"])
CALLS = st.lists(
    st.tuples(st.sampled_from(["load", "pin", "unload", "request"]), NAMES), max_size=40
)


@given(
    engine=st.sampled_from(list(EngineModel)),
    max_loras=st.integers(1, 4),
    extra=st.integers(0, 3),
    calls=CALLS,
)
def test_limits_hold_after_any_sequence(
    engine: EngineModel, max_loras: int, extra: int, calls: list[tuple[str, str]]
) -> None:
    cap = max_loras + extra
    pod = PodResidency(engine, max_loras=max_loras, max_cpu_loras=cap)
    pinned_used: set[str] = set()
    for call, name in calls:
        try:
            if call in ("load", "pin"):
                pod.load(name, f"/{name}", pinned=call == "pin")
                if engine is VLLM:
                    assert pod.on_gpu()[-1] == name  # a vLLM load always activates
            elif call == "unload":
                pod.unload(name)
                pinned_used.discard(name)
            else:
                pod.request(name)
                assert pod.on_gpu()[-1] == name  # a request always ends on the GPU
                if name in pod.pinned:
                    pinned_used.add(name)
        except (AlreadyLoadedError, NotLoadedError, CapReachedError, PinLimitError):
            continue
        assert len(pod.on_gpu()) + pod.ghosts_on_gpu() <= max_loras
        assert set(pod.on_gpu()) <= set(pod.listed)
        assert set(pod.in_host()) <= set(pod.listed)
        if engine is VLLM:
            assert len(pod.in_host()) <= cap
        else:
            assert len(pod.listed) <= cap
            assert pinned_used <= set(pod.on_gpu())  # a pin, once on the GPU, stays
