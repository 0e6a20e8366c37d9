"""The contract for the batch, on emulated pods with the replay's model: what a
request's time is made of (its places in the batch, the steps, the cold reads that
stall them). Each test's docstring names the engine source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace

import pytest

from placement.domain import Engine
from placement.emulator import ZERO_LATENCY, EmulatedFleet, EmulatedPod, PodConfig
from placement.emulator.config import BatchTiming
from placement.emulator.wire import pod_stats
from tests.emulator.virtual_time import VirtualTime

pytestmark = pytest.mark.anyio


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
