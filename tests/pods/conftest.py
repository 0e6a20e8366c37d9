"""Fixtures of the pod suites: the anyio backend, emulated fleets, and ``target``, the
pod under contract (``contract_target``), for every emulated engine model and, when
their URLs are set, real engines.

``emulated`` is a factory other suites can copy: ``fleet = emulated(4, engine=...)``
gives pods named pod-0.. in-process, ``fleet.http()`` reaches them without sockets.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from placement.adapters.engines import engine_client
from placement.clock import ManualClock
from placement.domain import Engine
from placement.emulator import ZERO_LATENCY, EmulatedFleet, EmulatedPod, PodConfig
from tests.pods.contract_target import (
    MAX_LOADED,
    MAX_LORAS,
    TARGETS,
    VLLM,
    Target,
    contract_pod,
    emulated_pods,
)

EmulatedFactory = Callable[..., EmulatedFleet]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def emulated() -> EmulatedFactory:
    def make(
        n: int = 1,
        *,
        engine: Engine = Engine.VLLM,
        clock: ManualClock | None = None,
        **config: Any,
    ) -> EmulatedFleet:
        template = PodConfig(latency=ZERO_LATENCY, **config)
        return EmulatedFleet.start(n, engine=engine, config=template, clock=clock or ManualClock())

    return make


@pytest.fixture(params=TARGETS)
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    source, kind = request.param
    if source == "emulated":
        fleet, engine = emulated_pods(kind)
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
    client = engine_client(contract_pod(url, engine), http=http, served_model_name=base or None)
    found = Target(
        http, url, engine, model, lora_path, base, max_loras, max_loaded, client, emulated
    )
    yield found
    for name in dict.fromkeys([*found.loaded, "contract-a"]):
        await found.unload(name)
    await http.aclose()
