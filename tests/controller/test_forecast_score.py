"""The online forecast score: a past forecast against what arrived, beside persistence
and yesterday (placement.forecast.scoring), and the forecast tick that feeds it to
``lorafleet_forecast_mae_rps`` and ``lorafleet_forecast_scores_total``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, cast

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from placement.adapters.kube_memory import MemoryPlanStore, MemoryStateStore
from placement.controller.live_ports import PrometheusObserver
from placement.controller.ports import Actuator, ControllerPorts, Job, TickOutcome
from placement.controller.ticks import Controller
from placement.domain import AdapterId, Fleet, Pipelines
from placement.forecast.event_preloads import pipeline_predictor
from placement.forecast.scoring import IssuedForecast, score_due, score_forecast
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.plan import Plan
from placement.settings import Settings
from placement.solver.problem import Demand
from tests import factories
from tests.factories import T0, FakeClock

from .controller_support import make_fleet

BUCKET_S = 600
NOON = T0.replace(hour=12)
HOUR = timedelta(hours=1)
Rates = Callable[[datetime], Mapping[str, float]]


def steady(ts: datetime) -> dict[str, float]:
    """a at 1 rps, b at 0.5; at noon on NOON's day a doubles; the day before at noon, b
    runs at 0.25."""
    if NOON <= ts < NOON + HOUR:
        return {"a": 2.0, "b": 0.5}
    if NOON - timedelta(days=1) <= ts < NOON - timedelta(days=1) + HOUR:
        return {"a": 1.0, "b": 0.25}
    return {"a": 1.0, "b": 0.5}


def log_of(rates: Rates, start: datetime, end: datetime) -> RequestLog:
    """An aggregated log, one row per adapter per bucket in [start, end)."""
    rows = []
    ts = start
    while ts < end:
        rows += [(ts, name, round(rps * BUCKET_S)) for name, rps in rates(ts).items() if rps > 0]
        ts += timedelta(seconds=BUCKET_S)
    frame = pd.DataFrame(rows, columns=["ts", "adapter", "requests"])
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return request_log_from_frame(frame, source="test")


def issued(rates: Mapping[str, float], at: datetime = NOON) -> IssuedForecast:
    return IssuedForecast(issued_at=at, duration_s=3600, demand=factories.demand(rates))


def test_a_forecast_is_scored_beside_persistence_and_yesterday() -> None:
    history = log_of(steady, NOON - timedelta(days=2), NOON + HOUR + HOUR)
    score = score_forecast(issued({"a": 1.5, "b": 0.5}), history, bucket_s=BUCKET_S)
    assert score is not None
    assert (score.start, score.end, score.adapters) == (NOON, NOON + HOUR, 2)
    assert score.actual_requests == pytest.approx(2.5 * 3600)
    assert score.model_mae_rps == pytest.approx(0.5 / 2)  # a: |1.5 - 2|, b exact
    assert score.persistence_mae_rps == pytest.approx(1.0 / 2)  # the hour before: a at 1
    assert score.yesterday_mae_rps == pytest.approx((1.0 + 0.25) / 2)
    assert score.error_ratio == pytest.approx(0.5 * 3600 / (2.5 * 3600))


def test_a_naive_forecast_the_history_does_not_reach_is_none() -> None:
    # Six hours of history: persistence has its hour, yesterday has nothing.
    history = log_of(steady, NOON - 6 * HOUR, NOON + 2 * HOUR)
    score = score_forecast(issued({"a": 2.0, "b": 0.5}), history, bucket_s=BUCKET_S)
    assert score is not None
    assert score.yesterday_mae_rps is None
    assert score.persistence_mae_rps == pytest.approx(0.5)
    assert score.model_mae_rps == 0.0 and score.error_ratio == 0.0


def test_an_adapter_the_forecast_left_out_counts_its_whole_traffic() -> None:
    history = log_of(steady, NOON - 2 * HOUR, NOON + 2 * HOUR)
    score = score_forecast(issued({"a": 2.0, "c": 1.0}), history, bucket_s=BUCKET_S)
    assert score is not None
    assert score.adapters == 3  # a, b (arrived), c (forecast)
    assert score.model_mae_rps == pytest.approx((0.0 + 0.5 + 1.0) / 3)


def test_only_forecasts_whose_window_has_passed_are_scored() -> None:
    early, late = issued({"a": 1.0}, NOON - HOUR), issued({"a": 1.0}, NOON)
    # The history ends at 12:50: 11:00's window is over, noon's is not.
    history = log_of(steady, NOON - 3 * HOUR, NOON + timedelta(minutes=50))
    waiting, scores = score_due([early, late], history, bucket_s=BUCKET_S)
    assert waiting == [late]
    assert [s.start for s in scores] == [NOON - HOUR]
    assert score_due([late], log_of(steady, NOON, NOON), bucket_s=BUCKET_S) == ([late], [])


@settings(max_examples=40, deadline=None)
@given(
    rates=st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(min_value=1, max_value=600).map(lambda n: n / BUCKET_S),
        min_size=1,
    )
)
def test_a_perfect_forecast_of_steady_traffic_scores_zero_for_all(
    rates: dict[str, float],
) -> None:
    history = log_of(lambda _: rates, NOON - timedelta(days=1), NOON + 2 * HOUR)
    score = score_forecast(issued(rates), history, bucket_s=BUCKET_S)
    assert score is not None
    assert score.model_mae_rps == pytest.approx(0.0, abs=1e-12)
    assert score.persistence_mae_rps == pytest.approx(0.0, abs=1e-12)
    assert score.yesterday_mae_rps == pytest.approx(0.0, abs=1e-12)
    assert score.error_ratio == pytest.approx(0.0, abs=1e-12)
    doubled = score_forecast(
        issued({n: 2 * r for n, r in rates.items()}), history, bucket_s=BUCKET_S
    )
    assert doubled is not None
    assert doubled.model_mae_rps == pytest.approx(sum(rates.values()) / len(rates))
    assert doubled.error_ratio == pytest.approx(1.0)


class FixedForecaster:
    """The forecaster port: a at 1.5 rps and b at 0.5, whatever the history."""

    def __call__(
        self, history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        return factories.demand({"a": 1.5, "b": 0.5})


def _planner(
    demand: Mapping[AdapterId, Demand], *, fleet: Fleet, valid_from: datetime, current: Any
) -> Plan:
    return factories.make_plan({"pod-0": ("a",)}, created=valid_from)


@pytest.mark.anyio
async def test_the_forecast_tick_scores_its_last_forecast_on_metrics() -> None:
    clock = FakeClock(NOON.timestamp())
    logs = [log_of(steady, NOON - timedelta(days=2), NOON)]
    catalog = factories.catalog(factories.adapter("a"), factories.adapter("b"))
    ports = ControllerPorts(
        catalog=catalog,
        fleet=make_fleet(),
        history=lambda: logs[-1],
        forecaster=FixedForecaster(),
        planner=_planner,
        actuator=cast(Actuator, None),  # the forecast tick sends nothing
        plans=MemoryPlanStore(),
        state=MemoryStateStore(),
        predictor=pipeline_predictor(Pipelines(), catalog),
    )
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry, bucket_s=BUCKET_S)
    controller = Controller(ports, settings=Settings(), clock=clock, metrics=observer)

    async def tick() -> None:
        assert await controller.guarded(Job.INGEST, controller.ingest) is TickOutcome.DONE
        assert await controller.guarded(Job.FORECAST, controller.forecast) is TickOutcome.DONE

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    await tick()  # noon: a forecast for 12:00-13:00, nothing to score yet
    assert value("lorafleet_forecast_scores_total") == 0
    assert value("lorafleet_forecast_mae_rps", forecast="model") is None
    clock.advance(15 * 60)
    logs.append(log_of(steady, NOON - timedelta(days=2), NOON + timedelta(minutes=15)))
    await tick()  # 12:15: noon's window is not over
    assert value("lorafleet_forecast_scores_total") == 0
    clock.advance(55 * 60)
    logs.append(log_of(steady, NOON - timedelta(days=2), NOON + timedelta(minutes=70)))
    await tick()  # 13:10: noon's forecast (and only it) is scored
    assert value("lorafleet_forecast_scores_total") == 1
    assert value("lorafleet_forecast_mae_rps", forecast="model") == pytest.approx(0.25)
    assert value("lorafleet_forecast_mae_rps", forecast="persistence") == pytest.approx(0.5)
    assert value("lorafleet_forecast_mae_rps", forecast="yesterday") == pytest.approx(0.625)
    assert value("lorafleet_forecast_error_ratio") == pytest.approx(0.2)
    # The catalog's tenants came with the ingest: none here, so no info series.
    assert not [s for f in registry.collect() for s in f.samples if "tenant" in s.labels]
