"""Applying plans to emulated pods: convergence, idempotence and failures survived."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from placement.actuation.apply import (
    ApplyOutcome,
    apply_plan,
    lora_paths,
    make_clients,
    plan_actions,
)
from placement.actuation.executor import Executor, Ledger, Status, backoff_s
from placement.clock import ManualClock
from placement.domain import AdapterId, Catalog, Engine, Load, PodId
from placement.emulator import (
    ZERO_LATENCY,
    EmulatedFleet,
    Faults,
    Latency,
    PodConfig,
)
from placement.emulator.wire import pod_stats
from placement.plan import Plan
from placement.settings import ExecutorSettings
from tests.factories import adapter, catalog, make_plan

pytestmark = pytest.mark.anyio

NAMES = [f"a{i}" for i in range(10)]
FAST = ExecutorSettings(
    per_action_deadline_s=5.0, max_concurrency=8, max_attempts=8, backoff_base_s=0.0
)


def _catalog(missing: str = "") -> Catalog:
    return catalog(
        *(
            adapter(
                name,
                base="base-model",
                rank=8,
                size_bytes=1,
                target_modules=("q_proj",),
                source=f"s3://adapters/{'missing-' if name == missing else ''}{name}",
            )
            for name in NAMES
        )
    )


PLAN_A = make_plan(
    {"pod-0": ["a0", "a1"], "pod-1": ["a0", "a4"], "pod-2": ["a6"], "pod-3": ["a1", "a9"]},
    {"pod-0": ["a2", "a3"], "pod-1": ["a5"], "pod-2": ["a7", "a8"], "pod-3": ["a2"]},
)
PLAN_B = make_plan(
    {"pod-0": ["a9", "a6"], "pod-1": ["a1", "a0"], "pod-2": ["a2", "a7"], "pod-3": ["a4", "a5"]},
    {"pod-0": ["a5", "a4"], "pod-1": ["a8", "a3"], "pod-2": ["a0"], "pod-3": ["a6", "a1"]},
)

#: PLAN_B without a3, a8 and a9: a vLLM pod unloads what the plan does not know.
PLAN_FEWER = make_plan(
    {"pod-0": ["a6"], "pod-1": ["a1", "a0"], "pod-2": ["a2", "a7"], "pod-3": ["a4", "a5"]},
    {"pod-0": ["a5", "a4"], "pod-2": ["a0"], "pod-3": ["a6", "a1"]},
)


def _fleet(
    engine: Engine = Engine.VLLM, *, clock: ManualClock | None = None, **config: Any
) -> EmulatedFleet:
    template = PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4, **config)
    return EmulatedFleet.start(4, engine=engine, config=template, clock=clock or ManualClock())


async def _no_sleep(_: float) -> None:
    await asyncio.sleep(0)


Apply = Callable[..., Awaitable[ApplyOutcome]]


def _applier(
    fleet: EmulatedFleet,
    http: httpx.AsyncClient,
    *,
    settings: ExecutorSettings = FAST,
    ledger: Ledger | None = None,
) -> Apply:
    clients = make_clients(fleet.domain(), http=http, timeout_s=2.0)
    ledger = ledger if ledger is not None else Ledger()

    async def run(plan: Plan, catalog: Catalog | None = None, **kwargs: Any) -> ApplyOutcome:
        return await apply_plan(
            plan,
            fleet=fleet.domain(),
            catalog=catalog or _catalog(),
            clients=clients,
            settings=settings,
            rng=random.Random(7),
            ledger=ledger,
            sleep=_no_sleep,
            **kwargs,
        )

    return run


def _assert_holds(fleet: EmulatedFleet, plan: Plan) -> None:
    """Each pod lists the plan's adapters (vLLM: and keeps other names the plan knows,
    since an unload there frees nothing) and its GPU holds the plan's hot set (exactly,
    when the hot set fills the GPU)."""
    for handle in fleet.handles:
        pod_plan, stats = plan.pods[handle.name], pod_stats(handle.pod)
        listed, wanted = set(stats["listed"]), set(pod_plan.registered)
        assert wanted <= listed, handle.name
        kept = listed - wanted
        assert kept <= set(plan.adapters) if fleet.engine is Engine.VLLM else not kept, kept
        gpu = set(stats["gpu"])
        assert set(pod_plan.hot) <= gpu, (handle.name, gpu)
        if len(pod_plan.hot) == handle.pod.config.max_loras:
            assert gpu == set(pod_plan.hot), (handle.name, gpu)


def _assert_never_over_limits(fleet: EmulatedFleet) -> None:
    """SGLang never lists more than ``--max-loaded-loras``, so its soft cap never unloads
    an adapter; vLLM lists without limit (an unload frees nothing, so loads come first)."""
    for handle in fleet.handles:
        stats = pod_stats(handle.pod)
        counters, peaks = stats["counters"], stats["peaks"]
        assert counters.get("unlisted", 0) == 0
        if fleet.engine is Engine.SGLANG:
            assert peaks.get("registered", 0) <= handle.pod.config.cpu_slots
            assert counters.get("over_limit", 0) == 0


async def _watch_hot_replicas(fleet: EmulatedFleet, plan: Plan, stop: asyncio.Event) -> list[str]:
    """Every loop turn, note hot adapters of ``plan`` that lost their last replica."""
    hot = {a for pod_plan in plan.pods.values() for a in pod_plan.hot}
    seen: set[str] = set()
    lost: list[str] = []
    while not stop.is_set():
        held = {a for h in fleet.handles for a in h.pod.listed}
        lost += sorted((seen & hot) - held)
        seen |= held & hot
        await asyncio.sleep(0)
    return lost


@pytest.mark.parametrize(
    ("engine", "count"),
    [
        pytest.param(Engine.VLLM, 13, id="vllm-13-loads"),
        pytest.param(Engine.SGLANG, 20, id="sglang-13-loads-7-warmups"),
    ],
)
async def test_apply_converges_and_a_second_apply_does_nothing(engine: Engine, count: int) -> None:
    """On vLLM each load activates, so the hot set needs no warm-up when loaded last."""
    fleet = _fleet(engine)
    async with fleet.http() as http:
        apply = _applier(fleet, http)
        first = await apply(PLAN_A)
        second = await apply(PLAN_A)
    assert first.report.ok and len(first.actions) == count
    assert second.actions == ()
    _assert_holds(fleet, PLAN_A)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
async def test_changing_plans_keeps_a_replica_of_every_hot_adapter(engine: Engine) -> None:
    fleet = _fleet(engine)
    async with fleet.http() as http:
        apply = _applier(fleet, http)
        await apply(PLAN_A)
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_hot_replicas(fleet, PLAN_B, stop))
        outcome = await apply(PLAN_B)
        stop.set()
        lost = await watcher
        again = await apply(PLAN_B)
    assert outcome.report.ok, outcome.report.failed
    assert lost == []
    assert again.actions == ()
    _assert_holds(fleet, PLAN_B)
    _assert_never_over_limits(fleet)


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
async def test_a_fifth_of_calls_failing_with_5xx_still_converges(engine: Engine) -> None:
    fleet = _fleet(engine, faults=Faults(error_rate=0.2))
    async with fleet.http() as http:
        apply = _applier(fleet, http)
        first, moved = await apply(PLAN_A), await apply(PLAN_B)
        for handle in fleet.handles:
            handle.pod.set_faults(error_rate=0.0)
        final = await apply(PLAN_B)
    assert any(r.attempts > 1 for o in (first, moved) for r in o.report.results)
    assert moved.report.ok and not moved.observation.unreachable
    assert final.actions == ()
    _assert_holds(fleet, PLAN_B)
    _assert_never_over_limits(fleet)


async def test_a_pod_killed_mid_apply_is_reported_and_the_next_apply_converges() -> None:
    clock = ManualClock()
    fleet = _fleet(clock=clock)
    victim = fleet.pod("pod-2")
    done = 0

    def kill_after_five(_: object) -> None:
        nonlocal done
        done += 1
        if done == 5:
            victim.kill(0.4)

    settings = ExecutorSettings(per_action_deadline_s=2.0, max_attempts=2, backoff_base_s=0.0)
    async with fleet.http() as http:
        apply = _applier(fleet, http, settings=settings)
        broken = await apply(PLAN_A, on_result=kill_after_five)
        during = await apply(PLAN_A)
        clock.advance(0.45)
        healed = await apply(PLAN_A)
        final = await apply(PLAN_A)
    assert not broken.report.ok
    assert {r.action.pod for r in broken.report.failed} == {"pod-2"}
    assert "pod-2" in during.observation.unreachable
    assert healed.report.ok and final.actions == ()
    _assert_holds(fleet, PLAN_A)
    _assert_never_over_limits(fleet)


async def test_loads_slower_than_the_deadline_fail_then_converge() -> None:
    fleet = _fleet(faults=Faults(slow_load_ms=300.0))
    settings = ExecutorSettings(per_action_deadline_s=0.05, max_attempts=3, backoff_base_s=0.0)
    async with fleet.http() as http:
        slow = await _applier(fleet, http, settings=settings)(PLAN_A)
        for handle in fleet.handles:
            handle.pod.set_faults(slow_load_ms=0.0)
        apply = _applier(fleet, http)
        healed = await apply(PLAN_A)
        final = await apply(PLAN_A)
    assert slow.report.failed and all("deadline" in r.detail for r in slow.report.failed)
    assert healed.report.ok and final.actions == ()
    _assert_holds(fleet, PLAN_A)
    _assert_never_over_limits(fleet)


async def test_a_pod_that_restarts_empty_is_reloaded_and_rewarmed() -> None:
    fleet = _fleet()
    async with fleet.http() as http:
        apply = _applier(fleet, http)
        await apply(PLAN_A)
        fleet.pod("pod-1").restart()
        again = await apply(PLAN_A)
    assert {(a.kind.value, a.pod) for a in again.actions} == {("load", "pod-1")}
    _assert_holds(fleet, PLAN_A)


async def test_a_bad_path_fails_permanently_naming_it_and_spares_the_rest() -> None:
    fleet = _fleet()
    async with fleet.http() as http:
        outcome = await _applier(fleet, http)(PLAN_A, _catalog(missing="a7"))
    (failure,) = outcome.report.failed
    assert failure.permanent and failure.attempts == 1
    assert "s3://adapters/missing-a7" in failure.detail
    assert set(fleet.pod("pod-2").listed) == {"a6", "a8"}
    assert not outcome.report.per_pod()[PodId("pod-0")].failed


async def test_runtime_updating_off_is_reported_per_pod() -> None:
    fleet = _fleet(runtime_lora_updating=False)
    async with fleet.http() as http:
        outcome = await _applier(fleet, http)(PLAN_A)
    reports = outcome.report.per_pod()
    first_failure = reports[PodId("pod-3")].failed[0]
    assert "set VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 on pod-3" in first_failure.detail
    assert all(r.status is not Status.DONE for r in outcome.report.results)


async def test_dry_run_observes_without_changing_anything() -> None:
    fleet = _fleet()
    async with fleet.http() as http:
        clients = make_clients(fleet.domain(), http=http)
        _, steps = await plan_actions(PLAN_A, fleet=fleet.domain(), clients=clients)
    assert len(steps.actions) == 13
    assert all(not h.pod.listed for h in fleet.handles)


@pytest.mark.parametrize("attempt", [1, 2, 5, 12])
def test_backoff_is_jittered_below_an_exponential_cap(attempt: int) -> None:
    settings = ExecutorSettings(backoff_base_s=0.2, backoff_max_s=5.0)
    cap = min(5.0, 0.2 * 2 ** (attempt - 1))
    delays = [backoff_s(attempt, settings=settings, rng=random.Random(s)) for s in range(50)]
    assert all(0.0 <= d <= cap for d in delays)
    assert max(delays) > cap / 2 and len(set(delays)) > 1


class _Counting(httpx.AsyncBaseTransport):
    """Counts requests in flight at the wire, fleet-wide and per pod."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.now: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        pod = request.url.netloc.decode()
        for key in (pod, "all"):
            self.now[key] += 1
            self.peak[key] = max(self.peak[key], self.now[key])
        try:
            return await self.inner.handle_async_request(request)
        finally:
            for key in (pod, "all"):
                self.now[key] -= 1


async def test_one_call_per_pod_and_a_global_limit_at_the_wire() -> None:
    latency = Latency(load_ms=5.0, activate_ms=1.0, ttft_ms=1.0, tpot_ms=0.0)
    template = PodConfig(latency=latency, max_loras=2, max_cpu_loras=4)
    fleet = EmulatedFleet.start(4, config=template)
    counting = _Counting(fleet.transport())
    settings = ExecutorSettings(max_concurrency=3, backoff_base_s=0.0)
    async with httpx.AsyncClient(transport=counting) as http:
        outcome = await _applier(fleet, http, settings=settings)(PLAN_A)
    assert outcome.report.ok
    assert counting.peak["all"] == 3
    assert all(counting.peak[h.url.removeprefix("http://")] == 1 for h in fleet.handles)


async def test_retries_back_off_exponentially_with_jitter_until_attempts_run_out() -> None:
    fleet = _fleet(faults=Faults(error_rate=1.0))
    delays: list[float] = []

    async def record(delay_s: float) -> None:
        delays.append(delay_s)

    settings = ExecutorSettings(max_attempts=4, backoff_base_s=0.2, backoff_max_s=0.5)
    actions = (Load(pod=PodId("pod-0"), adapter=AdapterId("a0"), reason="test"),)
    async with fleet.http() as http:
        executor = Executor(
            make_clients(fleet.domain(), http=http),
            lora_paths=lora_paths(_catalog()),
            settings=settings,
            rng=random.Random(3),
            sleep=record,
        )
        report = await executor.run(actions)
    (result,) = report.results
    assert (result.status, result.attempts, result.permanent) == (Status.FAILED, 4, False)
    assert "500" in result.detail
    caps = [0.2, 0.4, 0.5]
    assert len(delays) == 3 and all(0.0 <= d <= cap for d, cap in zip(delays, caps, strict=True))


async def _stats(http: httpx.AsyncClient, fleet: EmulatedFleet) -> dict[str, dict[str, Any]]:
    return {h.name: (await http.get(f"{h.url}/admin/stats")).json() for h in fleet.handles}


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
async def test_the_ledger_holds_what_each_emulated_pod_reports(engine: Engine) -> None:
    """After a plan, a re-plan that moves adapters and the same plan again, the ledger's
    engine model of each pod lists, caches and activates what the pod's ``/admin/stats``
    says: "hot" in the ledger is on the GPU, unloaded names' slots (vLLM) included."""
    fleet = _fleet(engine)
    ledger = Ledger()
    async with fleet.http() as http:
        apply = _applier(fleet, http, ledger=ledger)
        for plan in (PLAN_A, PLAN_B, PLAN_B, PLAN_FEWER):
            outcome = await apply(plan)
            assert outcome.report.ok, outcome.report.failed
            for name, stats in (await _stats(http, fleet)).items():
                model = ledger.pods[PodId(name)]
                assert model.on_gpu() == tuple(stats["gpu"]), name
                assert model.ghosts_on_gpu() == stats["ghosts"], name
                assert model.in_host() == tuple(stats["host"]), name
                assert set(model.listed) == set(stats["listed"]), name
    # The last plan dropped names: on vLLM their entries stay in the host cache.
    unloaded = [n for m in ledger.pods.values() for n, listed in m.host_entries() if not listed]
    assert bool(unloaded) is (engine is Engine.VLLM)


async def test_the_ledger_learns_a_restart_and_loads_by_others_from_the_listing() -> None:
    """A pod that comes back empty empties its model; a name someone else loaded is
    taken as loaded before everything the ledger knows (the first the LRU drops)."""
    fleet = _fleet()
    ledger = Ledger()
    async with fleet.http() as http:
        apply = _applier(fleet, http, ledger=ledger)
        await apply(PLAN_A)
        fleet.pod("pod-2").restart()
        url = fleet.handles[2].url  # someone else loads a9 there
        body = {"lora_name": "a9", "lora_path": "s3://adapters/a9"}
        assert (await http.post(f"{url}/v1/load_lora_adapter", json=body)).status_code == 200
        observation = await plan_actions(
            PLAN_A,
            fleet=fleet.domain(),
            clients=make_clients(fleet.domain(), http=http, timeout_s=2.0),
            ledger=ledger,
        )
        stats = (await _stats(http, fleet))["pod-2"]
    assert observation[0].states[PodId("pod-2")].warmed == ("a9",)
    model = ledger.pods[PodId("pod-2")]
    assert (model.on_gpu(), tuple(model.listed)) == (tuple(stats["gpu"]), ("a9",))


async def test_actions_of_one_pod_run_in_order_whatever_after_says() -> None:
    """A warm load after the hot one on vLLM would push it off: one call at a time per
    pod, in the order given, even when ``after`` lets them all start at once."""
    latency = Latency(load_ms=5.0, activate_ms=1.0, ttft_ms=1.0, tpot_ms=0.0)
    fleet = EmulatedFleet.start(1, config=PodConfig(latency=latency, max_loras=2, max_cpu_loras=4))
    pod = PodId("pod-0")
    actions = tuple(Load(pod=pod, adapter=AdapterId(a), reason="") for a in ("a0", "a1", "a2"))
    counting = _Counting(fleet.transport())
    async with httpx.AsyncClient(transport=counting) as http:
        executor = Executor(
            make_clients(fleet.domain(), http=http),
            lora_paths=lora_paths(_catalog()),
            settings=FAST,
            rng=random.Random(0),
        )
        report = await executor.run(actions, after=((), (), ()))
    assert report.ok
    assert counting.peak["all"] == 1
    assert pod_stats(fleet.pod("pod-0"))["gpu"] == ["a1", "a2"]
