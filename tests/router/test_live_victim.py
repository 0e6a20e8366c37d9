"""The live router weighs a load's LRU victim as the replay does: by the plan's forecast
rate of the victim, capped by the rate the router sent it lately; and the plan carries
that forecast in its JSON (optional: an older plan reads, and weighs no victim)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType

import jsonschema  # type: ignore[import-untyped]  # no stubs: types-jsonschema is not installed
import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.domain import AdapterId, PodId, Tier
from placement.errors import PlanError
from placement.plan import (
    AdapterPlan,
    Plan,
    PodPlan,
    plan_from_dict,
    plan_from_json,
    plan_to_dict,
    plan_to_json,
)
from placement.residency import EngineModel
from placement.router.ledger import PodLedger
from placement.router.recent_rates import RecentRates
from policies.routing import VictimWorth

from .conftest import catalog_of, emulated, router_for

SCHEMA = Path(__file__).parents[2] / "placement" / "schemas" / "plan.schema.json"
AT = datetime(2026, 1, 1, tzinfo=UTC)
#: pod-0 holds "busy" (forecast one request a second) and "p0"; pod-1 holds "idle"
#: (forecast nothing) and "p1". "tail" is planned cold: its load must evict one of them.
HOT = {"busy": "pod-0", "p0": "pod-0", "idle": "pod-1", "p1": "pod-1"}
NAMES = [*HOT, "tail"]


def _plan(*, forecast: bool) -> Plan:
    rates = {"busy": 1.0, "p0": 1.0, "p1": 1.0, "idle": 0.0, "tail": 0.01}
    adapters = {
        AdapterId(name): AdapterPlan(
            tier=Tier.HOT,
            pods=MappingProxyType({PodId(pod): 1.0}),
            mean_rps=rates[name] if forecast else None,
            q90_rps=2 * rates[name] if forecast else None,
        )
        for name, pod in HOT.items()
    }
    adapters[AdapterId("tail")] = AdapterPlan(
        tier=Tier.COLD, mean_rps=0.01 if forecast else None, q90_rps=0.1 if forecast else None
    )
    pods = {
        PodId(pod): PodPlan(hot=tuple(AdapterId(n) for n, p in HOT.items() if p == pod))
        for pod in ("pod-0", "pod-1")
    }
    return Plan(
        id="with-forecast" if forecast else "without-forecast",
        created_at=AT,
        valid_from=AT,
        valid_until=AT + timedelta(hours=1),
        pods=MappingProxyType(pods),
        adapters=MappingProxyType(adapters),
    )


def _tail_load(tmp_path: Path, plan: Plan) -> tuple[str, dict[str, list[str]]]:
    """Where the router loads "tail" on two full pods, and what each pod's GPU holds then.

    "busy" is used before "idle", so it is the older victim: bounded affinity alone
    evicts it (pod-0); a forecast that says it is busy sends the load to pod-1.
    """
    path = tmp_path / "plan.json"
    path.write_text(plan_to_json(plan))  # the plan as the controller writes it
    with (
        emulated(2, max_loras=2, max_cpu_loras=8) as pods,
        router_for(pods.domain, plan=path, catalog=catalog_of(NAMES)) as router,
    ):
        client = router.client()
        for name in ("busy", "p0", "idle", "p1"):
            client.completions.create(model=name, prompt="p", max_tokens=1)
        gpu = {pod: pods.stats(pod)["gpu"] for pod in ("pod-0", "pod-1")}
        assert gpu == {"pod-0": ["busy", "p0"], "pod-1": ["idle", "p1"]}, "the set-up"
        client.completions.create(model="tail", prompt="p", max_tokens=1)
        gpu = {pod: pods.stats(pod)["gpu"] for pod in ("pod-0", "pod-1")}
    (tail_pod,) = (pod for pod, held in gpu.items() if "tail" in held)
    return tail_pod, gpu


def test_a_cold_load_goes_to_the_pod_whose_victim_the_forecast_says_nobody_needs(
    tmp_path: Path,
) -> None:
    pod, gpu = _tail_load(tmp_path, _plan(forecast=True))
    assert pod == "pod-1"
    assert "busy" in gpu["pod-0"] and "idle" not in gpu["pod-1"]


def test_without_the_plans_forecast_the_oldest_victim_is_evicted_whatever_it_is_worth(
    tmp_path: Path,
) -> None:
    pod, gpu = _tail_load(tmp_path, _plan(forecast=False))
    assert pod == "pod-0"
    assert "busy" not in gpu["pod-0"]


# --- the plan's forecast in its JSON ---------------------------------------------------


def test_the_forecast_round_trips_and_matches_the_schema() -> None:
    raw = plan_to_dict(_plan(forecast=True))
    jsonschema.validate(raw, json.loads(SCHEMA.read_text()))
    assert raw["adapters"]["busy"]["mean_rps"] == 1.0
    assert raw["adapters"]["busy"]["q90_rps"] == 2.0
    again = plan_from_json(plan_to_json(_plan(forecast=True)))
    assert plan_to_dict(again) == raw
    assert again.forecast_rps()[AdapterId("busy")] == 1.0


def test_a_plan_written_without_the_forecast_still_reads_and_writes_none() -> None:
    raw = plan_to_dict(_plan(forecast=False))
    assert all("mean_rps" not in entry for entry in raw["adapters"].values())
    jsonschema.validate(raw, json.loads(SCHEMA.read_text()))
    assert plan_from_dict(raw).forecast_rps() == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [(-1.0, "cannot be negative"), ("fast", "expected a number"), (None, "expected a number")],
    ids=["negative", "text", "null"],
)
def test_a_bad_forecast_rate_names_the_adapter_and_the_field(value: object, message: str) -> None:
    raw = plan_to_dict(_plan(forecast=True))
    raw["adapters"]["busy"]["q90_rps"] = value
    with pytest.raises(PlanError, match=rf"adapters\.busy\.q90_rps: .*{message}"):
        plan_from_dict(raw, source="plan.json")


# --- the router's recent rates ---------------------------------------------------------


def test_recent_rates_count_the_last_window_only() -> None:
    rates = RecentRates(window_s=600.0, slice_s=60.0)
    for second in range(0, 600, 2):  # "a" every 2 s for 10 minutes
        rates.add("a", float(second))
    assert rates.get("a") == pytest.approx(0.5, rel=0.01)
    rates.add("b", 1_800.0)  # 20 minutes on: "a" left the window
    assert "a" not in rates
    assert rates.get("a") == 0.0
    assert rates["b"] == pytest.approx(1 / 60)


@given(st.lists(st.floats(min_value=0.0, max_value=5_000.0), min_size=1, max_size=200))
def test_recent_rates_keep_every_request_of_the_window_and_none_older(
    times: list[float],
) -> None:
    rates = RecentRates(window_s=600.0, slice_s=60.0)
    for now_s in sorted(times):
        rates.add("a", now_s)
    last_s = max(times)
    counted = rates.get("a") * rates._span_s()
    inside = sum(1 for t in times if t > last_s - 540.0)  # the newest buckets: always kept
    within = sum(1 for t in times if t > last_s - 600.0 - 60.0)  # at most a bucket more
    assert inside <= round(counted) <= within


# --- what a victim is worth, and which one it is -----------------------------------------


@pytest.mark.parametrize(
    ("recent", "expected"),
    [(None, 1.0), ({"busy": 0.25}, 0.25), ({"busy": 4.0}, 1.0), ({}, 0.0)],
    ids=["forecast-alone", "recent-caps", "forecast-caps", "not-seen-lately"],
)
def test_a_victims_rate_is_its_forecast_capped_by_its_recent_rate(
    recent: dict[str, float] | None, expected: float
) -> None:
    worth = VictimWorth(forecast_rps={"busy": 1.0}, recent_rps=recent, victim_horizon_s=180.0)
    assert worth.rate("busy") == expected
    assert worth.rate("unknown") == 0.0


def _full_ledger() -> PodLedger:
    ledger = PodLedger(EngineModel.VLLM, max_loras=2, max_cpu_loras=4)
    for name in ("old", "new"):
        ledger.loaded(AdapterId(name), f"s3://{name}", changed=True)
    return ledger


def test_the_ledger_names_the_engines_victim() -> None:
    ledger = _full_ledger()
    assert ledger.next_victim() == "old"
    assert ledger.next_victim(busy={"old"}) == "new", "a request in flight keeps its slot"
    assert ledger.next_victim(busy={"old", "new"}) == "old", "all busy: the oldest"
    ledger.forget(AdapterId("old"))  # unloaded: on vLLM its slot stays taken
    assert ledger.free_slots() == 0
    assert ledger.next_victim() is None, "a ghost slot goes first, and is worth nothing"
    empty = PodLedger(EngineModel.VLLM, max_loras=2, max_cpu_loras=4)
    assert empty.next_victim() is None
