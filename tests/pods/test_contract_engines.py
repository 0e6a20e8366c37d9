"""The contract at the wire, for every pod (``target``): lorafleet's engine client, then
each engine's routes, answers and residency, test by test (``contract_target``).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from placement.domain import AdapterId, Engine
from placement.errors import PermanentEngineError
from tests.pods.contract_target import (
    HARD,
    MAX_LOADED,
    SGLANG,
    Target,
    message,
    only,
)

pytestmark = pytest.mark.anyio


# -- through lorafleet's engine client -------------------------------------------------

A = AdapterId("contract-a")


async def test_load_lists_then_unload_forgets(target: Target) -> None:
    assert await target.client.load(A, lora_path=target.lora_path) is True
    assert (await target.client.registered()).adapters[A] == target.lora_path
    assert await target.client.unload(A) is True
    assert A not in (await target.client.registered()).names()


async def test_load_and_unload_are_idempotent(target: Target) -> None:
    await target.client.load(A, lora_path=target.lora_path)
    assert await target.client.load(A, lora_path=target.lora_path) is False
    await target.client.unload(A)
    assert await target.client.unload(A) is False


async def test_bad_path_is_permanent_and_names_the_path(target: Target) -> None:
    with pytest.raises(PermanentEngineError, match="/nonexistent/missing-adapter"):
        await target.client.load(A, lora_path="/nonexistent/missing-adapter")


async def test_warmup_needs_a_registered_adapter(target: Target) -> None:
    with pytest.raises(PermanentEngineError):
        await target.client.warmup(AdapterId("never-loaded"))
    await target.client.load(A, lora_path=target.lora_path)
    await target.client.warmup(A)


async def test_health_and_metrics_answer(target: Target) -> None:
    assert await target.client.health() is True
    metrics = await target.client.metrics()
    assert metrics.running >= 0
    assert 0.0 <= metrics.kv_usage <= 1.0


# -- at the wire: both engines -----------------------------------------------------------


async def test_a_streamed_completion_is_openai_sse(target: Target) -> None:
    """OpenAI SSE: ``data: {chunk}`` lines, then ``data: [DONE]``
    (vllm-project/vllm vllm/entrypoints/openai/chat_completion/serving.py
    ``chat_completion_stream_generator``; sgl-project/sglang
    python/sglang/srt/entrypoints/openai/serving_chat.py ``_generate_chat_stream``)."""
    await target.load("contract-a")
    model = "contract-a" if not target.is_sglang else f"{target.base}:contract-a"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3,
        "stream": True,
    }
    if target.is_sglang:
        body["lora_path"] = "contract-a"
    response = await target.http.post(f"{target.url}/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    assert chunks[0]["choices"][0]["delta"]["content"]


# -- vLLM --------------------------------------------------------------------------------


async def test_vllm_load_and_unload_answer_plain_success_texts(target: Target) -> None:
    """vllm-project/vllm vllm/entrypoints/openai/models/serving.py
    ``OpenAIServingModels.load_lora_adapter`` / ``unload_lora_adapter``."""
    only(target, Engine.VLLM)
    loaded, twice = await target.load("c-a"), await target.load("c-a")
    removed, absent = await target.unload("c-a"), await target.unload("c-a")
    assert (loaded.status_code, loaded.text) == (
        200,
        "Success: LoRA adapter 'c-a' added successfully.",
    )
    assert (twice.status_code, message(twice)) == (
        400,
        "The lora adapter 'c-a' has already been loaded. If you want to load the adapter "
        "in place, set 'load_inplace' to True.",
    )
    assert (removed.status_code, removed.text) == (
        200,
        "Success: LoRA adapter 'c-a' removed successfully.",
    )
    assert (absent.status_code, message(absent)) == (
        404,
        "The lora adapter 'c-a' cannot be found.",
    )


async def test_vllm_load_inplace_reloads_under_the_same_name(target: Target) -> None:
    """``_check_load_lora_adapter_request`` lets ``load_inplace`` through and the name keeps
    its id (vllm-project/vllm vllm/entrypoints/openai/models/serving.py
    ``OpenAIServingModels.load_lora_adapter``); the worker reads the weights again
    (vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager.add_adapter``)."""
    only(target, Engine.VLLM)
    await target.load("c-a")
    again = await target.load("c-a", load_inplace=True)
    assert again.status_code == 200
    assert await target.listed() == ["c-a"]


async def test_vllm_load_failures_are_404_for_a_missing_adapter_and_400_otherwise(
    target: Target, tmp_path: Path
) -> None:
    """An engine error saying "No adapter found" is 404, any other is 400
    (vllm-project/vllm vllm/entrypoints/openai/models/serving.py
    ``OpenAIServingModels.load_lora_adapter``); the rank check is the worker's
    (vllm/lora/worker_manager.py ``WorkerLoRAManager._load_adapter``)."""
    only(target, Engine.VLLM)
    missing = await target.load("c-missing", lora_path="/nonexistent/missing-adapter")
    assert missing.status_code == 404
    assert "Loading lora c-missing failed: No adapter found for /nonexistent/missing-adapter" in (
        message(missing)
    )
    if target.emulated is not None:
        (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 64}))
        high_rank = str(tmp_path)
    else:
        high_rank = os.environ.get("HIGH_RANK_LORA_PATH", "")
        if not high_rank:
            pytest.skip("HIGH_RANK_LORA_PATH is not set")
    too_big = await target.load("c-big", lora_path=high_rank)
    assert too_big.status_code == 400
    assert "is greater than max_lora_rank" in message(too_big)
    assert "c-missing" not in await target.listed()


async def test_vllm_every_load_takes_a_gpu_slot(target: Target) -> None:
    """A load ends in the worker's ``add_adapter``, which activates the adapter on a GPU
    slot, evicting the least recently used active one (vllm-project/vllm
    vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager.add_adapter``;
    vllm/lora/model_manager.py ``LRUCacheLoRAModelManager.activate_adapter``): after
    ``max_loras + 1`` loads the first loaded adapter is no longer active."""
    only(target, Engine.VLLM)
    names = [f"c-{i}" for i in range(target.max_loras + 1)]
    for name in names:
        assert (await target.load(name)).status_code == 200
    stats = await target.stats()
    assert stats["gpu"] == names[1:]
    assert names[0] in stats["host"] and await target.listed() == names


async def test_vllm_an_unload_frees_no_gpu_slot(target: Target) -> None:
    """An unload only forgets the name in the API server (``del self.lora_requests[name]``,
    vllm-project/vllm vllm/entrypoints/openai/models/serving.py
    ``OpenAIServingModels.unload_lora_adapter``; vllm-project/vllm#54839): its GPU slot
    stays taken until LRU eviction, and the next load evicts the oldest active adapter,
    not the unloaded one."""
    only(target, Engine.VLLM)
    for name in ("c-a", "c-b"):
        await target.load(name)
    assert (await target.unload("c-b")).status_code == 200
    assert (await target.stats())["ghosts"] == 1
    await target.load("c-c")
    stats = await target.stats()
    assert (stats["gpu"], stats["ghosts"]) == (["c-c"], 1)  # c-a went, c-b's slot stayed


# -- SGLang ------------------------------------------------------------------------------


async def test_sglang_lora_answers_are_200_or_400_with_the_engines_texts(target: Target) -> None:
    """Every LoRA failure is 400 ``{"success": false, "error_message": ...}``
    (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py
    ``load_lora_adapter``); texts from python/sglang/srt/lora/lora_manager.py
    ``LoRAManager.validate_new_adapter`` and python/sglang/srt/lora/lora_registry.py
    ``LoRARegistry.unregister``."""
    only(target, Engine.SGLANG)
    loaded, twice = await target.load("c-a"), await target.load("c-a")
    absent = await target.unload("c-zz")
    assert loaded.status_code == 200 and loaded.json()["success"] is True
    assert loaded.json()["loaded_adapters"]["c-a"] == target.lora_path
    assert (twice.status_code, twice.json()["error_message"]) == (
        400,
        "Failed to load LoRA adapter c-a because it is already loaded",
    )
    assert absent.status_code == 400
    # ``self._registry.keys()``: an OrderedDict's since the soft cap (lora_registry.py
    # ``LoRARegistry.__init__``), a dict's before; a real engine's version is not known.
    keys = {None: "", HARD: "dict_keys"}.get(target.model, "odict_keys")
    assert absent.json()["error_message"].startswith(
        "LoRA with name c-zz does not exist. Loaded LoRAs: "
    )
    assert absent.json()["error_message"].endswith(f"{keys}(['c-a'])")


async def test_sglang_pins_at_most_one_slot_less_than_the_batch(target: Target) -> None:
    """python/sglang/srt/lora/lora_manager.py ``LoRAManager.validate_new_adapter``:
    pinned adapters may not fill every ``--max-loras-per-batch`` slot."""
    only(target, Engine.SGLANG)
    for i in range(target.max_loras - 1):
        assert (await target.load(f"c-pin{i}", pinned=True)).status_code == 200
    refused = await target.load("c-pin-last", pinned=True)
    assert refused.status_code == 400
    assert "It is not allowed to pin all slots" in refused.json()["error_message"]


#: What each SGLang engine model says of a request for ``c-zz`` with ``c-a`` loaded.
NOT_LOADED = {
    # since PR #11526: python/sglang/srt/managers/tokenizer_manager.py
    # ``TokenizerManager._resolve_lora_path`` (``lora_ref_cache`` is a plain dict)
    SGLANG: "Got LoRA adapter that has never been loaded: c-zz\n"
    "All loaded adapters: dict_keys(['c-a']).",
    # before: python/sglang/srt/lora/lora_registry.py ``LoRARegistry.acquire``
    HARD: "The following requested LoRA adapters are not loaded: c-zz\n"
    "Loaded adapters: dict_keys(['c-a']).",
}


async def test_sglang_a_request_for_an_adapter_not_loaded_is_400(target: Target) -> None:
    """A ``ValueError`` in the tokenizer manager becomes 400 ``{"object": "error", ...}``
    (sgl-project/sglang python/sglang/srt/entrypoints/openai/serving_completions.py
    ``_handle_non_streaming_request`` -> ``create_error_response``), worded per
    ``NOT_LOADED``. Streamed, since PR #21900 the handler pulls the first chunk before it
    answers, so the refusal is the same 400 (``_handle_streaming_request``: "Kick-start
    the generator to trigger validation before HTTP 200 is sent"); before, 200, the error
    as the first event, then ``[DONE]`` (``_generate_completion_stream``). A real engine's
    version is not known here: its first line is one of the two, and its listing holds
    whatever it ever loaded."""
    only(target, Engine.SGLANG)
    await target.load("c-a")
    whole, streamed = await target.complete("c-zz"), await target.complete("c-zz", stream=True)
    if target.model is None:
        first_lines = {text.split("\n")[0] for text in NOT_LOADED.values()}
        assert whole.status_code == 400 and message(whole).split("\n")[0] in first_lines
        return
    error: dict[str, object] = {"object": "error", "message": NOT_LOADED[target.model]}
    error |= {"type": "BadRequestError", "param": None, "code": 400}
    assert (whole.status_code, whole.json()) == (400, error)
    if target.model is HARD:
        events = [line.removeprefix("data: ") for line in streamed.text.splitlines() if line]
        assert streamed.status_code == 200
        assert [json.loads(events[0]), events[-1], len(events)] == [error, "[DONE]", 2]
    else:
        assert (streamed.status_code, streamed.json()) == (400, error)


async def test_sglang_soft_cap_unloads_the_lru_unpinned_adapter_and_reloads_it_on_use(
    target: Target,
) -> None:
    """Past ``--max-loaded-loras`` a load succeeds and the least recently used unpinned
    adapter is unloaded (it leaves ``/v1/models``), then loaded again by its next request
    (sgl-project/sglang PR #11526: python/sglang/srt/managers/tokenizer_manager.py
    ``load_lora_adapter``, ``LoRARegistry.lru_lora_name(exclude_pinned=True)``, and
    ``TokenizerManager._resolve_lora_path``)."""
    only(target, Engine.SGLANG)
    if target.model is HARD:
        pytest.skip("SGLang before the soft cap refuses instead")
    if target.max_loaded is None or target.max_loras < 2:
        pytest.skip("MAX_LOADED_LORAS is not set, or MAX_LORAS is below 2")
    names = [f"c-{i}" for i in range(target.max_loaded - 1)]
    await target.load("c-pin", pinned=True)
    for name in names:
        await target.load(name)
    assert (await target.complete(names[0])).status_code == 200  # the oldest is used last
    past = await target.load("c-new")
    lru = names[1] if len(names) > 1 else names[0]
    assert past.status_code == 200
    assert lru not in past.json()["loaded_adapters"] and lru not in await target.listed()
    assert "c-pin" in await target.listed()
    assert (await target.complete(lru)).status_code == 200  # loaded again by itself
    assert lru in await target.listed()
    assert len(await target.listed()) == target.max_loaded


async def test_sglang_an_unloaded_adapter_is_loaded_again_by_its_next_request(
    target: Target,
) -> None:
    """An unload only unregisters the name (sgl-project/sglang 00a2ca2e
    python/sglang/srt/managers/tokenizer_control_mixin.py ``unload_lora_adapter`` ->
    ``_unload_lora_adapter_locked``): the tokenizer manager's ``lora_ref_cache`` keeps it,
    so the next request naming it loads it again and runs (001067ff
    python/sglang/srt/managers/tokenizer_manager.py ``_resolve_lora_path``: "Reloading
    evicted adapter"), and it is listed again. Before PR #11526 there is no such cache:
    the registry refuses the name (``LoRARegistry.acquire``)."""
    only(target, Engine.SGLANG)
    await target.load("c-a")
    await target.load("c-b")
    assert (await target.unload("c-a")).status_code == 200
    assert await target.listed() == ["c-b"]
    again = await target.complete("c-a")
    if target.model is HARD:
        assert again.status_code == 400
        assert message(again) == (
            "The following requested LoRA adapters are not loaded: c-a\n"
            "Loaded adapters: dict_keys(['c-b'])."
        )
        return
    assert again.status_code == 200
    assert sorted(await target.listed()) == ["c-a", "c-b"]
    assert (await target.unload("c-a")).status_code == 200  # registered again: unloadable


async def test_sglang_an_unloaded_pinned_adapter_comes_back_pinned(target: Target) -> None:
    """The reload reads ``pinned`` from the ``lora_ref_cache`` entry of the adapter's load
    (sgl-project/sglang 001067ff python/sglang/srt/managers/tokenizer_manager.py
    ``_resolve_lora_path``: ``LoadLoRAAdapterReqInput(..., pinned=new_lora_ref.pinned)``):
    an unloaded pinned adapter comes back pinned, and with the pins taken meanwhile
    (at most ``--max-loras-per-batch`` - 1) its request is refused with the load's words
    ("Failed to implicitly load LoRA adapter ...")."""
    only(target, Engine.SGLANG)
    if target.model is HARD:
        pytest.skip("SGLang before the soft cap does not load an unloaded adapter again")
    await target.load("c-pin", pinned=True)
    assert (await target.unload("c-pin")).status_code == 200
    assert (await target.complete("c-pin")).status_code == 200
    assert "c-pin" in await target.listed()
    if target.emulated is not None:
        assert (await target.stats())["pinned"] == ["c-pin"]
    assert (await target.unload("c-pin")).status_code == 200
    for i in range(target.max_loras - 1):  # every pin the pool allows
        assert (await target.load(f"c-pin-{i}", pinned=True)).status_code == 200
    refused = await target.complete("c-pin")
    assert refused.status_code == 400
    assert message(refused) == (
        "Failed to implicitly load LoRA adapter c-pin: Failed to load LoRA adapter c-pin as "
        "a pinned adapter. It is not allowed to pin all slots in the LoRA memory pool to "
        "avoid starvation for unpinned adapters and base models. Please increase your "
        "`--max-loras-per-batch` or load it as unpinned LoRA adapters."
    )
    assert "c-pin" not in await target.listed()


async def test_sglang_before_the_soft_cap_refuses_a_load_past_it(target: Target) -> None:
    """sgl-project/sglang before PR #11526: python/sglang/srt/managers/tokenizer_manager.py
    ``load_lora_adapter`` refuses past ``--max-loaded-loras``."""
    if target.model is not HARD:
        pytest.skip("only SGLang before the soft cap refuses")
    for i in range(MAX_LOADED):
        await target.load(f"c-{i}")
    refused = await target.load("c-over")
    assert refused.status_code == 400
    assert refused.json()["error_message"] == (
        f"Cannot load LoRA adapter c-over at path {target.lora_path}. Maximum number of "
        f"loaded LoRA adapters is {MAX_LOADED}. Please unload some LoRA adapters before "
        "loading new ones."
    )


async def test_sglang_unload_waits_for_requests_in_flight(target: Target) -> None:
    """The registry forgets the name at once, then the unload waits until no request uses
    the adapter (sgl-project/sglang python/sglang/srt/lora/lora_registry.py
    ``LoRARegistry.wait_for_unload``)."""
    only(target, Engine.SGLANG)
    if target.emulated is None:
        pytest.skip("holding a request open on a real engine is not deterministic")
    await target.load("c-a")
    await target.emulated.admit("c-a")
    unloading = asyncio.create_task(target.unload("c-a"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not unloading.done()
    await target.emulated.release("c-a")
    assert (await unloading).status_code == 200


async def test_sglang_a_load_waits_behind_an_unload_waiting_for_requests(target: Target) -> None:
    """Every load and unload runs under the tokenizer manager's one ``lora_update_lock``,
    and an unload holds it while it waits for the adapter's requests in flight
    (sgl-project/sglang python/sglang/srt/managers/tokenizer_control_mixin.py
    ``load_lora_adapter``, ``unload_lora_adapter`` and ``_unload_lora_adapter_locked``,
    which awaits ``LoRARegistry.wait_for_unload`` under the lock): a load of another
    adapter waits for those requests too."""
    only(target, Engine.SGLANG)
    if target.emulated is None:
        pytest.skip("holding a request open on a real engine is not deterministic")
    await target.load("c-a")
    await target.emulated.admit("c-a")
    unloading = asyncio.create_task(target.unload("c-a"))
    for _ in range(20):
        await asyncio.sleep(0)
    loading = asyncio.create_task(target.load("c-b"))
    for _ in range(20):
        await asyncio.sleep(0)
    done_early = (unloading.done(), loading.done())
    await target.emulated.release("c-a")  # before any assert: a failure must not hang
    answers = await asyncio.gather(unloading, loading)
    assert done_early == (False, False)
    assert [answer.status_code for answer in answers] == [200, 200]
    assert await target.listed() == ["c-b"]
