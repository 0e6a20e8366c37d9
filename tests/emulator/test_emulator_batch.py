"""An emulated pod with a ``BatchTiming`` is the replay's pod: at most ``max_num_seqs``
requests run and the rest wait in arrival order, the first token follows the prompt's
prefill, and each token after takes a decode step read as it starts from the batch's
size and distinct adapters. Every time is read on ``VirtualTime``: no test sleeps.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from placement.emulator import ZERO_LATENCY, EmulatedFleet, EmulatedPod, PodConfig
from placement.emulator.config import BatchTiming
from placement.emulator.refusals import PodDownError
from placement.emulator.seats import Seats
from placement.emulator.wire import pod_stats
from placement.settings import SimSettings
from tests.emulator.virtual_time import VirtualTime

pytestmark = pytest.mark.anyio

#: Four places; a 10 ms step alone, a full batch's 50% slower, 10% more per extra
#: adapter; 0.05 ms of prefill per prompt token.
BATCH = BatchTiming(
    max_num_seqs=4,
    prefill_ms_per_token=0.05,
    decode_ms_per_step=10.0,
    batch_step_slowdown=0.5,
    adapter_step_cost=0.1,
)
#: A flat 10 ms step and no prefill: a request of 3 tokens runs 20 ms.
FLAT = replace(BATCH, prefill_ms_per_token=0.0, batch_step_slowdown=0.0, adapter_step_cost=0.0)


def _config(batch: BatchTiming | None) -> PodConfig:
    return PodConfig(latency=ZERO_LATENCY, batch=batch, max_loras=4, max_cpu_loras=8)


def _pod(batch: BatchTiming | None, time: VirtualTime) -> EmulatedPod:
    return EmulatedPod(_config(batch), clock=time, sleep=time.sleep)


async def _request(
    pod: EmulatedPod, time: VirtualTime, name: str | None, *, prompt: int, tokens: int
) -> tuple[float, float, float]:
    """(admitted, first token, end) of one request, on the pod's clock."""
    await pod.admit(name)
    admitted = time()
    first = -1.0
    try:
        async for index in pod.generate(prompt_tokens=prompt, max_tokens=tokens):
            if index == 0:
                first = time()
    finally:
        await pod.release(name)
    return admitted, first, time()


async def test_the_fifth_request_of_four_places_waits_until_one_ends() -> None:
    time = VirtualTime()
    pod = _pod(FLAT, time)
    requests = [_request(pod, time, None, prompt=1, tokens=3) for _ in range(5)]
    runs = asyncio.gather(*requests)
    await time.settle()
    assert pod_stats(pod)["running"] == 4 and pod_stats(pod)["waiting"] == 1
    while not runs.done():
        await time.step()
    times = runs.result()
    assert [admitted for admitted, _, _ in times] == pytest.approx([0.0, 0.0, 0.0, 0.0, 0.020])
    # its first token came at its admission (no prefill here), 20 ms after it arrived
    assert times[4][1] == pytest.approx(0.020)
    assert times[4][2] == pytest.approx(0.040)
    assert pod.seats.taken == 0 and pod_stats(pod)["waiting"] == 0


async def test_without_a_batch_model_every_request_runs_at_once() -> None:
    time = VirtualTime()
    pod = _pod(None, time)
    times = await time.run(*(_request(pod, time, None, prompt=1, tokens=3) for _ in range(40)))
    assert {admitted for admitted, _, _ in times} == {0.0}


async def test_the_first_token_follows_the_prompts_prefill() -> None:
    time = VirtualTime()
    pod = _pod(BATCH, time)
    ((admitted, first, _),) = await time.run(_request(pod, time, None, prompt=1000, tokens=1))
    assert admitted == 0.0
    assert first == pytest.approx(1000 * 0.05 / 1000)


async def test_a_step_slows_with_the_batch_and_its_distinct_adapters_read_at_each_step() -> None:
    time = VirtualTime()
    pod = _pod(BATCH, time)
    for name in ("a", "b"):
        await pod.load(name, f"s3://adapters/{name}")
    tokens = pod.generate(prompt_tokens=100, max_tokens=4)
    await pod.admit("a")
    seen: list[float] = []

    async def next_token() -> None:
        task = asyncio.ensure_future(anext(tokens))
        while not task.done():
            await time.step()
        task.result()
        seen.append(time())

    await next_token()  # prefill of 100 tokens: 5 ms
    await next_token()  # alone: 10 * (1 + 0.5 * 1/4) = 11.25 ms
    await pod.admit("b")
    await pod.admit("b")
    await next_token()  # three running, two adapters: 10 * (1 + 0.5 * 3/4) * 1.1 = 15.125 ms
    await pod.release("b")
    await pod.release("b")
    await next_token()  # alone again: 11.25 ms
    gaps = [b - a for a, b in zip([0.0, *seen], seen, strict=False)]
    assert gaps == pytest.approx([0.005, 0.01125, 0.015125, 0.01125])
    await pod.release("a")


def test_the_step_of_the_replay_is_the_settings_arithmetic() -> None:
    sim = SimSettings()
    timing = BatchTiming.of(sim)
    full = timing.step_ms(running=sim.max_num_seqs, adapters=3)
    expected = (
        sim.decode_ms_per_step * (1 + sim.batch_step_slowdown) * (1 + 2 * sim.adapter_step_cost)
    )
    assert full == pytest.approx(expected)
    # the base model's requests are no segment: no adapter costs as one does
    assert timing.step_ms(running=1, adapters=0) == timing.step_ms(running=1, adapters=1)


async def test_queued_requests_show_as_waiting_on_the_wire_and_end_in_order() -> None:
    time = VirtualTime()
    fleet = EmulatedFleet.start(1, config=_config(FLAT), clock=time, sleep=time.sleep)
    url = fleet.handles[0].url
    async with fleet.http(timeout=None) as http:
        await time.run(http.post(f"{url}/v1/load_lora_adapter", json=_load("a")))
        body = {"model": "a", "prompt": "hi", "max_tokens": 3}

        async def ask() -> float:
            response = await http.post(f"{url}/v1/completions", json=body)
            assert response.status_code == 200, response.text
            return time()

        asks = asyncio.gather(*(ask() for _ in range(6)))
        await time.settle()
        metrics = (await http.get(f"{url}/metrics")).text
        assert _gauge(metrics, "vllm:num_requests_running") == 4.0
        assert _gauge(metrics, "vllm:num_requests_waiting") == 2.0
        while not asks.done():
            await time.step()
    assert sorted(asks.result()) == pytest.approx([0.02] * 4 + [0.04] * 2)


def _load(name: str) -> dict[str, str]:
    return {"lora_name": name, "lora_path": f"s3://adapters/{name}"}


def _gauge(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_takes_its_turn() -> None:
    seats = Seats(1)
    await seats.take()
    first = asyncio.ensure_future(seats.take())
    second = asyncio.ensure_future(seats.take())
    await asyncio.sleep(0)
    assert seats.queued == 2
    first.cancel()
    await asyncio.sleep(0)
    assert seats.queued == 1
    seats.give_back()
    await second
    assert seats.taken == 1 and seats.queued == 0


async def test_a_place_handed_to_a_cancelled_waiter_goes_on_to_the_next() -> None:
    seats = Seats(1)
    await seats.take()
    first = asyncio.ensure_future(seats.take())
    second = asyncio.ensure_future(seats.take())
    await asyncio.sleep(0)
    seats.give_back()  # first is handed the place ...
    first.cancel()  # ... and cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert seats.taken == 1


async def test_a_waiter_that_cannot_start_keeps_its_turn_and_holds_no_place() -> None:
    seats, ready = Seats(2), {"blocked": False}
    await seats.take()
    blocked = asyncio.ensure_future(seats.take(lambda: ready["blocked"]))
    await asyncio.sleep(0)
    await seats.take()  # the one behind it starts: the blocked one holds no place
    assert (seats.taken, seats.queued, blocked.done()) == (2, 1, False)
    ready["blocked"] = True
    seats.reconsider()  # no place free: it waits on
    await asyncio.sleep(0)
    assert not blocked.done()
    seats.give_back()
    await blocked
    assert (seats.taken, seats.queued) == (2, 0)


async def test_a_start_that_raises_fails_its_waiter_alone() -> None:
    seats = Seats(1)

    def refuse() -> bool:
        raise PodDownError()

    with pytest.raises(PodDownError):
        await seats.take(refuse)
    await seats.take()
    assert seats.taken == 1 and seats.queued == 0


async def test_a_waiter_started_as_it_was_cancelled_is_abandoned() -> None:
    seats, abandoned = Seats(1), []
    await seats.take()
    waiter = asyncio.ensure_future(seats.take(abandon=lambda: abandoned.append(True)))
    await asyncio.sleep(0)
    seats.give_back()  # it starts ...
    waiter.cancel()  # ... and is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert abandoned == [True]


async def test_a_restart_fails_the_queue_and_frees_every_place() -> None:
    time = VirtualTime()
    pod = _pod(FLAT, time)
    for _ in range(4):
        await pod.admit(None)
    queued = asyncio.ensure_future(pod.admit(None))
    await time.settle()
    pod.restart()
    with pytest.raises(PodDownError):
        await queued
    assert pod.seats.taken == 0
    await pod.admit(None)  # the restarted pod takes requests at once
    assert pod.seats.taken == 1


def test_a_batch_the_engine_would_refuse_is_named() -> None:
    config = _config(replace(BATCH, max_num_seqs=0, decode_ms_per_step=-1.0))
    assert config.problems() == [
        "max_num_seqs must be at least 1, got 0",
        "decode_ms_per_step must be 0 or more, got -1.0",
    ]


async def test_a_request_whose_client_leaves_during_its_swap_gives_back_its_place() -> None:
    time = VirtualTime()
    config = replace(_config(FLAT), latency=replace(ZERO_LATENCY, activate_ms=50.0))
    pod = EmulatedPod(config, clock=time, sleep=time.sleep)
    names = [f"a{i}" for i in range(5)]  # one more than the GPU slots
    await time.run(*(pod.load(name, f"s3://adapters/{name}") for name in names))
    (off_gpu,) = set(names) - set(pod.gpu)
    admitted = asyncio.ensure_future(pod.admit(off_gpu))
    await time.settle()  # it holds a place and waits out its swap onto the GPU
    assert pod.seats.taken == 1 and not admitted.done()
    admitted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await admitted
    assert pod.seats.taken == 0 and sum(pod.running.values()) == 0
