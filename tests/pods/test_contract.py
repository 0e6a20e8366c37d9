"""One contract for every pod: the emulated ones, and real engines when given.

Real engines run when ``VLLM_URL`` / ``SGLANG_URL`` are set, with ``LORA_PATH`` an
adapter directory the engine can load (and ``SERVED_MODEL_NAME`` for SGLang).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from placement.adapters.engines import engine_client
from placement.domain import AdapterId, Engine, Pod
from placement.emulator import ZERO_LATENCY, EmulatedFleet, PodConfig
from placement.errors import PermanentEngineError
from placement.ports import EngineClient
from tests.factories import pod

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class Target:
    client: EngineClient
    http: httpx.AsyncClient
    url: str
    engine: Engine
    lora_path: str
    base: str


def _pod(url: str, engine: Engine) -> Pod:
    return pod("pod-0", url=url, engine=engine, max_loras=2, max_cpu_loras=4, max_lora_rank=16)


TARGETS = [
    pytest.param(("emulated", Engine.VLLM), id="emulated-vllm"),
    pytest.param(("emulated", Engine.SGLANG), id="emulated-sglang"),
    pytest.param(("VLLM_URL", Engine.VLLM), id="real-vllm", marks=pytest.mark.external),
    pytest.param(("SGLANG_URL", Engine.SGLANG), id="real-sglang", marks=pytest.mark.external),
]


@pytest.fixture(params=TARGETS)
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    source, engine = request.param
    if source == "emulated":
        config = PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
        fleet = EmulatedFleet.start(1, engine=engine, config=config)
        http = fleet.http()
        url, lora_path, base = fleet.handles[0].url, "s3://adapters/contract", "base-model"
    else:
        url = os.environ.get(source, "")
        lora_path = os.environ.get("LORA_PATH", "")
        if not url or not lora_path:
            pytest.skip(f"{source} and LORA_PATH are not set")
        http, base = httpx.AsyncClient(), os.environ.get("SERVED_MODEL_NAME", "")
    client = engine_client(_pod(url, engine), http=http, served_model_name=base or None)
    yield Target(client, http, url, engine, lora_path, base)
    await client.unload(AdapterId("contract-a"))
    await http.aclose()


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


async def test_streamed_completion_is_openai_sse(target: Target) -> None:
    await target.client.load(A, lora_path=target.lora_path)
    model = A if target.engine is Engine.VLLM else f"{target.base}:{A}"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3,
        "stream": True,
    }
    response = await target.http.post(f"{target.url}/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] is not None
    assert chunks[0]["choices"][0]["delta"]["content"]
