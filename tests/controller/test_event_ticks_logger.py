"""The event tick logs under its own module's name (``placement.controller.event_ticks``),
not under the name of the module it was split out of."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import cast

import pytest

from placement.adapters.kube_memory import MemoryPlanStore, MemoryStateStore
from placement.controller.ports import Actuator, ControllerPorts, HistorySource
from placement.controller.ticks import Controller
from placement.domain import AdapterId, PodId
from placement.forecast.demand import DemandForecaster
from placement.forecast.event_preloads import Predictor
from placement.settings import Settings
from placement.solver.planner import Planner
from tests import factories
from tests.controller.controller_support import make_fleet
from tests.factories import T0, FakeClock

pytestmark = pytest.mark.anyio


def _unreadable() -> Mapping[PodId, Mapping[AdapterId, float]]:
    raise OSError("router log: cannot read")


async def test_an_event_without_idle_times_is_logged_by_event_ticks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ports = ControllerPorts(
        catalog=factories.catalog(factories.adapter("legal")),
        fleet=make_fleet(),
        history=cast(HistorySource, None),  # the events read no history
        forecaster=cast(DemandForecaster, None),
        planner=cast(Planner, None),
        actuator=cast(Actuator, None),
        plans=MemoryPlanStore(),
        state=MemoryStateStore(),
        predictor=cast(Predictor, None),
        recent_use=_unreadable,
    )
    controller = Controller(ports, settings=Settings(), clock=FakeClock(T0.timestamp()))
    with caplog.at_level(logging.WARNING, logger="placement.controller.event_ticks"):
        assert await controller._recent_use() is None
    [record] = [r for r in caplog.records if "without idle times" in r.getMessage()]
    assert record.name == "placement.controller.event_ticks"
