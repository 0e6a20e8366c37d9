"""The router's background loops under attack, in-process: a ``Router`` on emulated
pods reached through their in-process transport, its loops sleeping on a ``Ticker``
(each round runs when the test ticks) and its timer a ``FakeClock``; nothing waits
for the wall clock. A process would add nothing here; ``test_router_faults.py`` has
the loops of a real process (a pod answering NaN).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace

import httpx
import pytest
from prometheus_client import CollectorRegistry

from placement.emulator import EmulatedFleet
from placement.errors import PlanError
from placement.plan import Plan
from placement.router import FleetPodSource, Router, RouterApp
from placement.router.reqlog import LogRow, RequestLogSink
from placement.router.sources import StaticPlanSource
from tests.factories import FakeClock
from tests.router.conftest import MANUAL, Ticker, plan_of

pytestmark = pytest.mark.anyio

#: The loops every router runs.
LOOPS = 4
SETTINGS = replace(
    MANUAL.router,
    scrape_interval_s=0.25,
    plan_poll_s=1.0,
    pods_poll_s=10.0,
    log_flush_s=1.0,
    loop_backoff_max_s=4.0,
    loop_stall_s=300.0,
)


class Escape(BaseException):
    """What no ``except Exception`` catches (as ``GeneratorExit`` or a C extension's
    ``BaseException``): the one way left for a loop to end."""


class ScriptedPlans:
    """A plan source that raises each of ``script`` in turn, then serves ``plan``."""

    description = "scripted plans"

    def __init__(self, script: Sequence[BaseException], plan: Plan) -> None:
        self.script = list(script)
        self.plan = plan
        self.hang: asyncio.Event | None = None
        self._sent = False

    async def poll(self) -> Plan | None:
        if self.hang is not None:
            await self.hang.wait()
        if self.script:
            raise self.script.pop(0)
        if self._sent:
            return None
        self._sent = True
        return self.plan


class RaisingTransport(httpx.AsyncBaseTransport):
    """The fleet's in-process transport, except that requests to ``broken`` pods raise
    ``error`` (what no HTTP client raises: a fault of ours, or of a library's)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, error: Exception) -> None:
        self.inner, self.error = inner, error
        self.broken: set[str] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.netloc.decode() in self.broken:
            raise self.error
        return await self.inner.handle_async_request(request)


class BrokenSink:
    """A request-log sink whose writes raise; it notes that it was closed."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, rows: Sequence[LogRow]) -> None:
        raise RuntimeError("the sink broke")

    def close(self) -> None:
        self.closed = True


@asynccontextmanager
async def running(
    *,
    plan_source: ScriptedPlans | StaticPlanSource | None = None,
    transport: RaisingTransport | None = None,
    fleet: EmulatedFleet | None = None,
    sink: RequestLogSink | None = None,
    timer: FakeClock | None = None,
) -> AsyncIterator[tuple[Router, Ticker, CollectorRegistry]]:
    fleet = fleet or EmulatedFleet.start(2)
    ticker = Ticker()
    registry = CollectorRegistry()
    async with httpx.AsyncClient(transport=transport or fleet.transport()) as engine_http:
        router = Router(
            plan_source=plan_source or StaticPlanSource(plan_of({"alpha": ["pod-0"]})),
            pod_source=FleetPodSource(fleet.domain()),
            engine_http=engine_http,
            clock=FakeClock(),
            timer=timer or FakeClock(),
            settings=SETTINGS,
            registry=registry,
            request_log=sink,
            plan_expected=True,
            sleep=ticker.sleep,
        )
        await router.start()
        try:
            yield router, ticker, registry
        finally:
            await router.stop()


async def _get(router: Router, path: str) -> httpx.Response:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=RouterApp(router)), base_url="http://router"
    ) as client:
        return await client.get(path)


ERRORS = [
    ZeroDivisionError("division by zero"),
    RecursionError("maximum recursion depth exceeded"),
    KeyError("pods"),
    ValueError("cannot convert float NaN to integer"),
]


async def test_any_exception_from_a_round_is_logged_counted_and_backed_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="lorafleet.router")
    plans = ScriptedPlans(ERRORS, plan_of({"alpha": ["pod-0"]}, plan_id="fixed"))
    async with running(plan_source=plans) as (router, ticker, registry):
        # The first poll (at start) raised: the router runs, by hashing, not ready.
        assert router.topology.plan is None
        assert "ZeroDivisionError" in (router.plan_error or "")
        assert (await _get(router, "/readyz")).status_code == 503
        for _ in ERRORS:
            await ticker.tick(LOOPS)
        plan_loop = router.supervisor.loops["plan"]
        assert router.topology.plan is not None and router.topology.plan.id == "fixed"
        assert (plan_loop.failures, plan_loop.errors) == (0, 4)
        # Waits of the plan loop: 1 s doubled per failure in a row, at most 4 s; then 1 s.
        assert ticker.delays["plan"][:5] == [2.0, 4.0, 4.0, 4.0, 1.0]
        health = (await _get(router, "/healthz")).json()
        assert health["status"] == "ok" and health["plan_problem"] is None
        assert (await _get(router, "/readyz")).status_code == 200
    for error in ERRORS:
        name = type(error).__name__
        sample = {"loop": "plan", "error": name}
        assert registry.get_sample_value("lorafleet_router_loop_errors_total", sample) == 1.0
        assert any(
            "plan loop (plan source scripted plans)" in r.getMessage() and name in r.getMessage()
            for r in caplog.records
        ), name


async def test_the_plan_problem_names_an_unexpected_error_until_a_good_plan_comes() -> None:
    plans = ScriptedPlans([PlanError("plan.json: NaN is not a number")], plan_of({}))
    plans.script.append(RecursionError("maximum recursion depth exceeded"))
    async with running(plan_source=plans) as (router, ticker, _):
        assert (await _get(router, "/healthz")).json()["plan_problem"] == (
            "plan.json: NaN is not a number"
        )
        await ticker.tick(LOOPS)
        problem = (await _get(router, "/healthz")).json()["plan_problem"]
        assert problem == "scripted plans: RecursionError: maximum recursion depth exceeded"
        await ticker.tick(LOOPS)
        assert (await _get(router, "/healthz")).json()["plan_problem"] is None


async def test_a_pod_whose_scrape_raises_anything_is_out_alone_and_comes_back() -> None:
    fleet = EmulatedFleet.start(2)
    transport = RaisingTransport(fleet.transport(), RuntimeError("a bug in a parser"))
    async with running(fleet=fleet, transport=transport) as (router, ticker, registry):
        transport.broken.add(httpx.URL(fleet.handles[1].url).netloc.decode())
        await ticker.tick(LOOPS)
        healthy = {pod: state.healthy for pod, state in router.topology.pods.items()}
        assert healthy == {"pod-0": True, "pod-1": False}
        sample = {"loop": "scrape", "error": "RuntimeError"}
        assert (registry.get_sample_value("lorafleet_router_loop_errors_total", sample) or 0) >= 1
        assert router.supervisor.loops["scrape"].failures == 0  # the round itself went on
        transport.broken.clear()
        await ticker.tick(LOOPS)
        assert all(state.healthy for state in router.topology.pods.values())


async def test_a_loop_that_ends_fails_healthz_and_readiness() -> None:
    plans = ScriptedPlans([], plan_of({"alpha": ["pod-0"]}))
    async with running(plan_source=plans) as (router, ticker, _):
        assert (await _get(router, "/healthz")).status_code == 200
        plans.script.append(Escape("out of the loop"))
        await ticker.tick(LOOPS - 1)  # the plan loop does not sleep again: it ended
        health = await _get(router, "/healthz")
        assert health.status_code == 503
        assert health.json()["problems"] == ["the plan loop stopped: Escape: out of the loop"]
        ready = await _get(router, "/readyz")
        assert ready.status_code == 503
        assert "the plan loop stopped" in ready.json()["reasons"][0]


async def test_a_round_stuck_past_its_bound_fails_healthz_until_it_ends() -> None:
    timer = FakeClock()
    plans = ScriptedPlans([], plan_of({"alpha": ["pod-0"]}))
    async with running(plan_source=plans, timer=timer) as (router, ticker, _):
        plans.hang = asyncio.Event()
        await ticker.tick(LOOPS - 1)  # the plan loop is in its round, hanging
        timer.advance(301.0)
        health = await _get(router, "/healthz")
        assert health.status_code == 503
        assert (
            "the plan loop has run one round for 301 s (stuck past 300 s)"
            in (health.json()["problems"])
        )
        plans.hang.set()
        await ticker.settle(LOOPS)
        assert (await _get(router, "/healthz")).status_code == 200


async def test_stop_closes_the_log_whatever_the_flush_and_the_loops_raised() -> None:
    sink = BrokenSink()
    plans = ScriptedPlans([], plan_of({"alpha": ["pod-0"]}))
    async with running(plan_source=plans, sink=sink) as (router, ticker, registry):
        row = LogRow(1.7e9, "alpha", None, None, None, "pod-0", "gpu_hit", 1.0, 200)
        router.request_log.append(row)
        await ticker.tick(LOOPS)  # the flush raises: counted, the loop goes on
        assert router.supervisor.loops["log"].failures == 1
        plans.script.append(Escape("the plan loop ends"))
        await ticker.tick(LOOPS - 1)
        router.request_log.append(row)
    assert sink.closed
    dropped = registry.get_sample_value(
        "lorafleet_router_log_rows_dropped_total", {"reason": "write_error"}
    )
    assert dropped == 2.0
