"""The controller's loops under fire: a tick that raises anything at all, an event whose
preloads blow up, a job that hangs, a scheduler that stops, a Prometheus answering NaN,
a saved ledger nested too deeply. Each loop goes on, counts what happened, and a dead
or hung one shows on /healthz; /readyz is 200 only on the healthy leader.

The controller is the composed one (``placement.controller.wiring.build``) with its
ASGI app in-process: a process would add nothing to these checks."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from placement.actuation.executor import ApplyReport, Ledger
from placement.adapters.prom import PromHistorySource
from placement.controller.config import load_controller_config
from placement.controller.ports import Actuator, Job, TickOutcome
from placement.controller.schedule import Schedule
from placement.controller.wiring import build
from placement.domain import Action, AdapterId, Fleet, PodId
from placement.inputs.request_log import RequestLog
from placement.plan import Plan
from placement.ports import StoredState
from placement.solver.planner import Planner
from placement.solver.problem import Demand
from tests.factories import FakeClock
from tests.faults.rig import SECRET, controller_yaml, prepare_workdir

pytestmark = pytest.mark.anyio


class Rig:
    def __init__(self, schedule: Schedule, app: FastAPI, monotonic: FakeClock) -> None:
        self.schedule = schedule
        self.controller = schedule.controller
        self.monotonic = monotonic
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://controller",
        )

    async def metric(self, name: str, **labels: str) -> float:
        text = (await self.http.get("/metrics")).text
        wanted = sorted(f'{k}="{v}"' for k, v in labels.items())
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            if (
                sample.partition("{")[0] == name
                and sorted(filter(None, sample.partition("{")[2].rstrip("}").split(","))) == wanted
            ):
                return float(value)
        return 0.0


@pytest.fixture
async def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Rig]:
    monkeypatch.setenv("LORAFLEET_WEBHOOK_SECRET", SECRET)
    config = load_controller_config(prepare_workdir(tmp_path, config=controller_yaml()))
    monotonic = FakeClock(0.0)
    async with httpx.AsyncClient() as pods:
        schedule, app = build(config, http=pods, monotonic=monotonic)
        rig = Rig(schedule, app, monotonic)
        assert await rig.controller.guarded(Job.LEASE, rig.controller.lease) is TickOutcome.DONE
        yield rig
        await rig.http.aclose()
        if schedule.scheduler.running:
            schedule.scheduler.shutdown(wait=False)
        if rig.controller.ports.elector is not None:
            rig.controller.ports.elector.release()


class Exploding:
    """A planner that raises what no tick expects, then works again."""

    def __init__(self, planner: Planner, errors: list[BaseException]) -> None:
        self._planner = planner
        self.errors = errors

    def __call__(
        self,
        demand: Mapping[AdapterId, Demand],
        *,
        fleet: Fleet,
        valid_from: datetime,
        current: Plan | None,
    ) -> Plan:
        if self.errors:
            raise self.errors.pop(0)
        return self._planner(demand, fleet=fleet, valid_from=valid_from, current=current)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ZeroDivisionError("float division by zero"), id="zero-division"),
        pytest.param(RecursionError("maximum recursion depth exceeded"), id="recursion"),
        pytest.param(KeyError("pod-9"), id="key-error"),
        pytest.param(ValueError("cannot convert float NaN to integer"), id="nan-round"),
    ],
)
async def test_any_exception_from_a_tick_is_logged_counted_and_backed_off(
    rig: Rig, error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    c = rig.controller
    for job, tick in ((Job.INGEST, c.ingest), (Job.FORECAST, c.forecast)):
        assert await rig.schedule._run(job, tick) is TickOutcome.DONE
    c.ports = replace(c.ports, planner=Exploding(c.ports.planner, [error]))
    with caplog.at_level(logging.WARNING):
        assert await rig.schedule._run(Job.PLAN, c.plan_and_apply) is TickOutcome.FAILED
    assert type(error).__name__ in caplog.text
    kind = type(error).__name__
    assert await rig.metric("lorafleet_controller_errors_total", task="plan", error=kind) == 1
    assert c.state.backoff[Job.PLAN].failures == 1
    c.state.backoff[Job.PLAN] = replace(c.state.backoff[Job.PLAN], retry_at_s=0.0)  # due now
    assert await rig.schedule._run(Job.PLAN, c.plan_and_apply) is TickOutcome.DONE
    assert (await rig.http.get("/healthz")).status_code == 200


class BrokenActuator:
    """Pods whose client raises something unexpected mid-run."""

    def __init__(self, actuator: Actuator) -> None:
        self._actuator = actuator

    async def apply(self, plan: Plan, *, fleet: Fleet, ledger: Ledger) -> ApplyReport:
        return await self._actuator.apply(plan, fleet=fleet, ledger=ledger)

    async def run(
        self, actions: tuple[Action, ...], *, fleet: Fleet, ledger: Ledger
    ) -> ApplyReport:
        raise RuntimeError(f"engine client bug on {actions[0].pod}")

    async def registered(self, fleet: Fleet) -> Mapping[PodId, frozenset[AdapterId] | None]:
        return await self._actuator.registered(fleet)


async def test_an_event_whose_preloads_blow_up_is_logged_with_its_pods_and_counted(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    from placement.domain import TenantId
    from placement.forecast.event_preloads import Event, EventKind

    c = rig.controller
    c.ports = replace(c.ports, actuator=BrokenActuator(c.ports.actuator))
    event = Event(
        kind=EventKind.PIPELINE, id="e1", tenant=TenantId("firm-east"), trigger="brief.filed"
    )
    decision = await c.on_event(event)
    assert decision.actions
    with caplog.at_level(logging.WARNING):
        await asyncio.gather(*c._background)  # nothing escapes the task
    assert f"event preloads on {decision.actions[0].pod} failed: RuntimeError" in caplog.text
    assert (
        await rig.metric("lorafleet_controller_errors_total", task="event", error="RuntimeError")
        == 1
    )


async def test_a_hung_job_fails_healthz_until_it_ends(rig: Rig) -> None:
    c = rig.controller
    release = threading.Event()
    entered = threading.Event()

    def hang() -> RequestLog:
        entered.set()
        release.wait(timeout=60)
        raise TimeoutError("the history source never answered")

    c.ports = replace(c.ports, history=hang)
    running = asyncio.create_task(rig.schedule._run(Job.INGEST, c.ingest))
    assert await asyncio.to_thread(entered.wait, 30)
    assert (await rig.http.get("/healthz")).status_code == 200
    rig.monotonic.advance(c.settings.controller.job_stall_s + 1)
    hung = await rig.http.get("/healthz")
    assert hung.status_code == 503
    assert hung.json()["problems"] == ["job ingest has run for 1801 s (stuck past 1800 s)"]
    ready = await rig.http.get("/readyz")
    assert (ready.status_code, ready.json()["reason"]) == (503, "unhealthy")
    release.set()
    assert await running is TickOutcome.FAILED
    assert (await rig.http.get("/healthz")).status_code == 200


async def test_a_stopped_scheduler_or_a_lost_job_fails_healthz(rig: Rig) -> None:
    scheduler = rig.schedule.scheduler
    scheduler.start(paused=True)
    rig.schedule.started = True
    assert (await rig.http.get("/healthz")).json() == {"status": "ok", "problems": []}
    assert (await rig.http.get("/readyz")).status_code == 200  # the leader, healthy
    scheduler.remove_job(Job.WATCHDOG.value)
    assert (await rig.http.get("/healthz")).json()["problems"] == [
        "job watchdog is no longer scheduled"
    ]
    scheduler.shutdown(wait=False)
    await asyncio.sleep(0)  # the asyncio scheduler stops on the loop
    problems = (await rig.http.get("/healthz")).json()["problems"]
    assert "the scheduler stopped" in problems


async def test_the_standby_is_not_ready(rig: Rig) -> None:
    rig.schedule.scheduler.start(paused=True)
    rig.schedule.started = True
    elector = rig.controller.ports.elector
    assert elector is not None
    assert (await rig.http.get("/readyz")).status_code == 200
    elector.release()  # another replica may take the lock now: this one stands by
    standby = await rig.http.get("/readyz")
    assert standby.status_code == 503
    assert standby.json()["leader"] is False
    assert (await rig.http.get("/healthz")).status_code == 200


async def test_a_saved_ledger_nested_too_deeply_starts_empty(rig: Rig) -> None:
    c = rig.controller
    c.ports.state.save(StoredState(plan_json=None, ledger_json="[" * 100_000 + "]" * 100_000))
    await c.resume()  # no RecursionError: an empty ledger, reconcile sees what pods hold
    assert c.state.ledger.to_dict() == type(c.state.ledger)().to_dict()


def test_prometheus_answering_nan_leaves_those_samples_out() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        values = [[1_699_999_800 + 600 * i, v] for i, v in enumerate(["1", "NaN", "5", "+Inf"])]
        series = [
            {"metric": {"adapter": "legal"}, "values": values},
            {"metric": {"adapter": ""}, "values": values},
            {"metric": {"adapter": "\ud800bad"}, "values": values},
        ]
        body = {"status": "success", "data": {"resultType": "matrix", "result": series}}
        return httpx.Response(200, content=json.dumps(body).encode())

    from datetime import UTC, datetime

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        source = PromHistorySource("http://prometheus", client=client)
        log = source.request_log(
            start=datetime.fromtimestamp(1_699_999_800, UTC),
            end=datetime.fromtimestamp(1_699_999_800 + 2400, UTC),
            bucket_s=600,
        )
    assert set(log.frame["adapter"]) == {"legal"}
    assert log.frame["requests"].sum() == 4  # 1 -> 5 across the NaN; the +Inf left out
