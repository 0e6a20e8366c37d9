"""The demo's controller keeps its deployed cadence on the demo's clock.

Its scheduler runs interval jobs on the wall clock while its own clock runs ``speed``
times faster; the demo writes the periods in wall seconds so that, at 6x, a plan still
comes every 5 minutes of the scenario (not every 30, on a forecast 90 minutes old).
Read back as the controller reads them: its config file, then its settings."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from placement.controller.config import load_controller_config
from placement.controller.wiring import settings_for
from placement.demo.prepare import DemoOptions
from placement.demo.run import _controller_config
from placement.demo.setup import DEFAULT_SCENARIO, Prepared
from placement.settings import ControllerSettings


def _prepared(workdir: Path, *, speed: float) -> Prepared:
    return Prepared(
        workdir=workdir,
        catalog=DEFAULT_SCENARIO / "catalog.yaml",
        fleet_source=DEFAULT_SCENARIO / "fleet.yaml",
        fleet=DEFAULT_SCENARIO / "fleet.yaml",
        pipelines=None,
        history=workdir / "history.parquet",
        pods=8,
        served_model="llama-3.1-70b",
        start=datetime(2026, 3, 12, 19, 0, tzinfo=UTC),
        speed=speed,
        shots=(),
    )


def _periods(tmp_path: Path, options: DemoOptions, *, speed: float) -> ControllerSettings:
    path = _controller_config(
        options, _prepared(tmp_path, speed=speed), tmp_path / "requests.jsonl", 0.0
    )
    return settings_for(load_controller_config(path)).controller


@pytest.mark.parametrize(
    ("speed", "ingest_s", "forecast_s", "plan_s"),
    [(1.0, 300, 900, 300), (6.0, 50, 150, 50), (20.0, 15, 45, 15)],
    ids=["real-time", "6x", "20x"],
)
def test_the_deployed_cadence_is_kept_in_scenario_time(
    tmp_path: Path, speed: float, ingest_s: int, forecast_s: int, plan_s: int
) -> None:
    periods = _periods(tmp_path, DemoOptions(), speed=speed)
    assert (periods.ingest_interval_s, periods.forecast_interval_s, periods.plan_interval_s) == (
        ingest_s,
        forecast_s,
        plan_s,
    )
    # The watchdog looks for restarted pods, a wall-clock matter.
    assert periods.watchdog_interval_s == ControllerSettings().watchdog_interval_s


def test_a_chosen_period_is_on_the_demos_clock_too(tmp_path: Path) -> None:
    periods = _periods(tmp_path, DemoOptions(plan_every_s=120), speed=4.0)
    assert (periods.ingest_interval_s, periods.forecast_interval_s, periods.plan_interval_s) == (
        30,
        30,
        30,
    )
