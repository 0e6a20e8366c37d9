"""Emulated pods pay their pool's storage on a cold read, measured on their own clock.

A pod reads an adapter that is not in its host cache from where the pool keeps adapters
(fleet.yaml ``storage``): the first byte, then size / bandwidth, on top of the engine's
fixed part (``Latency.load_ms``); an adapter already in host memory only moves onto the
GPU. Every wait goes through the pod's ``sleep``, which here moves a ManualClock: the
tests read each wait on that clock and never sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import replace

import httpx
import pytest

from placement.clock import ManualClock
from placement.domain import AdapterStorage, Engine
from placement.emulator import ZERO_LATENCY, EmulatedFleet, Latency, PodConfig

pytestmark = pytest.mark.anyio

MB = 1_000_000
OBJECT = AdapterStorage(kind="object", bytes_per_s=200 * MB, first_byte_ms=80.0)
#: The emulator's size of an adapter it cannot look at (an s3:// path).
SIZE_BYTES = PodConfig().default_adapter_bytes
#: 80 ms to the first byte, then 50 MB at 200 MB/s.
OBJECT_FETCH_S = 0.080 + SIZE_BYTES / (200 * MB)
#: A GPU swap of 5 ms, so that a warm activation is not free either.
SWAP = replace(ZERO_LATENCY, activate_ms=5.0)


def _fleet(engine: Engine, config: PodConfig) -> tuple[EmulatedFleet, ManualClock]:
    clock = ManualClock()

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)
        await asyncio.sleep(0)  # let other tasks run, as a real wait would

    return EmulatedFleet.start(1, engine=engine, config=config, clock=clock, sleep=sleep), clock


def _load_path(engine: Engine) -> str:
    return "/load_lora_adapter" if engine is Engine.SGLANG else "/v1/load_lora_adapter"


def _model(engine: Engine, adapter: str) -> str:
    return f"base-model:{adapter}" if engine is Engine.SGLANG else adapter


async def _timed(clock: ManualClock, call: Awaitable[httpx.Response]) -> float:
    """Seconds ``call`` took on the pod's clock; it must succeed."""
    start = clock()
    response = await call
    assert response.status_code == 200, response.text
    return clock() - start


async def _load(http: httpx.AsyncClient, url: str, engine: Engine, name: str) -> httpx.Response:
    body = {"lora_name": name, "lora_path": f"s3://adapters/{name}"}
    return await http.post(url + _load_path(engine), json=body)


async def _ask(http: httpx.AsyncClient, url: str, engine: Engine, name: str) -> httpx.Response:
    body = {"model": _model(engine, name), "prompt": "hi", "max_tokens": 1}
    return await http.post(url + "/v1/completions", json=body)


ENGINES = [pytest.param(Engine.VLLM, id="vllm"), pytest.param(Engine.SGLANG, id="sglang")]


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_cold_read_from_object_storage_takes_first_byte_and_size_over_bandwidth_longer(
    engine: Engine,
) -> None:
    """One GPU slot, two host entries: loading a, b, c leaves b in host memory and a out
    of it (vLLM drops a's weights past --max-cpu-loras; SGLang's soft cap unloads a, to be
    loaded again on use). A request for b moves it onto the GPU; one for a reads it from
    object storage first: first byte + size / bandwidth longer."""
    config = PodConfig(latency=SWAP, max_loras=1, max_cpu_loras=2, storage=OBJECT)
    fleet, clock = _fleet(engine, config)
    url = fleet.handles[0].url
    async with fleet.http() as http:
        for name in ("a", "b", "c"):
            await _timed(clock, _load(http, url, engine, name))
        pod = fleet.pod("pod-0")
        assert "b" in pod.host and "a" not in pod.host
        warm_s = await _timed(clock, _ask(http, url, engine, "b"))
        cold_s = await _timed(clock, _ask(http, url, engine, "a"))
    assert warm_s == pytest.approx(0.005)
    assert cold_s - warm_s == pytest.approx(OBJECT_FETCH_S)
    assert pod.counters["cold_reloads"] == 1


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_load_reads_from_the_pools_storage(engine: Engine) -> None:
    """``load_lora_adapter`` reads the weights: the engine's fixed part, then the storage's."""
    latency = Latency(load_ms=3.0, load_ms_per_mb=0.2, activate_ms=0.0, activate_ms_per_mb=0.0)
    fleet, clock = _fleet(engine, PodConfig(latency=latency, max_loras=2, storage=OBJECT))
    async with fleet.http() as http:
        took_s = await _timed(clock, _load(http, fleet.handles[0].url, engine, "a"))
    assert took_s == pytest.approx(0.003 + OBJECT_FETCH_S)


@pytest.mark.parametrize("engine", ENGINES)
async def test_without_storage_a_cold_read_keeps_the_latency_settings(engine: Engine) -> None:
    """A pool without ``storage`` reads at ``load_ms + load_ms_per_mb`` (local NVMe), as
    before storage tiers existed."""
    latency = Latency(load_ms=3.0, load_ms_per_mb=0.2, activate_ms=0.0, activate_ms_per_mb=0.0)
    fleet, clock = _fleet(engine, PodConfig(latency=latency, max_loras=2))
    async with fleet.http() as http:
        took_s = await _timed(clock, _load(http, fleet.handles[0].url, engine, "a"))
    assert took_s == pytest.approx(0.003 + 0.2 * SIZE_BYTES / MB / 1000)


async def test_admin_stats_and_the_domain_fleet_show_the_storage() -> None:
    fleet, _ = _fleet(Engine.VLLM, PodConfig(latency=ZERO_LATENCY, storage=OBJECT))
    async with fleet.http() as http:
        stats = (await http.get(fleet.handles[0].url + "/admin/stats")).json()
    assert stats["storage"] == {"kind": "object", "bandwidth_per_s": 2e8, "first_byte_ms": 80.0}
    assert fleet.domain().pools[0].storage == OBJECT


@pytest.mark.parametrize(
    ("storage", "problem"),
    [
        pytest.param(replace(OBJECT, bytes_per_s=0.0), "storage bandwidth", id="no-bandwidth"),
        pytest.param(replace(OBJECT, first_byte_ms=-1.0), "first_byte_ms", id="negative-wait"),
    ],
)
def test_a_storage_that_cannot_be_read_is_refused(storage: AdapterStorage, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        EmulatedFleet.start(1, config=PodConfig(storage=storage))
