"""Capacity: a grid of fleet shapes replayed, and the cheapest shape meeting a target."""

from __future__ import annotations

import json
import pickle
import resource
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.cli.capacity_cmds import split_log
from placement.domain import AdapterId, Catalog, Fleet
from placement.errors import InputError
from placement.inputs import load_fleet
from placement.inputs.request_log import RequestLog
from placement.settings import Settings
from placement.sim.capacity import (
    GridJob,
    PastHistory,
    Shape,
    ShapeResult,
    default_grid,
    past_counts,
    pool_context,
    recommend,
    replay_grid,
    reshape,
)
from placement.sim.workload import SimWorkload
from placement.solver.problem import Demand
from tests import factories
from tests.fleets import fleet_yaml

FLEET = fleet_yaml()


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return load_fleet(path)


def cyclic_workload(adapters: int, requests: int, gap_s: float = 2.0) -> SimWorkload:
    """Adapters in turn: a pod with fewer slots than adapters misses on each one."""
    names = [f"a{i}" for i in range(adapters)]
    return SimWorkload(
        start=datetime(2026, 3, 9, tzinfo=UTC),
        arrival_s=[i * gap_s for i in range(requests)],
        adapters=[names[i % adapters] for i in range(requests)],
        prompt_tokens=[200] * requests,
        output_tokens=[8] * requests,
        size_bytes=dict.fromkeys(names, 50_000_000),
    )


def test_reshape_changes_the_pod_template_and_scales_its_budgets(fleet: Fleet) -> None:
    shaped = reshape(fleet, Shape(pods=3, max_loras=4, max_cpu_loras=8))
    pods = shaped.pools[0].pods
    assert [pod.name for pod in pods][:2] == ["pod-0", "pod-1"]
    assert len({pod.name for pod in pods}) == 3
    assert {pod.max_loras for pod in pods} == {4}
    assert {pod.max_cpu_loras for pod in pods} == {8}
    assert {pod.hbm_adapter_bytes for pod in pods} == {2 * 2**30}
    assert len(reshape(fleet, Shape(pods=1, max_loras=2, max_cpu_loras=4)).pools[0].pods) == 1


def test_the_default_grid_varies_slots_and_pods_around_the_fleet(fleet: Fleet) -> None:
    grid = default_grid(fleet)
    assert {shape.max_loras for shape in grid} == {2, 3, 4}
    assert {shape.pods for shape in grid} == {2, 3}
    assert all(shape.max_cpu_loras >= shape.max_loras for shape in grid)


def row(pods: int, slots: int, hit: float, p95: float = 100.0) -> ShapeResult:
    return ShapeResult(
        shape=Shape(pods=pods, max_loras=slots, max_cpu_loras=16),
        gpu_hit_rate=hit,
        ttft_p95_ms=p95,
        loads_per_pod_s=0.01,
        loads=10,
    )


def test_the_cheapest_shape_meeting_the_target_is_fewest_pods_then_slots() -> None:
    grid = [row(8, 4, 0.93), row(8, 8, 0.975), row(12, 4, 0.971), row(8, 12, 0.99)]
    chosen = recommend(grid, target_hit=0.97)
    assert chosen.met
    assert chosen.result.shape == Shape(pods=8, max_loras=8, max_cpu_loras=16)
    with_ttft = recommend(
        [row(8, 8, 0.98, p95=900.0), row(10, 8, 0.98, p95=300.0)],
        target_hit=0.97,
        target_ttft_p95_ms=500.0,
    )
    assert with_ttft.result.shape.pods == 10


def test_a_target_no_shape_meets_gets_the_best_shape_found_and_says_so() -> None:
    chosen = recommend(
        [row(8, 4, 0.90), row(8, 8, 0.95), row(12, 8, 0.95, p95=80.0)], target_hit=0.99
    )
    assert not chosen.met
    assert chosen.result.shape == Shape(pods=12, max_loras=8, max_cpu_loras=16)
    assert "no shape in the grid meets" in chosen.reason
    with pytest.raises(InputError):
        recommend([], target_hit=0.9)


def cyclic_job(fleet: Fleet, *, adapters: int, requests: int) -> tuple[GridJob, Catalog]:
    """A grid job of ``cyclic_workload`` under bounded affinity, and its catalog."""
    job = GridJob(
        workload=cyclic_workload(adapters=adapters, requests=requests),
        fleet=fleet,
        settings=Settings(),
        policy="bounded",
        planner="greedy",
        window_s=None,
    )
    names = (factories.adapter(f"a{i}") for i in range(adapters))
    return job, factories.catalog(*names)


def test_the_grid_workers_start_clean_and_their_cpu_counts_as_this_process_children(
    fleet: Fleet,
) -> None:
    # The caller may be a process with live threads (a test run's servers, pyarrow's
    # pool); a child forked from it once segfaulted in the garbage collector.
    assert pool_context().get_start_method() == "spawn"
    job, catalog = cyclic_job(fleet, adapters=3, requests=60)
    shapes = [Shape(pods=1, max_loras=n, max_cpu_loras=8) for n in (1, 2)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    replay_grid(job, catalog, shapes, jobs=2)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # the workers were reaped by this process: `lorafleet capacity`'s cpu_s sees them
    assert after.ru_utime + after.ru_stime > before.ru_utime + before.ru_stime


def test_a_grid_job_crosses_to_a_worker_whole_and_read_only(fleet: Fleet) -> None:
    pod = fleet.pools[0].pods[0]
    assert isinstance(pod.labels, MappingProxyType)
    copied = pickle.loads(pickle.dumps(fleet))
    assert copied == fleet
    assert isinstance(copied.pools[0].pods[0].labels, MappingProxyType)


@pytest.mark.parametrize("jobs", [1, 2])
def test_more_slots_turn_a_thrashing_workload_into_hits(fleet: Fleet, jobs: int) -> None:
    job, catalog = cyclic_job(fleet, adapters=6, requests=600)
    shapes = [
        Shape(pods=1, max_loras=2, max_cpu_loras=8),
        Shape(pods=1, max_loras=6, max_cpu_loras=8),
    ]
    small, large = replay_grid(
        job, catalog, shapes, jobs=jobs, kv_tokens=lambda s: 1000 - s.max_loras
    )
    assert small.gpu_hit_rate < 0.1
    assert large.gpu_hit_rate > 0.95
    assert large.loads < small.loads
    assert small.kv_tokens == 998 and large.kv_tokens == 994
    assert large.kv_headroom == pytest.approx(994 / 998)
    chosen = recommend([small, large], target_hit=0.9)
    assert chosen.met and chosen.result.shape.max_loras == 6


def test_the_cli_names_the_cheapest_shape_and_keeps_its_keys(tmp_path: Path) -> None:
    data = Path(__file__).resolve().parents[2] / "data" / "legal-research"
    plot = tmp_path / "capacity.png"
    result = CliRunner().invoke(
        app,
        [
            "capacity", "--catalog", str(data / "catalog.yaml"),
            "--fleet", str(data / "fleet.yaml"), "--log", str(data / "requests.parquet"),
            "--target-hit", "0.85", "--slots", "1,4", "--pods", "2,4", "--policy", "bounded",
            "--from", "2026-03-10T08:00:00-05:00", "--to", "2026-03-10T09:00:00-05:00",
            "--history", "1h", "--gpu", "h100-80gb", "--quant", "int4", "--jobs", "1",
            "--plot", str(plot), "--json",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    keys = {"max_loras", "pods", "max_cpu_loras", "gpu_hit_rate", "ttft_p95_ms"}
    assert keys <= report["recommended"].keys()
    assert len(report["grid"]) == 4 and all(keys <= row.keys() for row in report["grid"])
    assert report["met"] is True
    # Tuesday 9-10 ET: one slot per pod thrashes the east's jurisdictions even on four pods
    # (67% hits); four slots on two pods hold them (90%): more slots, not more pods.
    assert report["recommended"]["max_loras"] == 4
    assert report["recommended"]["pods"] == 2
    assert plot.stat().st_size > 0


def test_the_cli_refuses_bad_grids_in_one_line() -> None:
    data = Path(__file__).resolve().parents[2] / "data" / "legal-research"
    base = ["capacity", "--catalog", str(data / "catalog.yaml"), "--fleet",
            str(data / "fleet.yaml"), "--log", str(data / "requests.parquet")]  # fmt: skip
    result = CliRunner().invoke(app, [*base, "--target-hit", "0.9", "--slots", "four"])
    assert result.exit_code == 2
    assert "--slots" in result.stderr and "Traceback" not in result.output
    result = CliRunner().invoke(app, [*base, "--target-hit", "1.5"])
    assert result.exit_code == 2 and "--target-hit" in result.stderr


def _per_minute(start: str, minutes: int, adapter: str) -> RequestLog:
    ts = pd.date_range(start, periods=minutes, freq="min", tz="UTC")
    frame = pd.DataFrame({"ts": ts, "adapter": adapter, "requests": 1})
    return RequestLog(frame=frame, aggregated=True)


def test_the_forecaster_sees_the_past_before_the_replayed_history() -> None:
    seen: list[RequestLog] = []

    def forecaster(
        history: RequestLog, *, start: datetime, duration_s: int
    ) -> dict[AdapterId, Demand]:
        seen.append(history)
        return {}

    past = _per_minute("2026-03-09T00:00", 120, "old")
    replayed = _per_minute("2026-03-09T02:00", 30, "new")
    PastHistory(forecaster, past)(
        replayed, start=datetime(2026, 3, 9, 2, 30, tzinfo=UTC), duration_s=60
    )
    (history,) = seen
    assert history.aggregated and len(history.frame) == 150
    assert history.frame.groupby("adapter")["requests"].sum().to_dict() == {"new": 30, "old": 120}


def test_only_the_warm_up_is_replayed_and_the_history_before_it_is_counted() -> None:
    ts = pd.date_range("2026-03-09T00:00", periods=48 * 60, freq="min", tz="UTC")
    log = RequestLog(frame=pd.DataFrame({"ts": ts, "adapter": "a"}), aggregated=False)
    replayed, before = split_log(
        log, "2026-03-10T12:00:00+00:00", "2026-03-10T14:00:00+00:00", history="1D", warmup="1h"
    )
    assert replayed.frame["ts"].min() == pd.Timestamp("2026-03-10T11:00", tz="UTC")
    assert len(replayed.frame) == 3 * 60
    assert before is not None
    assert before.frame["ts"].min() == pd.Timestamp("2026-03-09T12:00", tz="UTC")
    assert before.frame["ts"].max() == pd.Timestamp("2026-03-10T10:59", tz="UTC")
    counts = past_counts(before, 900)
    assert counts.aggregated and int(counts.frame["requests"].sum()) == 23 * 60
    # A warm-up longer than the history is the history; without --from the log is whole.
    whole, none = split_log(log, "2026-03-10T12:00:00+00:00", None, history="2h", warmup="5h")
    assert whole.frame["ts"].min() == pd.Timestamp("2026-03-10T10:00", tz="UTC") and none is None
    assert split_log(log, None, None, history="1D", warmup="1h") == (log, None)
    with pytest.raises(InputError, match="--warmup"):
        split_log(log, "2026-03-10T12:00:00+00:00", None, history="1D", warmup="-1h")
