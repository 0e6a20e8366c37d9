"""bench/scenario_table.py: the table of every policy against the seed's claims, run
through its Python API on a morning slice of the shipped legal-research scenario (its
9 AM logins and their event log), and the war story's fixes as catalog and fleet
variants. Figures are not asserted (a benchmark reports them); the rows, the claim
beside each and the verdicts' form are."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from placement.inputs import load_catalog, load_fleet
from placement.settings import Settings
from placement.sim.engine import GPU_HIT
from placement.sim.replay import run_policy
from placement.sim.workload import SimWorkload
from tests import factories

REPO = Path(__file__).resolve().parents[2]
LEGAL = REPO / "data" / "legal-research"
WAR_STORY = REPO / "data" / "war-story"
#: Monday 07:30-10:30 in New York: the firms' logins at 08:55 and the sessions after.
SLICE = (pd.Timestamp("2026-03-09T11:30:00Z"), pd.Timestamp("2026-03-09T14:30:00Z"))


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """bench/scenario_table.py, as the module bench.scenario_table."""
    return importlib.import_module("bench.scenario_table")


@pytest.fixture(scope="module")
def legal_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    target = root / "legal-research"
    target.mkdir()
    for name in ("catalog.yaml", "fleet.yaml", "pipelines.yaml"):
        shutil.copy(LEGAL / name, target / name)
    for name in ("requests.parquet", "events.parquet"):
        inside = [("ts", ">=", SLICE[0]), ("ts", "<", SLICE[1])]
        pd.read_parquet(LEGAL / name, filters=inside).to_parquet(target / name, index=False)
    return root


def test_every_policy_gets_a_row_with_its_claim(bench: ModuleType, legal_slice: Path) -> None:
    tasks = bench.tasks_for(["legal-research"])
    rows = bench.run_all(tasks, data=legal_slice, jobs=1)
    assert [row.policy for row in rows] == [task.policy for task in tasks]
    assert {row.policy for row in rows} == set(bench.POLICIES)
    for row in rows:
        assert row.events["count"] > 0  # the logins were delivered to every policy
        claim, verdict = bench.judge(row)
        assert "9 AM" in claim
        assert "first p95" in claim
        assert verdict in ("yes", "no") or verdict.endswith(" of 2")
    main, targets = bench.table(rows, markdown=True).split("\n\n", 1)
    lines = main.splitlines()
    assert lines[0].startswith("| scenario | policy | GPU hits |")
    assert "the seed's claim" in lines[0]
    assert len(lines) == 2 + len(bench.POLICIES)
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "issue 17's targets" in targets
    target_lines = [line for line in targets.splitlines() if line.startswith("| legal-research")]
    assert len(target_lines) == 1
    assert "first on GPU" in target_lines[0]  # the scenario's logins, judged for lorafleet


def test_a_rows_file_keeps_each_admission_apart(
    bench: ModuleType, legal_slice: Path, tmp_path: Path
) -> None:
    """--load-admission vllm replays under vLLM's admission: a rows file of drain runs is
    not taken for it, and each row says which it is."""
    rows_path = tmp_path / "rows.jsonl"
    drain = bench.tasks_for(["legal-research"], ["epp"], fixes=False)
    vllm = bench.tasks_for(["legal-research"], ["epp"], fixes=False, admission="vllm")
    (first,) = bench.run_all(drain, data=legal_slice, jobs=1, rows_path=rows_path)
    (second,) = bench.run_all(vllm, data=legal_slice, jobs=1, rows_path=rows_path)
    assert (first.admission, second.admission) == ("drain", "vllm")
    # the setting reaches the replay: no drain before the morning's loads under vllm
    assert second.metrics["ttft_p95_ms"] != first.metrics["ttft_p95_ms"]
    assert len(bench.read_rows(rows_path)) == 2
    (again,) = bench.run_all(vllm, data=legal_slice, jobs=1, rows_path=rows_path)
    assert again == second  # resumed from the file, not run again
    assert len(bench.read_rows(rows_path)) == 2


@pytest.mark.parametrize(
    ("rule", "claim", "measured", "holds"),
    [
        ("about", 0.45, 0.58, True),
        ("about", 0.45, 0.60, False),
        ("at most", 180.0, 230.0, True),
        ("at most", 180.0, 240.0, False),
        ("at least", 0.92, 0.919, False),
    ],
    ids=["about-in", "about-out", "at-most-in", "at-most-out", "at-least-out"],
)
def test_a_check_holds_within_30_percent(
    bench: ModuleType, rule: str, claim: float, measured: float, holds: bool
) -> None:
    check = bench.Check(label="x", key="x", claim=claim, rule=rule)
    assert check.holds(measured) is holds


def test_the_fixes_are_variants_of_the_war_story(bench: ModuleType, tmp_path: Path) -> None:
    ws = bench.ws
    fleet = load_fleet(WAR_STORY / "fleet.yaml")
    eight, settings = ws.eight_slots(fleet, Settings())
    assert {pod.max_loras for pod in eight.pods} == {8}
    assert settings.sim.kv_capacity_tokens < Settings().sim.kv_capacity_tokens
    top = [f"adapter-{i}" for i in range(10)]
    pods = [str(pod.name) for pod in fleet.pods]
    pins = ws.pin_plan(top, pods)
    assert set(pins) == set(top)
    assert set(pins[name] for name in top[:5]) == set(pods[:4])
    assert set(pins[name] for name in top[5:]) == set(pods[4:])
    catalog = load_catalog(WAR_STORY / "catalog.yaml", fleet=fleet)
    real = {str(a.name): pins[f"adapter-{i}"] for i, a in enumerate(catalog.adapters[:10])}
    path = ws.pinned_catalog(WAR_STORY / "catalog.yaml", real, tmp_path)
    pinned = load_catalog(path, fleet=fleet)
    assert {str(a.name): [str(p) for p in a.pinned_pods] for a in pinned.adapters[:10]} == {
        name: [pod] for name, pod in real.items()
    }
    assert not any(a.is_pinned for a in pinned.adapters[10:])


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_a_pinned_adapter_is_never_evicted(bench: ModuleType, pinned: bool) -> None:
    """One pod of 2 slots, a steady "hot" adapter and a stream of cold ones: pinned,
    "hot" loads before the first request and hits every time; without the pin the
    cold stream pushes it off its slot between its requests."""
    fleet = factories.fleet(factories.pool("p", 1, max_loras=2, max_cpu_loras=2))
    names = [n for i in range(40) for n in ("hot", f"cold-{i}", f"cold-{i + 100}")]
    workload = SimWorkload(
        start=pd.Timestamp("2026-03-12T00:00:00Z").to_pydatetime(),
        arrival_s=[2.0 * i for i in range(len(names))],
        adapters=names,
        prompt_tokens=[100] * len(names),
        output_tokens=[4] * len(names),
        size_bytes=dict.fromkeys(names, 50_000_000),
    )
    replay_type = bench.ws.pinned_replay({"hot": "p-0"} if pinned else {})
    result = run_policy(
        "round-robin", workload, fleet, settings=Settings(), replay_type=replay_type
    )
    hot = [o for o, name in zip(result.log.outcome, names, strict=True) if name == "hot"]
    assert all(o == GPU_HIT for o in hot) is pinned


def _row(claims: ModuleType, policy: str, hits: float, loads: float, p95: float) -> object:
    metrics = {"gpu_hit_rate": hits, "loads": loads, "ttft_p95_ms": p95}
    return claims.Row(scenario="s", policy=policy, fix="", metrics=metrics)


def test_the_gap_is_measured_from_the_best_reactive_policy(bench: ModuleType) -> None:
    """bounded beats EPP on hits, so the gap is bounded's: lorafleet closes 3,000 of its
    4,000 loads (75%) and 50 of its 100 ms (50%), 0.5 point below the oracle: holds."""
    claims = importlib.import_module("bench.scenario_claims")
    rows = [
        _row(claims, "epp", 0.90, 20_000, 400.0),
        _row(claims, "bounded", 0.94, 10_000, 300.0),
        _row(claims, "lorafleet", 0.955, 7_000, 250.0),
        _row(claims, "oracle", 0.96, 6_000, 200.0),
    ]
    (gap,) = claims.gap_figures(rows)
    assert gap.reactive == "bounded"
    assert gap.loads_closed == pytest.approx(0.75)
    assert gap.p95_closed == pytest.approx(0.5)
    assert gap.verdict() == "yes"
    worse = [*rows[:2], _row(claims, "lorafleet", 0.93, 12_000, 310.0), rows[3]]
    (gap,) = claims.gap_figures(worse)
    assert gap.loads_closed == pytest.approx(-0.5)
    assert gap.verdict() == "no"
    assert claims.closed(100.0, 90.0, 100.0) is None  # no gap to close
    assert claims.closed(324.3, 325.0, 324.0) is None  # nor within 1% of the figure
    level = [_row(claims, p, 1.0, 4, 324.0) for p in ("bounded", "lorafleet", "oracle")]
    (gap,) = claims.gap_figures(level)
    assert gap.verdict() == "yes"  # nothing to close, and at the oracle's hits
