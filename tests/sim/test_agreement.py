"""The emulator and the replay simulator agree on what a pod holds.

Random sequences of loads, unloads and requests go to an emulated pod over HTTP (its
engine client, in-process) and to the replay's pod model (``SimPod``); after every
call both must have accepted or refused it alike and hold the same: the names listed
(and, on SGLang, those its soft cap unloaded), the GPU slots in LRU order, the host
cache, and the slots vLLM's unloaded entries still hold. The simulator's side is read
from the mirrors its routers read, so this also holds those to the engine model.

A ``route`` is a request as the replay serves one: a hit, or a fetch (loaded first
where the pod does not serve the name) that lands on its slot; at the wire, the
router's way: a request, and on a refusal a load and the request again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from placement.actuation.apply import make_clients
from placement.clock import ManualClock
from placement.domain import AdapterId, Engine, PodId
from placement.emulator import ZERO_LATENCY, EmulatedFleet, PodConfig
from placement.errors import EngineError
from placement.ports import EngineClient
from placement.residency import EngineModel, ResidencyError
from placement.sim.pods import PodSpec, SimPod

NAMES = ("a", "b", "c", "d", "e")
CALLS = ("load", "unload", "request", "route")
Call = tuple[str, str]


def _path(name: str) -> str:
    return f"s3://adapters/{name}"


async def _emulated(client: EngineClient, call: str, name: str) -> bool:
    """One call at the wire; True when the pod did it (not "already", not refused)."""
    adapter = AdapterId(name)
    try:
        if call == "load":
            return await client.load(adapter, lora_path=_path(name))
        if call == "unload":
            return await client.unload(adapter)
        if call == "route":
            try:
                await client.warmup(adapter)
                return True
            except EngineError:
                await client.load(adapter, lora_path=_path(name))
        await client.warmup(adapter)
    except EngineError:
        return False
    return True


def _simulated(pod: SimPod, call: str, name: str) -> bool:
    try:
        if call == "load":
            pod.load(name)
        elif call == "unload":
            pod.unload(name)
        elif call == "request":
            pod.request(name)
        elif name in pod.gpu_adapters:
            pod.touch(name)
        else:
            pod.fetch(name, busy=(), now_s=0.0)
            pod.land(name, 0.0)
    except ResidencyError:
        return False
    return True


def _emulator_holds(stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "listed": sorted(stats["listed"]),
        "parked": sorted(stats["parked"]),
        "gpu": list(stats["gpu"]),
        "host": sorted(stats["host"]),
        "ghosts": stats["ghosts"],
    }


def _simulator_holds(pod: SimPod) -> dict[str, Any]:
    """The routers' views; ``model`` is read (which sends the hits noted since) only
    every third call, so that several hits go to the engine model at once."""
    return {
        "gpu": list(pod.gpu_adapters),
        "host": sorted(pod.registered),
        "ghosts": pod.ghosts,
    }


def _simulator_lists(pod: SimPod) -> dict[str, Any]:
    return {"listed": sorted(pod.model.listed), "parked": sorted(pod.model.parked)}


async def _both(model: EngineModel, max_loras: int, cap: int, calls: list[Call]) -> None:
    engine = Engine.VLLM if model is EngineModel.VLLM else Engine.SGLANG
    config = PodConfig(
        latency=ZERO_LATENCY, max_loras=max_loras, max_cpu_loras=cap, engine_model=model
    )
    fleet = EmulatedFleet.start(1, engine=engine, config=config, clock=ManualClock())
    pod = SimPod(PodSpec(pod_id="pod-0", max_loras=max_loras, max_cpu_loras=cap, engine=model))
    async with fleet.http() as http:
        client = make_clients(fleet.domain(), http=http, timeout_s=5.0)[PodId("pod-0")]
        for step, (call, name) in enumerate(calls):
            done = await _emulated(client, call, name)
            assert _simulated(pod, call, name) == done, (step, call, name)
            held = _emulator_holds((await http.get(f"{fleet.handles[0].url}/admin/stats")).json())
            assert _simulator_holds(pod) == {k: held[k] for k in ("gpu", "host", "ghosts")}, step
            if step % 3 == 2 or step == len(calls) - 1:
                assert pod.agrees(), step
                assert _simulator_lists(pod) == {k: held[k] for k in ("listed", "parked")}, step


MODELS = st.sampled_from([EngineModel.VLLM, EngineModel.SGLANG, EngineModel.SGLANG_HARD_CAP])
SEQUENCES = st.lists(st.tuples(st.sampled_from(CALLS), st.sampled_from(NAMES)), max_size=40)
#: vLLM: "a" unloaded keeps its slot; loaded again, a second entry; "c" pushes out the
#: older one. SGLang: "c" past the cap of two unloads the least recently used, "a".
GHOSTS_AND_THE_CAP: list[Call] = [
    ("load", "a"),
    ("load", "b"),
    ("request", "a"),
    ("unload", "a"),
    ("load", "a"),
    ("load", "c"),
    ("request", "b"),
    ("route", "d"),
    ("request", "a"),
    ("route", "b"),
]

#: Hits on both slots between two reads of the model: sent in their order of last use.
HITS: list[Call] = [("load", "a"), ("load", "b"), ("load", "c")] + [
    ("request", name) for name in "bcbcbc"
]


@settings(max_examples=60, deadline=None)
@given(MODELS, st.integers(1, 3), st.integers(0, 2), SEQUENCES)
@example(EngineModel.VLLM, 2, 0, GHOSTS_AND_THE_CAP)
@example(EngineModel.SGLANG, 1, 1, GHOSTS_AND_THE_CAP)
@example(EngineModel.SGLANG_HARD_CAP, 1, 1, GHOSTS_AND_THE_CAP)
@example(EngineModel.VLLM, 2, 1, HITS)
def test_the_emulator_and_the_simulator_hold_the_same(
    model: EngineModel, max_loras: int, extra: int, calls: list[Call]
) -> None:
    asyncio.run(_both(model, max_loras, max_loras + extra, calls))
