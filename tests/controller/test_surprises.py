"""Surprises without a restart, at the ticks: an adapter the catalog lacks shows up in
the traffic, the catalog file is edited, an edit is broken. Emulated pods at the wire,
in-memory cluster twins, a fake clock, the greedy planner over the catalog in force."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from placement.adapters.kube_memory import MemoryHotSets, MemoryPlanStore, MemoryStateStore
from placement.controller.live_ports import EngineActuator, SeasonalForecaster
from placement.controller.ports import (
    CatalogBound,
    ControllerObserver,
    ControllerPorts,
    Job,
    TickOutcome,
)
from placement.controller.ticks import Controller
from placement.domain import AdapterClass, AdapterId, Catalog, Pipelines, Tier
from placement.emulator import ZERO_LATENCY, EmulatedFleet, PodConfig
from placement.forecast.event_preloads import pipeline_predictor
from placement.inputs.catalog import CatalogFile
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.settings import ControllerSettings, ExecutorSettings, InputSettings, Settings
from placement.solver.planner import GreedyPlanner
from tests.factories import T0, FakeClock

pytestmark = pytest.mark.anyio

TEMPLATE = "s3://adapters/{name}"
SETTINGS = Settings(
    executor=ExecutorSettings(per_action_deadline_s=5.0, max_attempts=2, backoff_base_s=0.0),
    controller=ControllerSettings(backoff_base_s=30.0, backoff_max_s=240.0),
)


def entry(name: str, *, rank: object = 8) -> str:
    return (
        f"- name: {name}\n  base_model: base-model\n  rank: {rank}\n"
        f"  size_bytes: 1000000\n  source: s3://adapters/{name}\n"
    )


def traffic(now: datetime, rates: dict[str, int], *, days: int = 3) -> RequestLog:
    """``rates[name]`` requests every two minutes, for two hours from this moment on
    each of the last ``days`` days (what the same-hour forecaster reads)."""
    rows = [
        (now - timedelta(days=day) + timedelta(minutes=minute), name, count)
        for day in range(1, days + 1)
        for minute in range(0, 120, 2)
        for name, count in rates.items()
    ]
    frame = pd.DataFrame(rows, columns=["ts", "adapter", "requests"])
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return request_log_from_frame(frame, source="test")


@dataclass
class Errors(ControllerObserver):
    """The errors the ticks report, by task."""

    seen: list[tuple[str, str]] = field(default_factory=list)

    def error(self, task: str, exc: BaseException) -> None:
        self.seen.append((task, str(exc)))


@dataclass
class Rig:
    controller: Controller
    emulated: EmulatedFleet
    catalog_path: Path
    errors: Errors
    rates: dict[str, int]

    async def cycle(self) -> list[TickOutcome]:
        c = self.controller
        return [
            await c.guarded(Job.INGEST, c.ingest),
            await c.guarded(Job.FORECAST, c.forecast),
            await c.guarded(Job.PLAN, c.plan_and_apply),
        ]

    def hot(self) -> set[str]:
        plan = self.controller.state.plan
        assert plan is not None
        return {str(a) for a, entry in plan.adapters.items() if entry.tier is Tier.HOT}

    def placed(self, name: str) -> bool:
        """Whether the plan puts ``name`` on a pod (hot or warm)."""
        plan = self.controller.state.plan
        assert plan is not None
        return plan.tier_of(AdapterId(name)) is not Tier.COLD

    def listed(self) -> dict[str, str]:
        """Each name the pods list, with the path it was loaded from."""
        return {
            name: adapter_file.path
            for handle in self.emulated.handles
            for name, adapter_file in handle.pod.listed.items()
        }


@pytest.fixture
async def make_rig(tmp_path: Path) -> AsyncIterator[Callable[..., Rig]]:
    clients = []

    def build(*, template: str | None = TEMPLATE, catalog_text: str = "") -> Rig:
        emulated = EmulatedFleet.start(
            2, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
        )
        http = emulated.http()
        clients.append(http)
        clock = FakeClock(T0.timestamp())
        settings = replace(
            SETTINGS, inputs=InputSettings(adapter_source_template=template, unannounced_rank=8)
        )
        fleet = emulated.domain(pool="llama")
        path = tmp_path / "catalog.yaml"
        path.write_text("adapters:\n" + (catalog_text or entry("a0") + entry("a1")))
        source = CatalogFile(path, fleet=fleet, rules=settings.inputs)
        first = source.poll()
        assert first is not None

        def bound(catalog: Catalog) -> CatalogBound:
            return CatalogBound(
                forecaster=SeasonalForecaster(bucket_s=settings.forecast.bucket_s, days=3),
                planner=GreedyPlanner(catalog, settings=settings, clock=clock),
                actuator=EngineActuator(
                    catalog=catalog, http=http, settings=settings, rng=random.Random(0)
                ),
                predictor=pipeline_predictor(Pipelines(), catalog),
            )

        start = bound(first)
        rates = {"a0": 6, "a1": 3}
        ports = ControllerPorts(
            catalog=first,
            fleet=fleet,
            history=lambda: traffic(clock.wall(), rates),
            forecaster=start.forecaster,
            planner=start.planner,
            actuator=start.actuator,
            plans=MemoryPlanStore(),
            state=MemoryStateStore(),
            predictor=start.predictor,
            hot_sets=MemoryHotSets(),
            catalog_file=source,
            rebind=bound,
        )
        errors = Errors()
        controller = Controller(ports, settings=settings, clock=clock, metrics=errors)
        return Rig(controller, emulated, path, errors, rates)

    yield build
    for http in clients:
        await http.aclose()


async def test_an_adapter_new_in_traffic_is_planned_and_loaded_from_the_template(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    assert await rig.cycle() == [TickOutcome.DONE] * 3
    assert "ab-variant-7" not in rig.listed()
    rig.rates["ab-variant-7"] = 9  # the unannounced A/B variant, busiest of all
    assert await rig.cycle() == [TickOutcome.DONE] * 3
    entry = rig.controller.ports.catalog.by_name()[AdapterId("ab-variant-7")]
    assert entry.adapter_class is AdapterClass.EXPERIMENT
    assert (entry.rank, entry.size_bytes) == (8, InputSettings().unannounced_size_bytes)
    # Planned on a pod (an experiment: the production adapters keep the GPU slots
    # first) and registered there from the template's source.
    assert rig.placed("ab-variant-7")
    assert rig.listed()["ab-variant-7"] == "s3://adapters/ab-variant-7"
    assert rig.errors.seen == []


async def test_without_a_template_a_new_adapter_stays_unplanned(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(template=None)
    rig.rates["ab-variant-7"] = 9
    assert await rig.cycle() == [TickOutcome.DONE] * 3
    assert not rig.placed("ab-variant-7") and "ab-variant-7" not in rig.listed()
    assert rig.controller.state.unplanned == {"ab-variant-7"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("AB_Variant", id="not-a-dns-label"),
        pytest.param("x/../../etc/passwd", id="path"),
        pytest.param("x" * 64, id="too-long"),
    ],
)
async def test_a_name_no_source_can_be_made_from_stays_unplanned(
    make_rig: Callable[..., Rig], name: str
) -> None:
    rig = make_rig()
    rig.rates[name] = 9
    assert await rig.cycle() == [TickOutcome.DONE] * 3
    assert AdapterId(name) not in rig.controller.ports.catalog.names()
    assert rig.controller.state.unplanned == {name}
    assert name not in rig.listed()


async def test_base_model_requests_are_not_adapters(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig()
    rig.rates["base-model"] = 9
    assert await rig.cycle() == [TickOutcome.DONE] * 3
    assert "base-model" not in rig.controller.ports.catalog.names()
    assert rig.controller.state.unplanned == frozenset()


async def test_a_catalog_edit_is_picked_up_at_the_next_ingest(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig(template=None)
    rig.rates["new-one"] = 9
    await rig.cycle()
    assert not rig.placed("new-one")
    rig.catalog_path.write_text("adapters:\n" + entry("a0") + entry("a1") + entry("new-one"))
    assert await rig.cycle() == [TickOutcome.DONE] * 3
    assert rig.controller.ports.catalog.by_name()[AdapterId("new-one")].adapter_class is (
        AdapterClass.PRODUCTION
    )
    assert "new-one" in rig.hot() and "new-one" in rig.listed()  # production: a GPU slot
    assert rig.controller.state.unplanned == frozenset()


async def test_a_broken_catalog_edit_is_refused_and_the_last_good_one_kept(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    await rig.cycle()
    good = rig.controller.ports.catalog
    rig.catalog_path.write_text("adapters:\n" + entry("a0", rank="sixteen") + entry("a1"))
    for _ in range(2):  # refused once, counted once: the file did not change again
        assert await rig.cycle() == [TickOutcome.DONE] * 3
    assert rig.controller.ports.catalog == good
    [(task, message)] = rig.errors.seen
    assert task == "catalog"
    assert str(rig.catalog_path) in message and "adapter a0: rank" in message
    rig.catalog_path.write_text("adapters:\n" + entry("a0") + entry("a1") + "- name: [\n")
    await rig.cycle()
    assert "line 13" in rig.errors.seen[-1][1]  # a YAML error names its line
    rig.catalog_path.write_text("adapters:\n" + entry("a1"))  # fixed: a0 retired
    await rig.cycle()
    assert rig.controller.state.catalog_problem is None
    # a0 still has traffic: the template serves it now, as an experiment.
    classes = {a.name: a.adapter_class for a in rig.controller.ports.catalog.adapters}
    assert classes == {"a1": AdapterClass.PRODUCTION, "a0": AdapterClass.EXPERIMENT}


async def test_an_adapter_the_catalog_adds_later_takes_its_declared_entry(
    make_rig: Callable[..., Rig],
) -> None:
    rig = make_rig()
    rig.rates["ab-variant-7"] = 9
    await rig.cycle()
    assert rig.controller.ports.catalog.by_name()[AdapterId("ab-variant-7")].rank == 8
    rig.catalog_path.write_text(
        "adapters:\n" + entry("a0") + entry("a1") + entry("ab-variant-7", rank=16)
    )
    await rig.cycle()
    announced = rig.controller.ports.catalog.by_name()[AdapterId("ab-variant-7")]
    assert (announced.rank, announced.adapter_class) == (16, AdapterClass.PRODUCTION)
    assert len(rig.controller.ports.catalog.adapters) == 3


async def test_an_ingest_that_changes_the_catalog_brings_the_forecast_forward(
    make_rig: Callable[..., Rig],
) -> None:
    from placement.controller.schedule import Schedule

    rig = make_rig()
    clock = rig.controller.clock
    assert isinstance(clock, FakeClock)
    await rig.cycle()  # a forecast exists: an unchanged ingest leaves the schedule be
    schedule = Schedule(rig.controller, settings=SETTINGS.controller, wall=clock)
    schedule.scheduler.start(paused=True)
    try:
        forecast_at = schedule.scheduler.get_job("forecast").next_run_time
        clock.advance(30)
        assert await schedule._run(Job.INGEST, schedule.ingest) is TickOutcome.DONE
        assert schedule.scheduler.get_job("forecast").next_run_time == forecast_at
        rig.rates["ab-variant-7"] = 9
        clock.advance(30)
        assert await schedule._run(Job.INGEST, schedule.ingest) is TickOutcome.DONE
        assert schedule.scheduler.get_job("forecast").next_run_time == schedule.wall_now()
        assert await schedule._run(Job.FORECAST, schedule.forecast) is TickOutcome.DONE
        assert rig.controller.state.forecast_now is False
    finally:
        schedule.scheduler.shutdown(wait=False)
