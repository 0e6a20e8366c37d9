"""Pins recommended from a request log: heavy, steady, production, on enough pods."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import yaml
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import AdapterClass, Fleet
from placement.forecast.pins import PinRules, recommend_pins
from tests import factories

HOURS = pd.date_range("2026-03-09T00:00:00Z", periods=48, freq="h")


def hourly(rates: dict[str, list[int]]) -> pd.DataFrame:
    """Requests per hour per adapter: each list is repeated over the 48 hours."""
    rows = [
        {"ts": ts, "adapter": name, "requests": counts[i % len(counts)]}
        for name, counts in rates.items()
        for i, ts in enumerate(HOURS)
        if counts[i % len(counts)] > 0
    ]
    return pd.DataFrame(rows)


def setup() -> Fleet:
    """Four pods of 4 GPU slots, 4 requests/s each."""
    return factories.fleet(factories.pool("p", 4, max_loras=4, capacity_rps=4.0))


def test_the_heaviest_steady_production_adapters_are_pinned_one_pod_each() -> None:
    counts = hourly({"big": [36_000], "mid": [3_600], "tail": [10], "bursty": [0, 0, 0, 20_000]})
    catalog = factories.catalog(*(factories.adapter(n) for n in ("big", "mid", "tail", "bursty")))
    (pool,) = recommend_pins(counts, catalog, setup())
    by_name = {pin.adapter: pin for pin in pool.pins}
    assert list(by_name) == ["big", "mid"]
    # A pin keeps one copy warm; the routing and the plan carry the peak.
    assert by_name["big"].pod_ids == ("p-0",) and by_name["mid"].pod_ids == ("p-1",)
    assert "bursty" in pool.passed_over and "busy hours" in pool.passed_over["bursty"]
    assert "tail" not in by_name
    assert pool.pinned_slots == 2 and pool.slots == 16
    # Pins that carry their peak: 10 req/s on pods of 4 req/s at 80% is 4 pods; 1 req/s
    # the 2-pod minimum.
    (peak,) = recommend_pins(counts, catalog, setup(), PinRules(pods_per_pin=None))
    assert [pin.pods for pin in peak.pins] == [4, 2] and peak.pinned_slots == 6


def test_each_pin_names_its_pods_the_least_pinned_first_and_leaves_every_pod_a_slot() -> None:
    counts = hourly({"big": [36_000], "mid": [3_600], "low": [3_000], "last": [2_500]})
    catalog = factories.catalog(*(factories.adapter(n) for n in ("big", "mid", "low", "last")))
    rules = PinRules(max_slot_share=1.0, pods_per_pin=None)
    (pool,) = recommend_pins(counts, catalog, setup(), rules)
    pods = {pin.adapter: pin.pod_ids for pin in pool.pins}
    assert pods["big"] == ("p-0", "p-1", "p-2", "p-3")
    # Two pins each on the four pods: the next pins take the least pinned pods in turn.
    assert pods["mid"] == ("p-0", "p-1") and pods["low"] == ("p-2", "p-3")
    assert pods["last"] == ("p-0", "p-1")
    assert all(len(pin.pod_ids) == pin.pods for pin in pool.pins)
    # Four slots a pod: at most three pins on one.
    per_pod = [sum(name in pin.pod_ids for pin in pool.pins) for name in ("p-0", "p-1")]
    assert max(per_pod) <= 3


def test_experiments_and_batch_jobs_are_never_pinned() -> None:
    counts = hourly({"exp": [36_000], "batch": [20_000], "prod": [3_600]})
    catalog = factories.catalog(
        replace(factories.adapter("exp"), adapter_class=AdapterClass.EXPERIMENT),
        replace(factories.adapter("batch"), adapter_class=AdapterClass.BATCH),
        factories.adapter("prod"),
    )
    (pool,) = recommend_pins(counts, catalog, setup())
    assert [pin.adapter for pin in pool.pins] == ["prod"]
    assert pool.passed_over == {"exp": "class experiment", "batch": "class batch"}


def test_pins_stop_at_their_share_of_the_slots_and_their_count() -> None:
    names = [f"a{i}" for i in range(12)]
    counts = hourly({name: [10_000 - 500 * i] for i, name in enumerate(names)})
    catalog = factories.catalog(*(factories.adapter(n) for n in names))
    (pool,) = recommend_pins(counts, catalog, setup(), PinRules(max_slot_share=0.5))
    assert pool.pinned_slots <= 0.5 * pool.slots
    (few,) = recommend_pins(counts, catalog, setup(), PinRules(max_pins=2))
    assert len(few.pins) == 2


runner = CliRunner()
DATA = Path(__file__).resolve().parents[2] / "data" / "legal-research"
BASE = ["recommend", "pins", "--catalog", str(DATA / "catalog.yaml"), "--fleet",
        str(DATA / "fleet.yaml"), "--log", str(DATA / "requests.parquet")]  # fmt: skip


def test_the_cli_writes_a_catalog_with_the_pins_and_checks_them_by_replay(tmp_path: Path) -> None:
    out = tmp_path / "pinned.yaml"
    result = runner.invoke(
        app,
        [*BASE, "--until", "2026-03-10T00:00:00-04:00", "--write-catalog", str(out),
         "--check-from", "2026-03-10T09:00:00-04:00", "--check-to", "2026-03-10T10:00:00-04:00",
         "--history", "2h", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (pool,) = report["pools"]
    # legal-research's jurisdictions are busy in their own coast's office hours only (about
    # half of the pool's busy hours), so none is steady enough to pin; each says why.
    assert pool["pins"] == []
    assert pool["passed_over"]["ny-jurisdiction-v3"].startswith("active in ")
    pinned = yaml.safe_load(out.read_text())["adapters"]
    assert not any(entry.get("pinned") for entry in pinned)
    check = report["check"]
    assert set(check) == {"without", "with"}
    assert all(0.0 <= figures["gpu_hit_rate"] <= 1.0 for figures in check.values())


def test_the_cli_refuses_a_time_without_offset_and_an_empty_history() -> None:
    result = runner.invoke(app, [*BASE, "--until", "2026-03-10T00:00:00"])
    assert result.exit_code == 2 and "offset" in result.stderr
    result = runner.invoke(app, [*BASE, "--until", "2020-01-01T00:00:00+00:00"])
    assert result.exit_code == 2 and "no request before" in result.stderr


def test_the_cli_pins_saas_50s_top_ten_and_writes_them_in_the_catalog(tmp_path: Path) -> None:
    saas = DATA.parent / "saas-50"
    out = tmp_path / "pinned.yaml"
    result = runner.invoke(
        app,
        ["recommend", "pins", "--catalog", str(saas / "catalog.yaml"), "--fleet",
         str(saas / "fleet.yaml"), "--log", str(saas / "requests.parquet"),
         "--write-catalog", str(out), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (pool,) = json.loads(result.stdout)["pools"]
    # The steady support desks: the ten busiest carry about 70% of the requests.
    assert [pin["adapter"] for pin in pool["pins"]] == [f"support-{i:02d}" for i in range(10)]
    assert 0.6 < pool["pinned_share"] < 0.8
    assert pool["pinned_slots"] <= pool["slots"] / 2
    written = {entry["name"]: entry for entry in yaml.safe_load(out.read_text())["adapters"]}
    for pin in pool["pins"]:
        assert written[pin["adapter"]]["pinned"] == pin["pod_ids"]
        assert written[pin["adapter"]]["min_replicas"] == pin["pods"] == 1
    assert not any(
        entry.get("pinned") for name, entry in written.items() if not name.startswith("support-0")
    )
