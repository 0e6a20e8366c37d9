"""The preload schedule: loads start a lead time before each rise into the hot tier."""

from __future__ import annotations

import numpy as np
import pytest

from models.base import PanelForecast
from models.preload import HotRule, hot_flags, preload_schedule

ORIGIN_S = 1_767_254_400  # 2026-01-01 08:00 UTC
BUCKET_S = 600


def forecast_of(*columns: list[float]) -> PanelForecast:
    mean = np.array(columns, dtype=np.float64).T
    return PanelForecast(
        origin_s=ORIGIN_S,
        bucket_s=BUCKET_S,
        adapters=tuple(f"adapter-{i}" for i in range(len(columns))),
        mean=mean,
        q50=mean,
        q90=mean,
        q99=mean,
        p_nonzero=1.0 - np.exp(-mean),
    )


def test_nine_oclock_peak_loads_at_quarter_to_nine() -> None:
    # customer-support-es: quiet until 09:00 (step 6), then busy for business hours.
    forecast = forecast_of([0.0] * 6 + [30.0] * 6)
    (item,) = preload_schedule(forecast, lead_s=900)
    assert item.needed_at_s == ORIGIN_S + 3600
    assert item.load_at_s == ORIGIN_S + 3600 - 900
    assert "late" not in item.reason


@pytest.mark.parametrize(("lead_s", "moved_s"), [(300, 300), (900, 900), (1800, 1800)])
def test_schedule_moves_earlier_by_each_adapters_lead(lead_s: int, moved_s: int) -> None:
    forecast = forecast_of([0.0] * 6 + [30.0] * 6, [0.0] * 6 + [30.0] * 6)
    items = preload_schedule(forecast, lead_s={"adapter-0": lead_s, "adapter-1": 60})
    by_adapter = {i.adapter: i for i in items}
    assert by_adapter["adapter-0"].needed_at_s - by_adapter["adapter-0"].load_at_s == moved_s
    assert by_adapter["adapter-1"].needed_at_s - by_adapter["adapter-1"].load_at_s == 60


def test_a_rise_too_soon_is_scheduled_now_and_flagged_late() -> None:
    (item,) = preload_schedule(forecast_of([0.0, 30.0, 30.0]), lead_s=900)
    assert item.load_at_s == ORIGIN_S
    assert "late" in item.reason


def test_wobbling_around_the_threshold_does_not_flap() -> None:
    forecast = forecast_of([0.0, 1.2, 0.9, 1.1, 0.85, 1.3, 0.0, 0.0, 2.0])
    rule = HotRule(mean_per_bucket=1.0, p_nonzero=1.1, exit_share=0.8)
    assert hot_flags(forecast, rule)[:, 0].tolist() == [
        False,
        True,
        True,
        True,
        True,
        True,
        False,
        False,
        True,
    ]
    assert len(preload_schedule(forecast, lead_s=0, rule=rule)) == 2


def test_adapters_already_hot_have_no_rise_at_the_origin() -> None:
    forecast = forecast_of([30.0] * 4)
    assert preload_schedule(forecast, lead_s=900, hot_now=frozenset({"adapter-0"})) == ()
    assert len(preload_schedule(forecast, lead_s=900)) == 1
