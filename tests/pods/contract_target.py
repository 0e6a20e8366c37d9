"""The pod under contract: the emulated ones (each engine model), and real engines.

Real engines run when ``VLLM_URL`` / ``SGLANG_URL`` are set, with ``LORA_PATH`` an
adapter directory the engine can load, ``SERVED_MODEL_NAME`` for SGLang and
``MAX_LORAS`` (``--max-loras`` / ``--max-loras-per-batch``, default 2). Optional:
``MAX_LOADED_LORAS`` (SGLang's ``--max-loaded-loras``; the soft-cap test needs it) and
``HIGH_RANK_LORA_PATH`` (an adapter above ``--max-lora-rank``).

Neither engine reports which adapters sit on its GPU (POD-API.md), so the residency
tests read it from the emulator's ``/admin/stats`` and skip on a real engine; SGLang's
soft cap shows in ``/v1/models`` and is checked everywhere. The contract's tests are
``test_contract_*.py``, one file per family; each test's docstring names the engine
source it encodes. The ``target`` fixture (conftest.py) yields a ``Target`` per pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from placement.domain import Engine, Pod
from placement.emulator import ZERO_LATENCY, EmulatedFleet, EmulatedPod, PodConfig
from placement.ports import EngineClient
from placement.residency import EngineModel
from tests.factories import pod

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


def contract_pod(url: str, engine: Engine) -> Pod:
    return pod("pod-0", url=url, engine=engine, max_loras=2, max_cpu_loras=4, max_lora_rank=16)


TARGETS = [
    pytest.param(("emulated", VLLM), id="emulated-vllm"),
    pytest.param(("emulated", SGLANG), id="emulated-sglang"),
    pytest.param(("emulated", HARD), id="emulated-sglang-hard-cap"),
    pytest.param(("VLLM_URL", Engine.VLLM), id="real-vllm", marks=pytest.mark.external),
    pytest.param(("SGLANG_URL", Engine.SGLANG), id="real-sglang", marks=pytest.mark.external),
]


def emulated_pods(model: EngineModel) -> tuple[EmulatedFleet, Engine]:
    engine = Engine.VLLM if model is VLLM else Engine.SGLANG
    config = PodConfig(
        latency=ZERO_LATENCY,
        engine_model=model,
        max_loras=MAX_LORAS,
        max_cpu_loras=MAX_LOADED,
        max_lora_rank=16,
    )
    return EmulatedFleet.start(1, engine=engine, config=config), engine


def only(target: Target, *engines: Engine) -> None:
    if target.engine not in engines:
        pytest.skip(f"{target.engine.value} does not do this")
