"""What one ``/metrics`` over N router workers costs: the render, and the metrics' share
of a request on the hot path.

The router's registry (``RouterMetrics``, ``FleetMetrics``, ``WarmupMetrics``, as
``router.core.Router`` builds it) is filled with ``--adapters`` adapters' request
counts and TTFTs and ``--pods`` pods' gauges, loads and residencies. One worker: the
registry in memory, rendered as ``/metrics`` renders it. N workers: N forked processes
each write the same figures to their files (``router.metrics.record_in``, as
``router.workers`` does) and exit, and ``/metrics`` is rendered from their files
(``RouterMetrics.share``). Render CPU is this thread's (``time.thread_time``), the
median of ``--renders``.

Hot path: a request's metrics (``RouterMetrics.request`` with a TTFT, and
``request_queued``), ``--ops`` times, in memory (one worker) and in a forked process
writing files (N workers): thread CPU per request.

    .venv/bin/python -m bench.router_metrics [--workers 1,2] [--adapters 500] [--pods 16]
        [--renders 30] [--ops 100000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from prometheus_client import CollectorRegistry

from placement.metrics import FleetMetrics
from placement.router.metrics import RouterMetrics, record_in
from placement.router.warmups import WarmupMetrics

OUTCOMES = ("gpu_hit", "cpu_hit", "cold_load")
LOOPS = ("scrape", "plan", "pods", "log")


def _registry() -> tuple[RouterMetrics, FleetMetrics]:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    fleet = FleetMetrics(registry)
    WarmupMetrics(registry)
    return metrics, fleet


def _fill(metrics: RouterMetrics, fleet: FleetMetrics, adapters: int, pods: int) -> None:
    for i in range(adapters):
        label = metrics.adapter_label(f"adapter-{i}", known=True)
        for j, outcome in enumerate(OUTCOMES):
            metrics.request(label, outcome, 0.01 * (1 + j))
    for cause in ("none", "load", "pressure"):
        metrics.request_queued(cause, 0.002)
    for p in range(pods):
        pod = f"pod-{p}"
        metrics.queue_depth.labels(pod=pod).set(p % 3)
        metrics.pod_healthy.labels(pod=pod).set(1)
        metrics.metrics_missing.labels(pod=pod).set(0)
        metrics.loads.labels(pod=pod, reason="cold").inc()
        metrics.adapter_loaded(source="storage", queued_s=0.0, started_s=0.01, finished_s=0.2)
        fleet.pod_slots(pod, slots=8)
        fleet.load_queue_depth(pod, depth=p % 2)
        held = [f"adapter-{(p * 8 + k) % max(1, adapters)}" for k in range(8)]
        fleet.observe_gpu(pod, held, now_s=0.0)
        fleet.observe_gpu(pod, held[1:], now_s=60.0)
    for loop in LOOPS:
        metrics.loop_failures.labels(loop=loop).set(0)
    metrics.plan_ok.set(1)


def _render_cpu_us(metrics: RouterMetrics, renders: int) -> tuple[float, int]:
    """Median thread CPU of one render, in us, and the body's size."""
    times: list[float] = []
    body = b""
    for _ in range(renders):
        start = time.thread_time()
        body = metrics.render()
        times.append(time.thread_time() - start)
    return 1e6 * statistics.median(times), len(body)


def _hot_path_us(metrics: RouterMetrics, ops: int) -> float:
    """Thread CPU of one request's metrics, in us."""
    label = metrics.adapter_label("adapter-0", known=True)
    start = time.thread_time()
    for _ in range(ops):
        metrics.request(label, "gpu_hit", 0.02)
        metrics.request_queued("none", 0.0005)
    return 1e6 * (time.thread_time() - start) / ops


def _worker(directory: Path, args: argparse.Namespace, answer: Connection) -> None:
    """One forked worker: its figures written to its files, and its hot path timed."""
    record_in(directory)
    metrics, fleet = _registry()
    _fill(metrics, fleet, args.adapters, args.pods)
    answer.send(_hot_path_us(metrics, args.ops))


def _run(workers: int, args: argparse.Namespace) -> dict[str, object]:
    if workers == 1:
        metrics, fleet = _registry()
        _fill(metrics, fleet, args.adapters, args.pods)
        hot_us = _hot_path_us(metrics, args.ops)
        render_us, size = _render_cpu_us(metrics, args.renders)
        return {"workers": 1, "render_cpu_us": render_us, "bytes": size, "hot_path_us": hot_us}
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="lorafleet-metrics-bench-") as name:
        directory = Path(name)
        hot: list[float] = []
        for _ in range(workers):  # one at a time: each its own core's worth
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_worker, args=(directory, args, send))
            process.start()
            hot.append(float(receive.recv()))
            process.join()
        reader = RouterMetrics(CollectorRegistry())
        reader.share(directory)
        render_us, size = _render_cpu_us(reader, args.renders)
        files = sum(1 for _ in directory.iterdir())
    return {
        "workers": workers,
        "render_cpu_us": render_us,
        "bytes": size,
        "files": files,
        "hot_path_us": statistics.median(hot),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--adapters", type=int, default=500)
    parser.add_argument("--pods", type=int, default=16)
    parser.add_argument("--renders", type=int, default=30)
    parser.add_argument("--ops", type=int, default=100_000)
    args = parser.parse_args()
    for count in args.workers.split(","):
        run = _run(int(count), args)
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in run.items()}))


if __name__ == "__main__":
    main()
