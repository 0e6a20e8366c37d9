"""One contract for every pod: the emulated ones (each engine model), and real engines.

Real engines run when ``VLLM_URL`` / ``SGLANG_URL`` are set, with ``LORA_PATH`` an
adapter directory the engine can load, ``SERVED_MODEL_NAME`` for SGLang and
``MAX_LORAS`` (``--max-loras`` / ``--max-loras-per-batch``, default 2). Optional:
``MAX_LOADED_LORAS`` (SGLang's ``--max-loaded-loras``; the soft-cap test needs it) and
``HIGH_RANK_LORA_PATH`` (an adapter above ``--max-lora-rank``).

Neither engine reports which adapters sit on its GPU (POD-API.md), so the residency
tests read it from the emulator's ``/admin/stats`` and skip on a real engine; SGLang's
soft cap shows in ``/v1/models`` and is checked everywhere. Each test's docstring names
the engine source it encodes.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from placement.adapters.engines import engine_client
from placement.domain import AdapterId, Engine, Pod
from placement.emulator import ZERO_LATENCY, EmulatedFleet, EmulatedPod, PodConfig
from placement.emulator.config import BatchTiming
from placement.emulator.refusals import NotLoadedError
from placement.emulator.wire import pod_stats
from placement.errors import PermanentEngineError
from placement.ports import EngineClient
from placement.residency import EngineModel
from tests.emulator.virtual_time import VirtualTime
from tests.factories import pod

pytestmark = pytest.mark.anyio

VLLM, SGLANG, HARD = EngineModel.VLLM, EngineModel.SGLANG, EngineModel.SGLANG_HARD_CAP
#: The emulated pods: two GPU slots, three host (SGLang: loaded) adapters at most.
MAX_LORAS, MAX_LOADED = 2, 3


@dataclass
class Target:
    """A pod under contract, reached at the wire."""

    http: httpx.AsyncClient
    url: str
    engine: Engine
    #: The engine model; None for a real engine (its version is not known here).
    model: EngineModel | None
    lora_path: str
    base: str
    max_loras: int
    max_loaded: int | None
    client: EngineClient
    #: The emulated pod, whose /admin/stats shows residency; None for a real engine.
    emulated: EmulatedPod | None
    loaded: list[str] = field(default_factory=list)

    @property
    def is_sglang(self) -> bool:
        return self.engine is Engine.SGLANG

    async def load(self, name: str, **extra: Any) -> httpx.Response:
        path = extra.pop("lora_path", self.lora_path)
        route = "/load_lora_adapter" if self.is_sglang else "/v1/load_lora_adapter"
        self.loaded.append(name)
        return await self.http.post(
            self.url + route, json={"lora_name": name, "lora_path": path, **extra}
        )

    async def unload(self, name: str) -> httpx.Response:
        route = "/unload_lora_adapter" if self.is_sglang else "/v1/unload_lora_adapter"
        return await self.http.post(self.url + route, json={"lora_name": name})

    async def complete(self, name: str, *, stream: bool = False) -> httpx.Response:
        body: dict[str, Any] = {"prompt": "hello", "max_tokens": 2, "stream": stream}
        if self.is_sglang:  # both namings, as lorafleet sends them
            body |= {"model": f"{self.base}:{name}", "lora_path": name}
        else:
            body["model"] = name
        return await self.http.post(self.url + "/v1/completions", json=body)

    async def listed(self) -> list[str]:
        cards = (await self.http.get(self.url + "/v1/models")).json()["data"]
        return [card["id"] for card in cards if card.get("parent")]

    async def stats(self) -> dict[str, Any]:
        if self.emulated is None:
            pytest.skip("a real engine does not report GPU residency (POD-API.md)")
        stats: dict[str, Any] = (await self.http.get(self.url + "/admin/stats")).json()
        return stats


def message(response: httpx.Response) -> str:
    """The error text of any engine's error body (vLLM nested or flat, SGLang's shapes)."""
    body = response.json()
    inner = body.get("error") if isinstance(body.get("error"), dict) else body
    return str(inner.get("message") or inner.get("error_message") or "")


def _pod(url: str, engine: Engine) -> Pod:
    return pod("pod-0", url=url, engine=engine, max_loras=2, max_cpu_loras=4, max_lora_rank=16)


TARGETS = [
    pytest.param(("emulated", VLLM), id="emulated-vllm"),
    pytest.param(("emulated", SGLANG), id="emulated-sglang"),
    pytest.param(("emulated", HARD), id="emulated-sglang-hard-cap"),
    pytest.param(("VLLM_URL", Engine.VLLM), id="real-vllm", marks=pytest.mark.external),
    pytest.param(("SGLANG_URL", Engine.SGLANG), id="real-sglang", marks=pytest.mark.external),
]


def _emulated(model: EngineModel) -> tuple[EmulatedFleet, Engine]:
    engine = Engine.VLLM if model is VLLM else Engine.SGLANG
    config = PodConfig(
        latency=ZERO_LATENCY,
        engine_model=model,
        max_loras=MAX_LORAS,
        max_cpu_loras=MAX_LOADED,
        max_lora_rank=16,
    )
    return EmulatedFleet.start(1, engine=engine, config=config), engine


@pytest.fixture(params=TARGETS)
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    source, kind = request.param
    if source == "emulated":
        fleet, engine = _emulated(kind)
        http, url = fleet.http(), fleet.handles[0].url
        emulated: EmulatedPod | None = fleet.handles[0].pod
        model, lora_path, base = kind, "s3://adapters/contract", "base-model"
        max_loras, max_loaded = MAX_LORAS, MAX_LOADED if kind is not VLLM else None
    else:
        url, lora_path = os.environ.get(source, ""), os.environ.get("LORA_PATH", "")
        if not url or not lora_path:
            pytest.skip(f"{source} and LORA_PATH are not set")
        http, engine, emulated, model = httpx.AsyncClient(timeout=60.0), kind, None, None
        base = os.environ.get("SERVED_MODEL_NAME", "")
        max_loras = int(os.environ.get("MAX_LORAS", "2"))
        raw_loaded = os.environ.get("MAX_LOADED_LORAS")
        max_loaded = int(raw_loaded) if raw_loaded else None
    client = engine_client(_pod(url, engine), http=http, served_model_name=base or None)
    found = Target(
        http, url, engine, model, lora_path, base, max_loras, max_loaded, client, emulated
    )
    yield found
    for name in dict.fromkeys([*found.loaded, "contract-a"]):
        await found.unload(name)
    await http.aclose()


def _only(target: Target, *engines: Engine) -> None:
    if target.engine not in engines:
        pytest.skip(f"{target.engine.value} does not do this")


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
    _only(target, Engine.VLLM)
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
    _only(target, Engine.VLLM)
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
    _only(target, Engine.VLLM)
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
    _only(target, Engine.VLLM)
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
    _only(target, Engine.VLLM)
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
    _only(target, Engine.SGLANG)
    loaded, twice = await target.load("c-a"), await target.load("c-a")
    absent = await target.unload("c-zz")
    assert loaded.status_code == 200 and loaded.json()["success"] is True
    assert loaded.json()["loaded_adapters"]["c-a"] == target.lora_path
    assert (twice.status_code, twice.json()["error_message"]) == (
        400,
        "Failed to load LoRA adapter c-a because it is already loaded",
    )
    assert absent.status_code == 400
    assert absent.json()["error_message"].startswith(
        "LoRA with name c-zz does not exist. Loaded LoRAs: dict_keys(["
    )


async def test_sglang_pins_at_most_one_slot_less_than_the_batch(target: Target) -> None:
    """python/sglang/srt/lora/lora_manager.py ``LoRAManager.validate_new_adapter``:
    pinned adapters may not fill every ``--max-loras-per-batch`` slot."""
    _only(target, Engine.SGLANG)
    for i in range(target.max_loras - 1):
        assert (await target.load(f"c-pin{i}", pinned=True)).status_code == 200
    refused = await target.load("c-pin-last", pinned=True)
    assert refused.status_code == 400
    assert "It is not allowed to pin all slots" in refused.json()["error_message"]


async def test_sglang_a_request_for_an_adapter_not_loaded_is_400(target: Target) -> None:
    """A ``ValueError`` in the tokenizer manager becomes 400 (sgl-project/sglang
    python/sglang/srt/managers/tokenizer_manager.py ``TokenizerManager._resolve_lora_path``:
    "Got LoRA adapter that has never been loaded"; before PR #11526
    python/sglang/srt/lora/lora_registry.py ``LoRARegistry.acquire``: "The following
    requested LoRA adapters are not loaded"); streamed, it is raised inside the stream:
    200, then an error event (python/sglang/srt/entrypoints/openai/serving_completions.py
    ``_generate_completion_stream``)."""
    _only(target, Engine.SGLANG)
    whole, streamed = await target.complete("c-zz"), await target.complete("c-zz", stream=True)
    texts = ("Got LoRA adapter that has never been loaded: c-zz", "are not loaded: c-zz")
    assert whole.status_code == 400 and any(text in message(whole) for text in texts)
    if target.model is not None:
        assert (target.model is HARD) == (texts[1] in message(whole))
    assert streamed.status_code == 200
    events = [line.removeprefix("data: ") for line in streamed.text.splitlines() if line]
    assert any(text in events[0] for text in texts) and events[-1] == "[DONE]"


async def test_sglang_soft_cap_unloads_the_lru_unpinned_adapter_and_reloads_it_on_use(
    target: Target,
) -> None:
    """Past ``--max-loaded-loras`` a load succeeds and the least recently used unpinned
    adapter is unloaded (it leaves ``/v1/models``), then loaded again by its next request
    (sgl-project/sglang PR #11526: python/sglang/srt/managers/tokenizer_manager.py
    ``load_lora_adapter``, ``LoRARegistry.lru_lora_name(exclude_pinned=True)``, and
    ``TokenizerManager._resolve_lora_path``)."""
    _only(target, Engine.SGLANG)
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
    _only(target, Engine.SGLANG)
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
    _only(target, Engine.SGLANG)
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
    the waiting request's ``LoRARequest`` keeps the old one, so the worker activates the
    old entry (``LRUCacheWorkerLoRAManager.add_adapter`` looks it up by id), not the new
    one the name now lists: the old entry pushes the new one, the idle LRU, off its slot."""
    pod = await _two_slots_busy(Engine.VLLM)
    waiting = asyncio.ensure_future(pod.admit("c"))
    await _spin()
    await pod.unload("c")
    await pod.load("c", "s3://adapters/c")  # a new id on a slot (a's: both run, a is LRU)
    await waiting  # the new id's slot can go: c's old entry takes it
    assert _held(pod) == (["a", "b", "c"], ["b"], 1, 5)
    for name in ("a", "b", "c"):
        await pod.release(name)


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


# -- the batch: what a request's time is made of (emulated pods with the replay's model) --


async def test_vllm_runs_at_most_max_num_seqs_and_the_rest_wait_in_order() -> None:
    """vLLM's scheduler takes waiting requests first come first served and stops when
    the batch is full (vllm-project/vllm vllm/v1/core/sched/scheduler.py
    ``Scheduler.schedule``: ``if len(self.running) == self.max_num_running_reqs: break``);
    the waiting ones show in ``vllm:num_requests_waiting``. The emulated pod with a
    ``BatchTiming`` does the same; a real engine's timing is not deterministic here."""
    time = VirtualTime()
    fleet = EmulatedFleet.start(1, config=_batch_config(), clock=time, sleep=time.sleep)
    url = fleet.handles[0].url
    async with fleet.http(timeout=None) as http:
        body = {"model": "base-model", "prompt": "hi", "max_tokens": 2}
        answers = asyncio.gather(*(http.post(f"{url}/v1/completions", json=body) for _ in range(3)))
        await time.settle()
        stats = (await http.get(f"{url}/admin/stats")).json()
        assert (stats["running"], stats["waiting"]) == (2, 1)
        while not answers.done():
            await time.step()
    assert [answer.status_code for answer in answers.result()] == [200, 200, 200]
    # the third's one step starts when the first two end: 10 ms x 1.5 (two of two
    # places), then 10 ms x 1.25 (one of two)
    assert time() == pytest.approx(0.015 + 0.0125)


async def test_vllm_a_step_grows_with_the_batch_and_its_distinct_adapters() -> None:
    """A decode step is one forward over every running request (more tokens, more time),
    and the LoRA kernels run one segment per distinct adapter in the batch
    (vllm-project/vllm vllm/lora/punica_wrapper/punica_base.py, its metadata from
    vllm/lora/utils.py ``compute_meta``); the prefill grows with the prompt's tokens
    (the scheduler schedules ``num_new_tokens`` of the prompt). The replay's arithmetic
    (placement.sim.engine), read by the emulated pod at each step."""
    pod = EmulatedPod(_batch_config(places=4))
    await pod.load("c-a", "s3://adapters/c-a")
    await pod.load("c-b", "s3://adapters/c-b")
    await pod.admit("c-a")
    alone = pod.step_ms()
    await pod.admit("c-a")
    two = pod.step_ms()
    await pod.admit("c-b")
    mixed = pod.step_ms()
    assert (alone, two, mixed) == pytest.approx((10 * 1.125, 10 * 1.25, 10 * 1.375 * 1.1))
    for name in ("c-a", "c-a", "c-b"):
        await pod.release(name)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG], ids=["vllm", "sglang"])
async def test_a_request_waiting_for_a_lora_slot_holds_no_place_in_the_batch(
    engine: Engine,
) -> None:
    """A waiting request whose adapter would take the batch past its distinct adapters
    stays in the waiting queue, holding no place, and later requests that fit run
    first. vLLM: vllm-project/vllm vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``
    moves it to ``skipped_waiting_requests`` ("Scheduling would exceed max_loras, skip"),
    puts it back at the head of ``self.waiting`` after the pass, and counts only
    ``self.running`` against ``max_num_running_reqs``. SGLang: sgl-project/sglang
    python/sglang/srt/managers/scheduler.py ``Scheduler.get_new_batch_prefill`` ->
    ``_get_new_batch_prefill_raw`` passes over it (``_can_schedule_lora_req`` ->
    python/sglang/srt/lora/lora_manager.py ``LoRAManager.validate_lora_batch``, then
    ``continue``); only the requests it takes leave ``waiting_queue``, and
    ``get_num_allocatable_reqs`` counts the running batch."""
    flat = BatchTiming(
        max_num_seqs=3,
        prefill_ms_per_token=0.0,
        decode_ms_per_step=10.0,
        batch_step_slowdown=0.0,
        adapter_step_cost=0.0,
    )
    config = PodConfig(
        engine=engine, latency=ZERO_LATENCY, batch=flat, max_loras=2, max_cpu_loras=4
    )
    pod = EmulatedPod(config)
    for name in ("a", "b", "c"):
        await pod.load(name, f"s3://adapters/{name}")
    await pod.admit("a")
    await pod.admit("b")  # two adapters run: both GPU slots are busy
    blocked = asyncio.ensure_future(pod.admit("c"))
    for _ in range(20):
        await asyncio.sleep(0)
    later = asyncio.ensure_future(pod.admit("a"))  # its adapter runs: it fits
    for _ in range(20):
        await asyncio.sleep(0)
    state = (blocked.done(), later.done(), pod.seats.taken, pod_stats(pod)["waiting"])
    await pod.release("b")  # b's place and GPU slot: c runs
    await blocked
    assert state == (False, True, 3, 1)
    assert pod.seats.taken == 3 and pod.gpu == ("a", "c")
    for name in ("a", "a", "c"):
        await pod.release(name)


#: A cold read of 100 ms (the default adapter size read at no cost per MB).
COLD = replace(ZERO_LATENCY, load_ms=100.0)


def _cold_pod(
    engine: Engine, time: VirtualTime, *, max_loras: int = 4, max_cpu_loras: int = 8
) -> EmulatedPod:
    flat = BatchTiming(
        max_num_seqs=4,
        prefill_ms_per_token=0.0,
        decode_ms_per_step=10.0,
        batch_step_slowdown=0.0,
        adapter_step_cost=0.0,
    )
    config = PodConfig(
        engine=engine,
        latency=COLD,
        batch=flat,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
    )
    return EmulatedPod(config, clock=time, sleep=time.sleep)


async def _drain(tokens: AsyncIterator[int]) -> None:
    async for _ in tokens:
        pass


async def _token_gap(
    pod: EmulatedPod, time: VirtualTime, *, runs: str, meanwhile: Awaitable[object]
) -> float:
    """Seconds between two tokens of a request for ``runs`` while ``meanwhile`` starts."""
    await time.run(pod.admit(runs))
    tokens = pod.generate(prompt_tokens=0, max_tokens=3)
    await anext(tokens)
    before = time()
    other = asyncio.ensure_future(meanwhile)
    await time.settle()  # it starts its read before the next token is due
    task = asyncio.ensure_future(anext(tokens))
    while not task.done():
        await time.step()
    gap = time() - before
    await time.run(other, _drain(tokens))
    await pod.release(runs)
    return gap


async def _token_gap_during_a_load(pod: EmulatedPod, time: VirtualTime) -> float:
    """Seconds between two tokens of a running request while another adapter loads."""
    await time.run(pod.load("a", "s3://adapters/a"))
    return await _token_gap(pod, time, runs="a", meanwhile=pod.load("b", "s3://adapters/b"))


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG], ids=["vllm", "sglang"])
async def test_a_cold_read_stalls_the_running_batch(engine: Engine) -> None:
    """Both engines read an adapter's weights on their one loop, so a running request's
    next token (a 10 ms step) waits out a 100 ms read.

    vLLM: a load over HTTP is ``EngineCore.add_lora``, run between steps
    (vllm-project/vllm vllm/v1/engine/core.py), and a listed adapter whose weights left
    the host cache is read inside a step by ``set_active_loras``
    (vllm/v1/worker/lora_model_runner_mixin.py); both reach
    ``LRUCacheWorkerLoRAManager.add_adapter``, whose ``_load_adapter`` reads the
    checkpoint before it returns (vllm/lora/worker_manager.py).

    SGLang: ``Scheduler.event_loop_normal`` (and ``event_loop_overlap``) runs
    ``process_input_requests`` before ``get_next_batch_to_run`` and ``run_batch``
    (sgl-project/sglang python/sglang/srt/managers/scheduler.py); its dispatcher hands a
    ``LoadLoRAAdapterReqInput`` to ``Scheduler.load_lora_adapter``, which calls down to
    ``LoRAManager.load_lora_adapter`` and ``load_lora_weights``, reading the weights
    into host memory before it returns (python/sglang/srt/lora/lora_manager.py)."""
    time = VirtualTime()
    assert await _token_gap_during_a_load(_cold_pod(engine, time), time) == pytest.approx(0.100)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG], ids=["vllm", "sglang"])
async def test_cold_reads_on_one_pod_run_one_after_another(engine: Engine) -> None:
    """The same one loop reads one adapter at a time: three loads sent together end one
    read apart (vLLM: each read and activation is one ``add_lora`` call; SGLang: each
    ``load_lora_adapter`` holds the tokenizer manager's one ``lora_update_lock``
    (python/sglang/srt/managers/tokenizer_control_mixin.py ``load_lora_adapter``) and is
    read by the scheduler's loop in turn)."""
    time = VirtualTime()
    pod = _cold_pod(engine, time)
    ends: list[float] = []

    async def load(name: str) -> None:
        await pod.load(name, f"s3://adapters/{name}")
        ends.append(time())

    await time.run(load("a"), load("b"), load("c"))
    assert ends == pytest.approx([0.1, 0.2, 0.3])  # one engine loop reads each in turn


async def test_sglang_a_request_for_an_adapter_the_soft_cap_unloaded_stalls_the_batch() -> None:
    """A request for an adapter the soft cap unloaded loads it again through the load
    path (sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py
    ``TokenizerManager._resolve_lora_path`` calls ``load_lora_adapter``), so its read on
    the scheduler's loop stalls the running batch as a load's does."""
    time = VirtualTime()
    pod = _cold_pod(Engine.SGLANG, time, max_loras=2, max_cpu_loras=2)
    for name in ("a", "b", "c"):  # c past --max-loaded-loras 2 unloads a, the LRU
        await time.run(pod.load(name, f"s3://adapters/{name}"))
    assert "a" in pod.residency.parked

    async def request_a() -> None:
        await pod.admit("a")
        await pod.release("a")

    assert await _token_gap(pod, time, runs="b", meanwhile=request_a()) == pytest.approx(0.100)
    assert pod.counters["cold_reloads"] == 1


def _batch_config(*, places: int = 2) -> PodConfig:
    batch = BatchTiming(
        max_num_seqs=places,
        prefill_ms_per_token=0.0,
        decode_ms_per_step=10.0,
        batch_step_slowdown=0.5,
        adapter_step_cost=0.1,
    )
    return PodConfig(latency=ZERO_LATENCY, batch=batch, max_loras=2, max_cpu_loras=4)
