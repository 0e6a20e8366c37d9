"""SLO attainment per tenant: each tenant's GPU share against the promise and its TTFT
p95 against its SLO, from a replay's per-request outcomes, in text and in the HTML page.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import Catalog
from placement.plan import plan_to_json
from placement.review.slo import (
    NO_TENANT,
    TenantAttainment,
    attainment_lines,
    attainment_per_tenant,
)
from placement.settings import PlannerSettings
from placement.sim.engine import COLD_LOAD, CPU_HIT, GPU_HIT, REJECTED, SimLog
from placement.sim.workload import SimWorkload
from tests.factories import T0, adapter, catalog, make_plan
from tests.fleets import fleet_yaml

TARGET = PlannerSettings().gpu_residency_target


def tenanted_catalog() -> Catalog:
    return catalog(
        replace(adapter("a1", tenant="acme"), slo_ttft_ms=800.0),
        replace(adapter("a2", tenant="acme"), slo_ttft_ms=400.0),
        adapter("b1", tenant="bolt"),
        adapter("loner"),
    )


def replayed(rows: list[tuple[str, int, float]]) -> tuple[SimLog, SimWorkload]:
    """A replay's log and workload from (adapter, outcome, ttft_ms) per request."""
    count = len(rows)
    log = SimLog(
        pod=[0] * count,
        outcome=[outcome for _, outcome, _ in rows],
        ttft_ms=[ttft for _, _, ttft in rows],
        end_s=[0.0] * count,
    )
    workload = SimWorkload(
        start=T0,
        arrival_s=[float(i) for i in range(count)],
        adapters=[name for name, _, _ in rows],
        prompt_tokens=[10] * count,
        output_tokens=[10] * count,
        size_bytes={},
    )
    return log, workload


def by_tenant(rows: tuple[TenantAttainment, ...]) -> dict[str, TenantAttainment]:
    return {row.tenant: row for row in rows}


def test_gpu_share_and_p95_per_tenant_with_the_tightest_slo() -> None:
    acme = [("a1", GPU_HIT, 100.0)] * 97 + [("a2", COLD_LOAD, 900.0)] * 3
    bolt = [("b1", GPU_HIT, 50.0)] * 8 + [("b1", CPU_HIT, 200.0), ("b1", REJECTED, 0.0)]
    log, workload = replayed(acme + bolt + [("loner", GPU_HIT, 70.0)])
    rows = attainment_per_tenant(log, workload, tenanted_catalog(), gpu_target=TARGET)
    assert [row.tenant for row in rows] == ["acme", "bolt", NO_TENANT]
    figures = by_tenant(rows)
    assert figures["acme"].requests == 100
    assert figures["acme"].gpu_share == pytest.approx(0.97)
    assert figures["acme"].gpu_met
    assert figures["acme"].slo_ttft_ms == 400.0  # a2's, the tighter
    assert figures["acme"].ttft_p95_ms == pytest.approx(
        np.percentile([100.0] * 97 + [900.0] * 3, 95)
    )
    assert figures["acme"].ttft_met is True  # 3% slow leaves the p95 at 100 ms
    # bolt: the shed request counts against the GPU share and not in the percentile.
    assert figures["bolt"].gpu_share == pytest.approx(0.8)
    assert not figures["bolt"].gpu_met
    assert figures["bolt"].ttft_p95_ms == pytest.approx(np.percentile([50.0] * 8 + [200.0], 95))
    assert figures["bolt"].slo_ttft_ms is None and figures["bolt"].ttft_met is None
    assert figures[NO_TENANT].requests == 1


def test_all_shed_has_no_p95_and_misses_the_promise() -> None:
    log, workload = replayed([("b1", REJECTED, 0.0)] * 3)
    (row,) = attainment_per_tenant(log, workload, tenanted_catalog(), gpu_target=TARGET)
    assert (row.tenant, row.gpu_share, row.ttft_p95_ms, row.gpu_met) == ("bolt", 0.0, None, False)


def test_text_lines_say_before_after_and_which_promise_is_missed() -> None:
    before_log, workload = replayed([("a2", COLD_LOAD, 900.0)] * 2 + [("a2", GPU_HIT, 90.0)] * 2)
    after_log, _ = replayed([("a2", GPU_HIT, 90.0)] * 4)
    cat = tenanted_catalog()
    before = attainment_per_tenant(before_log, workload, cat, gpu_target=TARGET)
    after = attainment_per_tenant(after_log, workload, cat, gpu_target=TARGET)
    assert attainment_lines(before, after) == [
        "acme: 4 requests, on GPU 50.00% -> 100.00% (promise 97%: met), "
        "TTFT p95 900 -> 90 ms (SLO 400 ms: met)"
    ]
    reverse = attainment_lines(after, before)[0]
    assert "(promise 97%: MISSED)" in reverse and "(SLO 400 ms: MISSED)" in reverse


runner = CliRunner()
FLEET = fleet_yaml(max_lora_rank=16)
CATALOG_ROWS = {
    "alpha": "tenant: acme, slo_ttft_ms: 300",
    "beta": "tenant: acme, slo_ttft_ms: 2000",
    "gamma": "tenant: bolt",
    "delta": "tenant: bolt",
}


def test_the_html_review_shows_attainment_per_tenant_before_and_after(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "catalog.yaml").write_text(
        "adapters:\n"
        + "".join(
            f"  - {{name: {n}, base_model: llama-3.1-8b, rank: 8, target_modules: [q_proj],"
            f" source: /adapters/{n}, {extra}}}\n"
            for n, extra in CATALOG_ROWS.items()
        )
    )
    rng = np.random.default_rng(3)
    offsets = np.sort(rng.uniform(0, 3600, size=300))
    pd.DataFrame(
        {
            "ts": [T0 - timedelta(hours=1) + timedelta(seconds=float(s)) for s in offsets],
            "adapter": rng.choice(list(CATALOG_ROWS), size=300),
        }
    ).to_csv(tmp_path / "requests.csv", index=False)
    plan = make_plan({"pod-0": ["alpha", "beta"], "pod-1": ["gamma", "delta"]}, plan_id="plan-b")
    (tmp_path / "plan.json").write_text(plan_to_json(plan))
    report = tmp_path / "report.html"
    args = ["review", str(tmp_path / "plan.json"), "--html", str(report)]
    for option in ("fleet", "catalog"):
        args += [f"--{option}", str(tmp_path / f"{option}.yaml")]
    result = runner.invoke(app, [*args, "--log", str(tmp_path / "requests.csv")])
    assert result.exit_code == 0, result.output
    # The text review says the same, one line per tenant.
    text = result.stdout.split("SLO attainment per tenant")[1]
    assert "acme:" in text and "bolt:" in text and "promise 97%" in text
    page = report.read_text()
    section = page.split("SLO attainment per tenant")[1].split("<h2>")[0]
    assert "against the 97% promise" in section
    assert section.count("<td>acme</td>") == 2  # before and after
    assert section.count("<td>bolt</td>") == 2
    assert '<td class="num">300</td>' in section  # acme's tightest SLO
    assert "no plan (round-robin, LRU)" in section
