"""Controller ticks called directly: emulated pods at the wire, in-memory cluster twins,
a fake clock. Pods vanish, the API answers 500 and 409, the clock jumps."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Protocol

import pandas as pd
import pytest
from kubernetes import client

from placement.adapters.kube_api import KubeTarget
from placement.adapters.kube_memory import (
    MemoryHotSets,
    MemoryLeaseStore,
    MemoryPlanStore,
    MemoryPods,
    MemoryStateStore,
)
from placement.controller.leader import LeaderElector
from placement.controller.live_ports import EngineActuator, SeasonalForecaster
from placement.controller.ports import ControllerPorts, Job, TickOutcome
from placement.controller.ticks import Controller
from placement.domain import (
    AdapterId,
    Catalog,
    Fleet,
    Pipelines,
    PodId,
    PoolId,
    Tier,
)
from placement.emulator import ZERO_LATENCY, EmulatedFleet, PodConfig
from placement.emulator.wire import PodStats
from placement.errors import KubeConflictError, RetryableKubeError, SolverError
from placement.forecast.event_preloads import pipeline_predictor
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.plan import AdapterPlan, Plan, PodPlan, Preload
from placement.ports import DiscoveredPod
from placement.settings import ControllerSettings, ExecutorSettings, Settings
from placement.solver.problem import Demand
from tests import factories
from tests.controller.controller_kubefake import FakeApiServer
from tests.factories import T0, FakeClock

pytestmark = pytest.mark.anyio

NAMES = [f"a{i}" for i in range(6)]
SETTINGS = Settings(
    executor=ExecutorSettings(per_action_deadline_s=5.0, max_attempts=2, backoff_base_s=0.0),
    controller=ControllerSettings(backoff_base_s=30.0, backoff_max_s=240.0),
)


def catalog() -> Catalog:
    return factories.catalog(
        *(
            factories.adapter(
                name,
                base="base-model",
                rank=8,
                size_bytes=1_000_000,
                target_modules=("q_proj",),
                source=f"s3://adapters/{name}",
            )
            for name in NAMES
        )
    )


def history(now: datetime, *, days: int = 3) -> RequestLog:
    """a0 busiest, then a1, a2...; a5 only in the morning hour after 09:00."""
    rows = []
    for day in range(1, days + 1):
        base = now - timedelta(days=day)
        for minute in range(0, 120, 2):
            ts = base + timedelta(minutes=minute)
            for rank, name in enumerate(NAMES[:5]):
                rows.append((ts, name, 5 - rank))
            if ts.hour >= 9:
                rows.append((ts, "a5", 8))
    frame = pd.DataFrame(rows, columns=["ts", "adapter", "requests"])
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return request_log_from_frame(frame, source="test")


@dataclass
class RankPlanner:
    """A deterministic planner port: the busiest adapters hot, round robin over pods."""

    fail_next: list[Exception] = field(default_factory=list)

    def __call__(
        self,
        demand: Mapping[AdapterId, Demand],
        *,
        fleet: Fleet,
        valid_from: datetime,
        current: Plan | None,
    ) -> Plan:
        if self.fail_next:
            raise self.fail_next.pop(0)
        pods = [p for p in fleet.pods]
        ranked = sorted(
            (n for n in demand if demand[n].mean_rps > 0), key=lambda n: -demand[n].mean_rps
        )
        hot: dict[PodId, list[AdapterId]] = {p.name: [] for p in pods}
        adapters: dict[AdapterId, AdapterPlan] = {}
        slots = [(p.name, i) for i in range(pods[0].max_loras if pods else 0) for p in pods]
        for name, (pod, _) in zip(ranked, slots, strict=False):
            hot[pod].append(name)
            adapters[name] = AdapterPlan(tier=Tier.HOT, pods=MappingProxyType({pod: 1.0}))
        window = int(valid_from.timestamp())
        preloads = tuple(
            Preload(at=valid_from - timedelta(minutes=15), pod=pod, adapter=a, reason="rise")
            for pod, names in hot.items()
            for a in names
        )
        return Plan(
            id=f"plan-{window}-{'-'.join(ranked[:3])}",
            created_at=valid_from,
            valid_from=valid_from,
            valid_until=valid_from + timedelta(hours=1),
            pods=MappingProxyType({p: PodPlan(hot=tuple(h)) for p, h in hot.items()}),
            adapters=MappingProxyType(adapters),
            preloads=preloads,
        )


@dataclass
class Rig:
    controller: Controller
    emulated: EmulatedFleet
    clock: FakeClock
    planner: RankPlanner
    plans: MemoryPlanStore
    state: MemoryStateStore
    hot_sets: MemoryHotSets
    pods: MemoryPods | None

    def loads(self) -> int:
        return sum(h.pod.counters["loads"] for h in self.emulated.handles)

    def registered(self, pod: str) -> set[str]:
        return set(self.emulated.pod(pod).listed)


class MakeRig(Protocol):
    """The ``make_rig`` fixture: a rig over a fresh fleet, store and clock, or given ones."""

    def __call__(
        self,
        *,
        emulated: EmulatedFleet | None = None,
        state: MemoryStateStore | None = None,
        pods: MemoryPods | None = None,
        elector: LeaderElector | None = None,
        clock: FakeClock | None = None,
    ) -> Rig: ...


@pytest.fixture
async def make_rig() -> AsyncIterator[MakeRig]:
    clients = []

    def build(
        *,
        emulated: EmulatedFleet | None = None,
        state: MemoryStateStore | None = None,
        pods: MemoryPods | None = None,
        elector: LeaderElector | None = None,
        clock: FakeClock | None = None,
    ) -> Rig:
        emulated = emulated or EmulatedFleet.start(
            2, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
        )
        clock = clock or FakeClock(T0.replace(hour=8, minute=0).timestamp())
        http = emulated.http()
        clients.append(http)
        planner = RankPlanner()
        rig_state = state or MemoryStateStore()
        plans, hot_sets = MemoryPlanStore(), MemoryHotSets()
        cat = catalog()
        log = history(clock.wall())
        ports = ControllerPorts(
            catalog=cat,
            fleet=emulated.domain(pool="llama"),
            history=lambda: log,
            forecaster=SeasonalForecaster(bucket_s=SETTINGS.forecast.bucket_s, days=3),
            planner=planner,
            actuator=EngineActuator(
                catalog=cat, http=http, settings=SETTINGS, rng=random.Random(0), sleep=_no_sleep
            ),
            plans=plans,
            state=rig_state,
            predictor=pipeline_predictor(Pipelines(), cat),
            discovery=pods,
            hot_sets=hot_sets,
            elector=elector,
        )
        controller = Controller(ports, settings=SETTINGS, clock=clock)
        return Rig(controller, emulated, clock, planner, plans, rig_state, hot_sets, pods)

    yield build
    for http in clients:
        await http.aclose()


async def _no_sleep(_: float) -> None:
    return None


async def cycle(controller: Controller) -> list[TickOutcome]:
    return [
        await controller.guarded(Job.INGEST, controller.ingest),
        await controller.guarded(Job.FORECAST, controller.forecast),
        await controller.guarded(Job.PLAN, controller.plan_and_apply),
    ]


async def test_a_cycle_loads_the_plan_publishes_it_and_its_hot_sets_and_saves_state(
    make_rig: MakeRig,
) -> None:
    rig: Rig = make_rig()
    assert await cycle(rig.controller) == [TickOutcome.DONE] * 3
    plan = rig.plans.current()
    assert plan is not None and plan == rig.controller.state.plan
    for pod, pod_plan in plan.pods.items():
        assert set(pod_plan.hot) <= rig.registered(pod)
        assert rig.hot_sets.hot_sets[pod] == tuple(sorted(pod_plan.hot))
    assert rig.hot_sets.plan_id == plan.id
    assert {a for p in plan.pods.values() for a in p.hot} == {"a0", "a1", "a2", "a3"}
    assert rig.state.load().plan_json is not None


async def test_nothing_to_plan_before_any_history(make_rig: MakeRig) -> None:
    rig: Rig = make_rig()
    assert await rig.controller.guarded(Job.PLAN, rig.controller.plan_and_apply) is TickOutcome.IDLE
    assert await rig.controller.guarded(Job.FORECAST, rig.controller.forecast) is TickOutcome.IDLE


async def test_a_failed_plan_keeps_the_last_good_plan_and_backs_off(make_rig: MakeRig) -> None:
    rig: Rig = make_rig()
    await cycle(rig.controller)
    good = rig.controller.state.plan
    rig.planner.fail_next.extend([SolverError("no solution"), SolverError("still none")])

    async def plan_tick() -> TickOutcome:
        return await rig.controller.guarded(Job.PLAN, rig.controller.plan_and_apply)

    assert await plan_tick() is TickOutcome.FAILED
    assert rig.controller.state.plan == good and rig.plans.current() == good
    rig.clock.advance(10)
    assert await plan_tick() is TickOutcome.BACKING_OFF
    rig.clock.advance(25)
    assert await plan_tick() is TickOutcome.FAILED  # second failure: waits 60 s now
    assert rig.controller.state.backoff[Job.PLAN].failures == 2
    rig.clock.advance(45)
    assert await plan_tick() is TickOutcome.BACKING_OFF
    rig.clock.advance(20)
    assert await plan_tick() is TickOutcome.DONE
    assert Job.PLAN not in rig.controller.state.backoff


async def test_a_clock_jumping_back_does_not_strand_a_backing_off_job(make_rig: MakeRig) -> None:
    rig: Rig = make_rig()
    await cycle(rig.controller)
    rig.planner.fail_next.append(SolverError("no solution"))
    assert (
        await rig.controller.guarded(Job.PLAN, rig.controller.plan_and_apply) is TickOutcome.FAILED
    )
    rig.clock.advance(-6 * 3600)
    assert await rig.controller.guarded(Job.PLAN, rig.controller.plan_and_apply) is TickOutcome.DONE


@pytest.mark.parametrize(
    ("store", "error"),
    [
        pytest.param("plans", RetryableKubeError("HTTP 500", status=500), id="publish-500"),
        pytest.param("plans", KubeConflictError("HTTP 409", status=409), id="publish-409"),
        pytest.param("state", RetryableKubeError("HTTP 500", status=500), id="save-state-500"),
    ],
)
async def test_kube_failures_fail_the_tick_which_recovers_later(
    make_rig: MakeRig, store: str, error: Exception
) -> None:
    rig: Rig = make_rig()
    getattr(rig, store).faults.queued.append(error)
    assert await cycle(rig.controller) == [TickOutcome.DONE, TickOutcome.DONE, TickOutcome.FAILED]
    rig.clock.advance(31)
    assert await rig.controller.guarded(Job.PLAN, rig.controller.plan_and_apply) is TickOutcome.DONE
    assert rig.plans.current() == rig.controller.state.plan


async def test_a_restart_resumes_without_loading_anything_twice(make_rig: MakeRig) -> None:
    first: Rig = make_rig()
    await cycle(first.controller)
    loads = first.loads()
    assert loads >= 4
    second: Rig = make_rig(emulated=first.emulated, state=first.state, clock=first.clock)
    await second.controller.resume()
    assert second.controller.state.plan == first.controller.state.plan
    first.clock.advance(300)
    assert await cycle(second.controller) == [TickOutcome.DONE] * 3
    assert first.loads() == loads


async def test_pods_that_vanish_leave_the_plan_and_the_rest_keep_working(make_rig: MakeRig) -> None:
    emulated = EmulatedFleet.start(
        2, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    )
    discovered = MemoryPods(
        tuple(
            DiscoveredPod(
                name=h.name,
                pool=PoolId("llama"),
                ip="127.0.0.1",
                port=int(h.url.rsplit(":", 1)[1]),
                ready=True,
            )
            for h in emulated.handles
        )
    )
    rig: Rig = make_rig(emulated=emulated, pods=discovered)
    assert await cycle(rig.controller) == [TickOutcome.DONE] * 3
    assert rig.controller.state.plan is not None
    assert set(rig.controller.state.plan.pods) == {"pod-0", "pod-1"}
    discovered.remove(PodId("pod-1"))
    rig.clock.advance(300)
    assert await rig.controller.guarded(Job.PLAN, rig.controller.plan_and_apply) is TickOutcome.DONE
    assert rig.controller.state.plan is not None
    assert set(rig.controller.state.plan.pods) == {"pod-0"}
    # a pod that stops answering mid-apply does not fail the tick
    emulated.pod("pod-0").kill(down_s=3600)
    rig.clock.advance(300)
    assert await rig.controller.guarded(Job.PLAN, rig.controller.plan_and_apply) is TickOutcome.DONE


async def test_the_watchdog_refills_a_pod_that_came_back_empty(make_rig: MakeRig) -> None:
    rig: Rig = make_rig()
    await cycle(rig.controller)
    assert await rig.controller.guarded(Job.WATCHDOG, rig.controller.watchdog) is TickOutcome.IDLE
    assert rig.controller.state.plan is not None
    wanted = set(rig.controller.state.plan.pods[PodId("pod-1")].hot)
    rig.emulated.pod("pod-1").restart()
    assert rig.registered("pod-1") == set()
    assert await rig.controller.guarded(Job.WATCHDOG, rig.controller.watchdog) is TickOutcome.DONE
    assert wanted <= rig.registered("pod-1")


async def test_timed_preloads_run_once_even_across_a_restart(make_rig: MakeRig) -> None:
    rig: Rig = make_rig()
    await cycle(rig.controller)
    due = rig.controller.due_preloads()
    assert due == (datetime(2026, 3, 2, 8, 45, tzinfo=UTC),)
    ahead = rig.controller.state.lookahead
    assert ahead is not None and "a5" in {p.adapter for p in ahead.preloads}
    rig.clock.advance(45 * 60)
    assert (
        await rig.controller.guarded(Job.PRELOAD, lambda: rig.controller.preload(due[0]))
        is TickOutcome.DONE
    )
    holder = next(p.pod for p in ahead.preloads if p.adapter == "a5")
    assert "a5" in rig.registered(holder)
    loads = rig.loads()
    assert (
        await rig.controller.guarded(Job.PRELOAD, lambda: rig.controller.preload(due[0]))
        is TickOutcome.IDLE
    )
    restarted: Rig = make_rig(emulated=rig.emulated, state=rig.state, clock=rig.clock)
    await restarted.controller.resume()
    restarted.controller.state.lookahead = ahead
    assert restarted.controller.due_preloads() == ()
    assert await restarted.controller.preload(due[0]) is TickOutcome.IDLE
    assert rig.loads() == loads


async def test_a_forecast_that_moves_tiers_asks_for_a_plan_at_once(make_rig: MakeRig) -> None:
    rig: Rig = make_rig()
    await cycle(rig.controller)
    await rig.controller.guarded(Job.FORECAST, rig.controller.forecast)
    assert rig.controller.state.replan_now is False  # same demand, same tiers
    rig.clock.advance(3600)  # 09:00: a5's morning traffic enters the window
    await rig.controller.guarded(Job.FORECAST, rig.controller.forecast)
    assert rig.controller.state.replan_now is True


async def test_a_standby_does_nothing_and_takes_over_when_the_leader_stops(
    make_rig: MakeRig,
) -> None:
    clock = FakeClock(T0.replace(hour=8).timestamp())
    lease, shared_state = MemoryLeaseStore(), MemoryStateStore()
    emulated = EmulatedFleet.start(
        2, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    )

    def elector(name: str) -> LeaderElector:
        return LeaderElector(
            lease, identity=name, duration_s=15, renew_deadline_s=10, clock=clock, wall=clock.wall
        )

    leader: Rig = make_rig(emulated=emulated, state=shared_state, elector=elector("a"), clock=clock)
    standby: Rig = make_rig(
        emulated=emulated, state=shared_state, elector=elector("b"), clock=clock
    )
    assert await leader.controller.guarded(Job.LEASE, leader.controller.lease) is TickOutcome.DONE
    assert (
        await standby.controller.guarded(Job.LEASE, standby.controller.lease) is TickOutcome.STANDBY
    )
    assert await cycle(standby.controller) == [TickOutcome.STANDBY] * 3
    assert await cycle(leader.controller) == [TickOutcome.DONE] * 3
    loads = leader.loads()
    for _ in range(5):  # the leader stops renewing; the standby keeps trying
        clock.advance(5)
        await standby.controller.guarded(Job.LEASE, standby.controller.lease)
    assert leader.controller.is_leader() is False
    assert standby.controller.is_leader() is True
    assert standby.controller.state.plan == leader.controller.state.plan  # resumed
    assert await cycle(standby.controller) == [TickOutcome.DONE] * 3
    assert leader.loads() == loads


async def test_event_preloads_run_in_the_background_on_the_pods(make_rig: MakeRig) -> None:
    from placement.domain import Pipeline, PipelineStep, TenantId
    from placement.forecast.event_preloads import Event, EventKind

    roomy = EmulatedFleet.start(
        2, config=PodConfig(latency=ZERO_LATENCY, max_loras=3, max_cpu_loras=6)
    )
    rig: Rig = make_rig(emulated=roomy)
    await cycle(rig.controller)  # 4 busy adapters on 6 slots: room for one more
    pipelines = Pipelines(
        pipelines=(Pipeline(trigger="doc", steps=(PipelineStep(adapter=AdapterId("a5")),)),)
    )
    rig.controller.ports = replace(
        rig.controller.ports, predictor=pipeline_predictor(pipelines, rig.controller.ports.catalog)
    )
    decision = await rig.controller.on_event(
        Event(kind=EventKind.PIPELINE, id="e", tenant=TenantId("acme"), trigger="doc")
    )
    assert [a.adapter for a in decision.actions] == ["a5", "a5"]
    await asyncio.gather(*rig.controller._background)
    assert "a5" in rig.registered(decision.actions[0].pod)


async def test_the_schedule_brings_the_plan_forward_and_adds_preload_triggers(
    make_rig: MakeRig,
) -> None:
    from placement.controller.schedule import PRELOAD_PREFIX, Schedule

    rig: Rig = make_rig()
    schedule = Schedule(rig.controller, settings=SETTINGS.controller, wall=rig.clock)
    schedule.scheduler.start(paused=True)
    try:
        jobs = {job.id: job for job in schedule.scheduler.get_jobs()}
        assert set(jobs) == {"lease", "ingest", "forecast", "plan", "watchdog"}
        assert all(j.max_instances == 1 and j.coalesce for j in jobs.values())
        assert {j.misfire_grace_time for j in jobs.values()} == {
            SETTINGS.controller.misfire_grace_s
        }
        forecast_at = schedule.scheduler.get_job("forecast").next_run_time
        rig.clock.advance(1)
        assert await schedule._run(Job.INGEST, schedule.ingest) is TickOutcome.DONE
        assert schedule.scheduler.get_job("forecast").next_run_time != forecast_at
        planned_at = schedule.scheduler.get_job("plan").next_run_time
        rig.clock.advance(600)
        assert await schedule._run(Job.FORECAST, schedule.forecast) is TickOutcome.DONE
        assert rig.controller.state.replan_now is True  # no plan yet: everything moves
        assert schedule.scheduler.get_job("plan").next_run_time != planned_at
        preload_jobs = [j for j in schedule.scheduler.get_jobs() if j.id.startswith(PRELOAD_PREFIX)]
        assert [j.id for j in preload_jobs] == [f"{PRELOAD_PREFIX}2026-03-02T08:45:00+00:00"]
    finally:
        schedule.scheduler.shutdown(wait=False)


async def test_no_pods_or_no_traffic_keeps_the_last_plan(make_rig: MakeRig) -> None:
    emulated = EmulatedFleet.start(
        1, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    )
    handle = emulated.handles[0]
    discovered = MemoryPods(
        (
            DiscoveredPod(
                name=handle.name,
                pool=PoolId("llama"),
                ip="127.0.0.1",
                port=int(handle.url.rsplit(":", 1)[1]),
                ready=True,
            ),
        )
    )
    rig: Rig = make_rig(emulated=emulated, pods=discovered)
    await cycle(rig.controller)
    good = rig.controller.state.plan
    assert good is not None
    discovered.remove(handle.name)
    assert (
        await rig.controller.guarded(Job.PLAN, rig.controller.plan_and_apply) is TickOutcome.FAILED
    )
    assert rig.controller.state.plan == good and rig.plans.current() == good
    discovered.put(
        DiscoveredPod(
            name=handle.name,
            pool=PoolId("llama"),
            ip="127.0.0.1",
            port=int(handle.url.rsplit(":", 1)[1]),
            ready=True,
        )
    )
    rig.controller.state.history = request_log_from_frame(
        pd.DataFrame({"ts": pd.Series([], dtype="datetime64[ns, UTC]"), "adapter": []}),
        source="empty",
    )
    assert await rig.controller.guarded(Job.FORECAST, rig.controller.forecast) is TickOutcome.FAILED
    assert "no traffic" in rig.controller.state.backoff[Job.FORECAST].last_error


async def test_two_controllers_against_one_fake_api_server_only_the_holder_acts(
    make_rig: MakeRig,
    fake_api: FakeApiServer,
    kube_api: client.ApiClient,
    target: KubeTarget,
) -> None:
    from placement.adapters.kube import KubeLeaseStore, KubePlanStore, connect

    clock = FakeClock(T0.replace(hour=8).timestamp())
    emulated = EmulatedFleet.start(
        2, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    )
    shared_state = MemoryStateStore()
    second_api = connect(host=fake_api.url)
    try:

        def elector(name: str, api: client.ApiClient) -> LeaderElector:
            store = KubeLeaseStore(api, target=target)
            return LeaderElector(
                store,
                identity=name,
                duration_s=15,
                renew_deadline_s=10,
                clock=clock,
                wall=clock.wall,
            )

        a: Rig = make_rig(
            emulated=emulated, state=shared_state, elector=elector("a", kube_api), clock=clock
        )
        b: Rig = make_rig(
            emulated=emulated, state=shared_state, elector=elector("b", second_api), clock=clock
        )
        for rig in (a, b):
            rig.controller.ports = replace(
                rig.controller.ports, plans=KubePlanStore(kube_api, target=target)
            )
        acted: list[str] = []
        for step in range(12):
            clock.advance(5)
            for name, rig in (("a", a), ("b", b)):
                if name == "a" and step >= 4:
                    continue  # a stops: no more renewals, no more ticks
                await rig.controller.guarded(Job.LEASE, rig.controller.lease)
                if (
                    await rig.controller.guarded(Job.INGEST, rig.controller.ingest)
                    is TickOutcome.DONE
                ):
                    acted.append(f"{step}:{name}")
            assert not (a.controller.is_leader() and b.controller.is_leader())
        assert [x for x in acted if x.endswith(":a")] == [f"{s}:a" for s in range(4)]
        first_b = min(int(x.split(":")[0]) for x in acted if x.endswith(":b"))
        assert (first_b - 3) * 5 <= 15 + 5  # within the lease duration (plus one tick)
        lease = fake_api.get("leases", "lorafleet-controller")
        assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    finally:
        second_api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated


@pytest.mark.parametrize(
    "ledger_json",
    [
        pytest.param("{not json", id="not-json"),
        pytest.param('{"ledger": {"warmed": 7}}', id="wrong-shape"),
        pytest.param("[1, 2]", id="a-list"),
    ],
)
async def test_an_unreadable_saved_ledger_starts_empty_without_loading_twice(
    make_rig: MakeRig,
    ledger_json: str,
) -> None:
    from placement.ports import StoredState

    first: Rig = make_rig()
    await cycle(first.controller)
    loads = first.loads()
    plan_json = first.state.load().plan_json
    first.state.save(StoredState(plan_json=plan_json, ledger_json=ledger_json))
    second: Rig = make_rig(emulated=first.emulated, state=first.state, clock=first.clock)
    await second.controller.resume()
    assert second.controller.state.plan == first.controller.state.plan
    assert await cycle(second.controller) == [TickOutcome.DONE] * 3
    assert first.loads() == loads


async def _gpu_stats(rig: Rig) -> dict[str, PodStats]:
    async with rig.emulated.http() as http:
        return {
            h.name: (await http.get(f"{h.url}/admin/stats")).json() for h in rig.emulated.handles
        }


async def test_the_ledger_is_each_pods_engine_model_and_survives_a_restart(
    make_rig: MakeRig,
) -> None:
    """After a cycle the ledger's model of each pod holds on its GPU what the pod reports;
    a controller that resumes from the saved state holds the same, and goes on without
    loading or warming anything again."""
    first: Rig = make_rig()
    await cycle(first.controller)
    ledger = first.controller.state.ledger
    for name, stats in (await _gpu_stats(first)).items():
        model = ledger.pods[PodId(name)]
        assert model.on_gpu() == tuple(stats["gpu"]) and len(model.on_gpu()) == 2
        assert set(model.listed) == set(stats["listed"])
    second: Rig = make_rig(emulated=first.emulated, state=first.state, clock=first.clock)
    await second.controller.resume()
    resumed = second.controller.state.ledger
    assert resumed.to_dict() == ledger.to_dict()
    for pod, model in ledger.pods.items():
        assert resumed.pods[pod].on_gpu() == model.on_gpu()
        assert resumed.pods[pod].in_host() == model.in_host()
    calls = {h.name: dict(h.pod.counters) for h in first.emulated.handles}
    first.clock.advance(300)
    assert await cycle(second.controller) == [TickOutcome.DONE] * 3
    assert {h.name: dict(h.pod.counters) for h in first.emulated.handles} == calls


async def test_event_views_show_the_engine_and_its_next_victim_on_vllm(make_rig: MakeRig) -> None:
    """vLLM: an unloaded adapter leaves the listing but keeps its GPU slot. The views the
    event preloads decide from list it no more, count its slot as taken, and name as the
    next victim the adapter the engine then evicts."""
    from placement.domain import Load, Unload
    from placement.forecast.event_preloads import victim

    rig: Rig = make_rig()
    await cycle(rig.controller)
    c, pod = rig.controller, PodId("pod-0")
    older, newer = c.state.ledger.pods[pod].on_gpu()
    unload = Unload(pod=pod, adapter=AdapterId(newer), reason="test")
    await c.ports.actuator.run((unload,), fleet=c.fleet, ledger=c.state.ledger)
    view = (await c._views())[pod]
    assert newer not in view.registered and older in view.registered
    assert view.hot == (older, "?unloaded-1") and view.pinned == frozenset()
    assert victim(view) == older
    load = Load(pod=pod, adapter=AdapterId("a5"), reason="test")
    await c.ports.actuator.run((load,), fleet=c.fleet, ledger=c.state.ledger)
    stats = (await _gpu_stats(rig))["pod-0"]
    assert (stats["gpu"], stats["ghosts"]) == (["a5"], 1)  # the engine evicted `older`
    assert c.state.ledger.pods[pod].on_gpu() == ("a5",)
