"""Two controllers never both write: a leader deposed mid-solve, one paused past its
lease (SIGSTOP), one killed (SIGKILL), on one fake Kubernetes API server or one state
directory. Writes are told apart by the client name each controller puts before the
API path (``tests.controller.controller_kubefake``)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

import pytest
from kubernetes import client

from placement.adapters.kube import (
    KubeHotSets,
    KubeLeaseStore,
    KubePlanStore,
    KubeStateStore,
    KubeTarget,
    claim_all,
    connect,
)
from placement.adapters.kube_configmaps import TERM_ANNOTATION
from placement.adapters.statedir import DirLock
from placement.controller.leader import LeaderElector
from placement.controller.live_ports import EngineActuator, SeasonalForecaster
from placement.controller.ports import ControllerPorts, Job, TickOutcome
from placement.controller.ticks import Controller
from placement.domain import AdapterId, Fleet, Pipelines
from placement.emulator import ZERO_LATENCY, EmulatedFleet, PodConfig
from placement.errors import KubeConflictError, LeadershipLostError
from placement.forecast.event_preloads import pipeline_predictor
from placement.plan import Plan
from placement.settings import ControllerSettings, ExecutorSettings, Settings
from placement.solver.problem import Demand
from tests.controller.controller_kubefake import Call, FakeApiServer, make_pod
from tests.factories import T0, FakeClock, make_plan
from tests.faults.rig import (
    ControllerProcess,
    controller_yaml,
    prepare_workdir,
    start_controller,
    wait_for,
)

SETTINGS = Settings(
    executor=ExecutorSettings(per_action_deadline_s=5.0, max_attempts=1, backoff_base_s=0.0),
    controller=ControllerSettings(),  # lease 15 s, renew deadline 10 s, API timeout 5 s
)
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


def writes_by(fake: FakeApiServer, who: str, *, since: int = 0) -> list[Call]:
    return [c for c in fake.calls[since:] if c.who == who and c.method in WRITES]


def landed(calls: list[Call]) -> list[tuple[str, str, int | None]]:
    """The writes the server did not refuse (a 409 Conflict is a write that failed)."""
    return [(c.method, c.path, c.code) for c in calls if c.code is None or c.code < 300]


def first_write_index(fake: FakeApiServer, who: str, kind: str = "configmaps") -> int | None:
    for index, c in enumerate(fake.calls):
        if c.who == who and c.method in WRITES and f"/{kind}" in c.path:
            return index
    return None


def claimed_index(fake: FakeApiServer, who: str) -> int | None:
    """The index of the call by which ``who`` had written each of the controller's
    three ConfigMaps once (its claim on taking the lease); None before that."""
    names = {"lorafleet-plan", "lorafleet-state", "lorafleet-hot-sets"}
    for index, c in enumerate(fake.calls):
        if c.who == who and c.method in WRITES and "/configmaps" in c.path:
            names.discard(c.path.rsplit("/", 1)[-1])
            if not names:
                return index
    return None


# --- in-process: a solve that outlives the lease ---------------------------------------


class GatedPlanner:
    """Plans at once until ``hold`` is set; then blocks in the solve until released."""

    def __init__(self) -> None:
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(
        self,
        demand: Mapping[AdapterId, Demand],
        *,
        fleet: Fleet,
        valid_from: datetime,
        current: Plan | None,
    ) -> Plan:
        if self.hold:
            self.entered.set()
            self.release.wait(timeout=60)
        return make_plan(plan_id=f"plan-{valid_from:%H%M%S}-{len(fleet.pods)}")


@dataclass
class Replica:
    name: str
    controller: Controller
    planner: GatedPlanner
    api: client.ApiClient

    async def tick(self, job: Job) -> TickOutcome:
        c = self.controller
        run = {
            Job.LEASE: c.lease,
            Job.INGEST: c.ingest,
            Job.FORECAST: c.forecast,
            Job.PLAN: c.plan_and_apply,
        }[job]
        return await c.guarded(job, run)


#: The ``replicas`` fixture: makes a replica by name; the clock they share.
Replicas = tuple[Callable[[str], Replica], FakeClock]


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.stop()


@pytest.fixture
async def replicas(fake: FakeApiServer) -> AsyncIterator[Replicas]:
    from tests.controller.test_controller_ticks import catalog, history

    clock = FakeClock(T0.replace(hour=8).timestamp())
    emulated = EmulatedFleet.start(
        2, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    )
    http = emulated.http()
    target = KubeTarget(namespace="lf", request_timeout_s=5.0)
    made: list[Replica] = []

    def replica(name: str) -> Replica:
        api = connect(host=f"{fake.url}/{name}")
        elector = LeaderElector(
            KubeLeaseStore(api, target=target),
            identity=name,
            duration_s=15,
            renew_deadline_s=10,
            clock=clock,
            wall=clock.wall,
        )
        cat = catalog()
        log = history(clock.wall())
        planner = GatedPlanner()
        plans = KubePlanStore(api, target=target, term=elector.term)
        state = KubeStateStore(api, target=target, term=elector.term)
        hot_sets = KubeHotSets(api, target=target, term=elector.term)
        ports = ControllerPorts(
            catalog=cat,
            fleet=emulated.domain(pool="llama"),
            history=lambda: log,
            forecaster=SeasonalForecaster(bucket_s=SETTINGS.forecast.bucket_s, days=3),
            planner=planner,
            actuator=EngineActuator(
                catalog=cat, http=http, settings=SETTINGS, rng=random.Random(0)
            ),
            plans=plans,
            state=state,
            hot_sets=hot_sets,
            predictor=pipeline_predictor(Pipelines(), cat),
            elector=elector,
            claim=partial(claim_all, plans, state, hot_sets),
        )
        made.append(Replica(name, Controller(ports, settings=SETTINGS, clock=clock), planner, api))
        return made[-1]

    yield replica, clock
    for r in made:
        r.planner.release.set()
        r.api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated
    await http.aclose()


async def _deposed_mid_solve(
    fake: FakeApiServer, replicas: Replicas
) -> tuple[Replica, Replica, asyncio.Task[TickOutcome], int]:
    """a leads and starts a solve that blocks; the clock passes its lease; b takes over
    and publishes. Returns a, b, a's plan tick (still running) and b's first write."""
    replica, clock = replicas
    a, b = replica("a"), replica("b")
    assert await a.tick(Job.LEASE) is TickOutcome.DONE
    assert await b.tick(Job.LEASE) is TickOutcome.STANDBY
    assert [await a.tick(j) for j in (Job.INGEST, Job.FORECAST)] == [TickOutcome.DONE] * 2
    a.planner.hold = True
    solving = asyncio.create_task(a.tick(Job.PLAN))
    assert await asyncio.to_thread(a.planner.entered.wait, 30)
    clock.advance(16)  # a's renewals stopped (it is stuck in the solve): past its lease
    assert await b.tick(Job.LEASE) is TickOutcome.DONE
    assert [await b.tick(j) for j in (Job.INGEST, Job.FORECAST, Job.PLAN)] == [TickOutcome.DONE] * 3
    first_b = first_write_index(fake, "b")
    assert first_b is not None
    return a, b, solving, first_b


@pytest.mark.anyio
async def test_a_leader_deposed_mid_solve_publishes_nothing(
    fake: FakeApiServer, replicas: Replicas
) -> None:
    a, b, solving, first_b = await _deposed_mid_solve(fake, replicas)
    published = b.controller.state.plan
    a.planner.release.set()  # the solve ends; the lease is long gone
    assert await solving is TickOutcome.STANDBY
    assert a.controller.state.plan is None  # never applied, never in force
    assert writes_by(fake, "a", since=first_b) == []
    stored = KubePlanStore(b.api, target=KubeTarget(namespace="lf")).current()
    assert stored == published


@pytest.mark.anyio
async def test_a_lease_tick_that_finds_the_lease_lost_stops_the_solve(
    fake: FakeApiServer, replicas: Replicas
) -> None:
    a, _, solving, first_b = await _deposed_mid_solve(fake, replicas)
    assert await a.tick(Job.LEASE) is TickOutcome.STANDBY  # sees b's lease: stops its jobs
    assert await asyncio.wait_for(solving, timeout=30) is TickOutcome.STANDBY
    assert not a.planner.release.is_set()  # stopped while the solve was still running
    assert writes_by(fake, "a", since=first_b) == []


@pytest.mark.anyio
async def test_a_write_sent_after_a_pause_is_refused_once_the_successor_took_over(
    fake: FakeApiServer, replicas: Replicas
) -> None:
    """a passes its checks and reads the state, then freezes before its write lands; b
    takes over (and has not saved its own state yet) before a wakes up."""
    replica, clock = replicas
    a, b = replica("a"), replica("b")
    assert await a.tick(Job.LEASE) is TickOutcome.DONE
    assert await b.tick(Job.LEASE) is TickOutcome.STANDBY
    assert [await a.tick(j) for j in (Job.INGEST, Job.FORECAST, Job.PLAN)] == [TickOutcome.DONE] * 3
    frozen = fake.hold("PUT", "configmaps", who="a")
    saving = asyncio.create_task(a.controller.persist())
    assert await asyncio.to_thread(frozen.arrived.wait, 30)
    clock.advance(16)
    assert await b.tick(Job.LEASE) is TickOutcome.DONE
    frozen.release.set()  # a wakes up: its write goes out with what it read before
    with pytest.raises(KubeConflictError):
        await saving
    late = writes_by(fake, "a")[-1]
    assert (late.path.rsplit("/", 1)[-1], late.code) == ("lorafleet-state", 409)
    stored = fake.get("configmaps", "lorafleet-state")
    assert stored is not None
    elector = b.controller.ports.elector
    assert elector is not None
    assert float(stored["metadata"]["annotations"][TERM_ANNOTATION]) == elector.term()


@pytest.mark.anyio
async def test_a_claim_that_fails_is_tried_again_without_failing_the_lease(
    fake: FakeApiServer, replicas: Replicas
) -> None:
    replica, _ = replicas
    a = replica("a")
    assert await a.tick(Job.LEASE) is TickOutcome.DONE
    assert [await a.tick(j) for j in (Job.INGEST, Job.FORECAST, Job.PLAN)] == [TickOutcome.DONE] * 3
    a.controller.state.claimed = False  # as after taking the lease over
    fake.inject("PUT", "configmaps", 500)
    assert await a.tick(Job.LEASE) is TickOutcome.DONE  # the renewal is not held up
    assert not a.controller.state.claimed
    assert await a.tick(Job.LEASE) is TickOutcome.DONE
    assert a.controller.state.claimed


def test_a_write_from_an_earlier_term_never_overwrites_a_later_one(
    fake: FakeApiServer,
) -> None:
    api = connect(host=fake.url)
    target = KubeTarget(namespace="lf")
    try:
        later = KubePlanStore(api, target=target, term=lambda: 2000.0)
        earlier = KubePlanStore(api, target=target, term=lambda: 1000.0)
        deposed = KubePlanStore(api, target=target, term=lambda: None)
        earlier.publish(make_plan(plan_id="from-the-first-leader"))
        later.publish(make_plan(plan_id="from-the-second-leader"))
        for store in (earlier, deposed):  # woke up from a pause, or knows it lost
            with pytest.raises(LeadershipLostError):
                store.publish(make_plan(plan_id="stale"))
        current = later.current()
        assert current is not None and current.id == "from-the-second-leader"
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated


def test_the_state_directory_lock_admits_one_replica(tmp_path: Path) -> None:
    a, b = DirLock(tmp_path, identity="a"), DirLock(tmp_path, identity="b")
    try:
        assert (a.tick(), b.tick()) == (True, False)
        a.fence(margin_s=5.0)
        with pytest.raises(LeadershipLostError):
            b.fence(margin_s=5.0)
        (tmp_path / "controller.lock").unlink()  # someone removed the lock file
        assert a.is_leader() is False
        with pytest.raises(LeadershipLostError):
            a.fence(margin_s=5.0)
        assert b.tick() is True
    finally:
        a.release()
        b.release()


# --- processes ----------------------------------------------------------------------------


def _plan_generation(state: Path) -> str | None:
    link = state / "current"
    return os.readlink(link) if link.is_symlink() else None


@pytest.mark.slow
def test_two_processes_on_one_state_directory_one_acts_until_it_is_killed(
    tmp_path: Path, controllers: list[ControllerProcess]
) -> None:
    config = prepare_workdir(tmp_path, config=controller_yaml(state_dir=str(tmp_path / "state")))
    first = start_controller(config)
    controllers.append(first)
    wait_for(lambda: first.get("/readyz").status_code == 200, timeout_s=60, what="a leader")
    second = start_controller(config)
    controllers.append(second)
    wait_for(
        lambda: second.metric("lorafleet_controller_ticks_total", job="plan", outcome="standby"),
        timeout_s=60,
        what="the standby's plan tick",
    )
    wait_for(lambda: _plan_generation(tmp_path / "state"), timeout_s=90, what="a first plan")
    standby = second.get("/readyz")
    assert standby.status_code == 503
    assert standby.json()["reason"] == "standby: the leader takes the webhooks"
    assert second.metric("lorafleet_controller_ticks_total", job="plan", outcome="done") == 0
    assert second.get("/healthz").status_code == 200  # a healthy standby

    first.signal(signal.SIGKILL)  # the kernel drops its lock
    first.process.wait(timeout=30)
    before = _plan_generation(tmp_path / "state")
    wait_for(lambda: second.get("/readyz").status_code == 200, timeout_s=60, what="takeover")
    wait_for(
        lambda: _plan_generation(tmp_path / "state") != before,
        timeout_s=90,
        what="a plan from the new leader",
    )
    # The tick counts itself after it has written the plan: wait for the count too.
    wait_for(
        lambda: second.metric("lorafleet_controller_ticks_total", job="plan", outcome="done") >= 1,
        timeout_s=60,
        what="the new leader's plan tick counted",
    )


def _kube_config(fake: FakeApiServer, name: str) -> str:
    fast_lease = (
        "lease_duration_s: 3\nlease_renew_deadline_s: 2\nlease_retry_period_s: 0.5\n"
        "api_timeout_s: 1\nforecast_model: same-hour\n"
        f"identity: {name}\n"
        f"kubernetes: {{namespace: lf, api_host: '{fake.url}/{name}'}}\n"
    )
    return controller_yaml(extra=fast_lease).replace("state_dir: state\n", "")


def _holder(fake: FakeApiServer) -> str | None:
    lease = fake.get("leases", "lorafleet-controller")
    return lease["spec"].get("holderIdentity") if lease is not None else None


@pytest.mark.slow
def test_a_leader_paused_past_its_lease_never_writes_after_the_takeover(
    tmp_path: Path, fake: FakeApiServer, controllers: list[ControllerProcess]
) -> None:
    for i in range(2):  # refused connections: the pods' loads fail fast
        fake.put("pods", make_pod(f"pod-{i}", ip="127.0.0.1", port=1, pool="llama-70b"))
    a = start_controller(prepare_workdir(tmp_path / "a", config=_kube_config(fake, "a")))
    controllers.append(a)
    wait_for(lambda: _holder(fake) == "a", timeout_s=60, what="a to lead")
    b = start_controller(prepare_workdir(tmp_path / "b", config=_kube_config(fake, "b")))
    controllers.append(b)
    wait_for(lambda: first_write_index(fake, "a"), timeout_s=90, what="a's first plan")

    # a hangs: no renewals, but it still thinks it leads. It may be stopped anywhere,
    # between its checks and a write too: that write is sent when it wakes up.
    a.signal(signal.SIGSTOP)
    wait_for(lambda: _holder(fake) == "b", timeout_s=60, what="b to take over")
    taken = wait_for(lambda: claimed_index(fake, "b"), timeout_s=90, what="b's claim")
    a.signal(signal.SIGCONT)
    wait_for(
        lambda: a.get("/readyz").json().get("leader") is False, timeout_s=30, what="a to notice"
    )
    seen = len(fake.calls)
    wait_for(  # b writes again after a woke up: a had time to misbehave
        lambda: any(c.who == "b" and c.method in WRITES for c in fake.calls[seen:]),
        timeout_s=60,
        what="b's next write",
    )
    late = writes_by(fake, "a", since=taken)
    assert landed(late) == []  # the write it was frozen in, if any, was refused
    assert a.get("/readyz").status_code == 503
    assert b.get("/readyz").status_code == 200
