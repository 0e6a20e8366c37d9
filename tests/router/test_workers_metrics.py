"""One ``/metrics`` for ``lorafleet router --workers N``: whichever worker answers, the
figures are every worker's (counters summed, exited workers included; each gauge
folded as ``GAUGE_ACROSS_WORKERS`` says over the live ones).

The wire test runs the router as a process with two workers over emulated pods; the
fold tests write each worker's figures from processes of their own (forked, as the
workers are), or the files themselves, and read them as a worker's ``/metrics`` does.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from placement.adapters.request_log_files import worker_log_path
from placement.plan import plan_to_json
from placement.router.core import Router
from placement.router.metrics import (
    GAUGE_ACROSS_WORKERS,
    RouterMetrics,
    forget_worker,
    record_in,
)
from placement.router.sources import StaticPlanSource
from placement.router.state import Upstream

from .conftest import MANUAL, emulated, plan_of
from .processes import RouterProcess, start_router, wait_for

ADAPTERS = [f"hot-{i}" for i in range(4)]
CATALOG = "adapters:\n" + "".join(
    f"  - {{name: {name}, base_model: llama-3.1-8b, rank: 8, source: s3://a/{name}}}\n"
    for name in ADAPTERS
)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _series(text: str) -> Series:
    """Every sample of a ``/metrics`` body; a series twice (one per worker) fails."""
    got: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in got, f"{key} twice in /metrics"
            got[key] = sample.value
    return got


def _total(series: Series, name: str) -> float:
    return sum(value for (sample, _), value in series.items() if sample == name)


def _by_pod(series: Series, name: str) -> dict[str, float]:
    return {dict(labels)["pod"]: value for (s, labels), value in series.items() if s == name}


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(part) for part in text.split()]


def _start(tmp_path: Path, urls: dict[str, str]) -> RouterProcess:
    plan = tmp_path / "plan.json"
    hot = {name: [f"pod-{i % len(urls)}"] for i, name in enumerate(ADAPTERS)}
    plan.write_text(plan_to_json(plan_of(hot)))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(CATALOG)
    args = ["--plan", str(plan), "--catalog", str(catalog), "--workers", "2"]
    args += ["--request-log", str(tmp_path / "requests.jsonl"), "--log-flush-s", "0.05"]
    return start_router(tmp_path, urls=urls, args=args)


def _send(url: str, count: int) -> None:
    """``count`` requests, each on a connection of its own (the kernel spreads them)."""
    for i in range(count):
        body = {"model": ADAPTERS[i % len(ADAPTERS)], "prompt": "hello", "max_tokens": 1}
        reply = httpx.post(f"{url}/v1/completions", json=body, timeout=30.0)
        assert reply.status_code == 200, reply.text


def _scrape(url: str) -> Series:
    """``/metrics`` on a new connection: any worker may answer it."""
    reply = httpx.get(f"{url}/metrics", timeout=30.0)
    assert reply.status_code == 200
    return _series(reply.text)


def _logged(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_every_scrape_of_two_workers_counts_both_and_keeps_an_exited_ones(
    tmp_path: Path,
) -> None:
    with emulated(2, max_loras=4, max_cpu_loras=8) as pods:
        router = _start(tmp_path, pods.urls)
        try:
            workers = _children(router.pid)
            assert len(workers) == 2
            wait_for(lambda: router.get("/readyz").status_code == 200, timeout_s=30, what="ready")
            _send(router.url, 40)
            logs = [worker_log_path(tmp_path / "requests.jsonl", w) for w in range(2)]
            wait_for(lambda: sum(map(_logged, logs)) == 40, timeout_s=30, what="40 rows")
            assert all(_logged(path) > 0 for path in logs)  # both workers served some
            seen = 0.0
            for _ in range(12):  # each on a new connection: both workers answer some
                series = _scrape(router.url)
                total = _total(series, "lorafleet_requests_total")
                assert total == 40 >= seen
                seen = total
                assert _total(series, "lorafleet_ttft_seconds_count") == 40
                # Gauges: one series per pod (no worker's pid), folded over the workers.
                assert _by_pod(series, "lorafleet_pod_healthy") == {"pod-0": 1, "pod-1": 1}
                assert _by_pod(series, "lorafleet_pod_gpu_slots") == {"pod-0": 2, "pod-1": 2}
                assert series[("lorafleet_router_plan_loaded", ())] == 1

            os.kill(workers[1], signal.SIGTERM)  # the other worker keeps serving
            gone = lambda: not Path(f"/proc/{workers[1]}").exists()  # noqa: E731 (reaped)
            wait_for(gone, timeout_s=30, what="the worker's exit")
            for _ in range(4):
                assert _total(_scrape(router.url), "lorafleet_requests_total") == 40
            _send(router.url, 5)
            for _ in range(4):
                series = _scrape(router.url)
                assert _total(series, "lorafleet_requests_total") == 45
                assert _by_pod(series, "lorafleet_pod_healthy") == {"pod-0": 1, "pod-1": 1}
            assert router.terminate() == 0
        finally:
            router.stop()


# --- the fold, from processes of their own ------------------------------------------


def _worker(directory: Path, figures: Callable[[Router], None]) -> int:
    """A forked process that writes ``figures`` of a router's registry as a worker does."""

    def run() -> None:
        record_in(directory)
        figures(_router())

    process = multiprocessing.get_context("fork").Process(target=run)
    process.start()
    process.join(timeout=60)
    assert process.exitcode == 0
    assert process.pid is not None
    return process.pid


class _NoPods:
    description = "none"

    async def upstreams(self) -> tuple[Upstream, ...]:
        return ()


def _router() -> Router:
    plan_source = StaticPlanSource(plan_of({}))
    return Router(plan_source=plan_source, pod_source=_NoPods(), settings=MANUAL.router)


def _figures(
    requests: int, *, healthy: int, queue: int, loads: int, plan: int
) -> Callable[[Router], None]:
    def write(router: Router) -> None:
        metrics, fleet = router.metrics, router.fleet_metrics
        for _ in range(requests):
            metrics.request("a", "gpu_hit", 0.01)
        metrics.pod_healthy.labels(pod="pod-0").set(healthy)
        metrics.queue_depth.labels(pod="pod-0").set(queue)
        metrics.plan_ok.set(plan)
        fleet.load_queue_depth("pod-0", depth=loads)

    return write


def _read(directory: Path) -> Series:
    metrics = RouterMetrics(CollectorRegistry())
    metrics.share(directory)
    return _series(metrics.render().decode())


def test_gauges_fold_over_live_workers_and_counters_keep_exited_ones(tmp_path: Path) -> None:
    first = _worker(tmp_path, _figures(3, healthy=1, queue=2, loads=1, plan=1))
    second = _worker(tmp_path, _figures(5, healthy=0, queue=7, loads=2, plan=0))
    series = _read(tmp_path)
    assert _total(series, "lorafleet_requests_total") == 8
    assert _total(series, "lorafleet_ttft_seconds_count") == 8
    assert series[("lorafleet_ttft_seconds_bucket", (("le", "0.01"), ("outcome", "gpu_hit")))] == 8
    assert _by_pod(series, "lorafleet_pod_healthy") == {"pod-0": 0}  # min: one says down
    assert _by_pod(series, "lorafleet_pod_queue_depth") == {"pod-0": 7}  # max
    assert _by_pod(series, "lorafleet_load_queue_depth") == {"pod-0": 3}  # sum
    assert series[("lorafleet_router_plan_loaded", ())] == 0  # min
    forget_worker(tmp_path, second)  # the parent saw it exit
    series = _read(tmp_path)
    assert _total(series, "lorafleet_requests_total") == 8  # its counts stay
    assert _by_pod(series, "lorafleet_pod_healthy") == {"pod-0": 1}
    assert _by_pod(series, "lorafleet_pod_queue_depth") == {"pod-0": 2}
    assert _by_pod(series, "lorafleet_load_queue_depth") == {"pod-0": 1}
    assert series[("lorafleet_router_plan_loaded", ())] == 1
    forget_worker(tmp_path, first)
    _worker(tmp_path, _figures(1, healthy=1, queue=0, loads=0, plan=1))  # a restarted one
    series = _read(tmp_path)
    assert _total(series, "lorafleet_requests_total") == 9
    assert _by_pod(series, "lorafleet_load_queue_depth") == {"pod-0": 0}


def test_every_gauge_of_the_routers_registry_says_how_it_reads_over_workers() -> None:
    router = _router()
    gauges = {f.name for f in router.metrics.registry.collect() if f.type == "gauge"}
    assert gauges >= {"lorafleet_pod_healthy", "lorafleet_pod_gpu_adapters"}
    assert gauges <= set(GAUGE_ACROSS_WORKERS)
    assert set(GAUGE_ACROSS_WORKERS.values()) <= {"sum", "max", "min"}


# --- the fold, over any workers' figures (files written directly) --------------------

_FOLDED: dict[str, Callable[[list[int]], int]] = {"sum": sum, "max": max, "min": min}
#: prometheus_client's per-process file of values (untyped).
_file = cast(Callable[[str], Any], MmapedDict)


def _write(directory: Path, pid: int, *, count: float, gauges: dict[str, float]) -> None:
    counters = _file(str(directory / f"counter_{pid}.db"))
    key = mmap_key("lorafleet_requests", "lorafleet_requests_total", ["adapter"], ["a"], "h")
    counters.write_value(key, count, 0.0)
    counters.close()
    values = _file(str(directory / f"gauge_all_{pid}.db"))
    for name, value in gauges.items():
        values.write_value(mmap_key(name, name, ["pod"], ["pod-0"], "h"), value, 0.0)
    values.close()


gauge_names = st.sampled_from(sorted(GAUGE_ACROSS_WORKERS))
per_worker = st.tuples(
    st.integers(min_value=0, max_value=10**6),
    st.dictionaries(gauge_names, st.integers(min_value=0, max_value=64), min_size=1),
)


@settings(max_examples=40, deadline=None)
@given(workers=st.lists(per_worker, min_size=1, max_size=5))
def test_any_workers_figures_read_as_their_sum_and_their_gauges_fold(
    workers: list[tuple[int, dict[str, int]]],
) -> None:
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        for pid, (count, gauges) in enumerate(workers, start=100):
            _write(directory, pid, count=count, gauges={k: float(v) for k, v in gauges.items()})
        series = _read(directory)
    assert _total(series, "lorafleet_requests_total") == sum(count for count, _ in workers)
    for gauge, fold in GAUGE_ACROSS_WORKERS.items():
        seen = [gauges[gauge] for _, gauges in workers if gauge in gauges]
        expected = {"pod-0": _FOLDED[fold](seen)} if seen else {}
        assert _by_pod(series, gauge) == expected, gauge
