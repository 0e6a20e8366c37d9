"""The router's added latency at a fixed open-loop rate, with cores of its own.

Starts N emulated vLLM pods (one process each) and the lorafleet router as separate
processes through bench/gpu/launch.py, each pinned to its own cores
(sched_setaffinity), writes fleet.yaml, catalog.yaml and plan.json to a temporary
directory, and from this process (pinned to other cores) sends the same Poisson
arrival sequence of non-streamed completions, each naming an adapter as its model,
once directly to the pod that holds the adapter and once through the router.

The processes are ``router_fleet``'s, the load ``router_load``'s; this script runs the
phases within its time cap and writes the JSON.

    python bench/gpu/router_latency.py --rate 500 --seconds 30 --out router.json
    python bench/gpu/router_latency.py --rate 50 --seconds 5      # smoke test

Reports p50/p90/p95/p99/p99.9 of each, the router's added latency, the achieved rate,
errors, how late the generator sent (to show that it kept up), the router's CPU per
request, and a short closed-loop maximum throughput of each path. Every child binds
port 0 and writes the port the kernel gave it to a file this process waits for, so
no port is ever chosen here and taken by another process before the child binds it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp

if not __package__:  # run as a file: the repository root on the path, for bench.gpu
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.router_fleet import (
    HOST,
    Fleet,
    core_layout,
    cpu_s,
    start_fleet,
    stop_children,
    wait_healthy,
)
from bench.gpu.router_load import arrivals, closed_loop, open_loop


def log(*parts: Any) -> None:
    print("[router]", *parts, flush=True)


class Result:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, Any] = {"bench": "router_latency", "errors": []}

    def save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.data, indent=2, default=str))


async def run(args: argparse.Namespace, result: Result, procs: dict[str, Any]) -> None:
    """Start the fleet, load the adapters, warm both paths up, then the open-loop
    rounds (direct and routed, alternating) and the closed-loop maximum of each."""
    data = result.data
    deadline = time.monotonic() + args.time_cap
    layout = core_layout(args.router_cores, args.pod_cores, args.gen_cores)
    data["cores"] = layout
    log("cores:", json.dumps({k: v for k, v in layout.items() if k != "all"}))
    adapters = [f"lora-{i}" for i in range(args.pods * args.adapters_per_pod)]
    tmp = Path(tempfile.mkdtemp(prefix="lorafleet-router-bench-"))
    procs["tmp"] = tmp
    started = time.monotonic()
    up_by = started + args.start_timeout
    fleet = await start_fleet(args, layout, adapters=adapters, tmp=tmp, up_by=up_by, procs=procs)
    data["ports"] = {"pods": fleet.pod_ports, "router": fleet.router_port}
    os.sched_setaffinity(0, set(layout["gen"]))

    direct_url = {
        name: f"http://{HOST}:{fleet.pod_ports[i % args.pods]}/v1/completions"
        for i, name in enumerate(adapters)
    }
    routed_url = {name: f"http://{HOST}:{fleet.router_port}/v1/completions" for name in adapters}
    connector = aiohttp.TCPConnector(limit=args.connections, limit_per_host=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        await wait_healthy(session, fleet, up_by)
        data["startup_s"] = round(time.monotonic() - started, 2)
        log(f"pods and router up in {data['startup_s']} s; {len(adapters)} adapters")
        await _load_adapters(session, adapters, fleet.pod_ports)
        await asyncio.sleep(1.0)  # let the router scrape every pod once or twice
        # Warm-up both paths: connections, the router's ledger, the JIT-free caches.
        warm = arrivals(100.0, args.warmup_s, adapters, args.seed + 1)
        data["warmup_direct"] = (await open_loop(session, warm, direct_url, 1, 10.0))["errors"]
        data["warmup_routed"] = (await open_loop(session, warm, routed_url, 1, 10.0))["errors"]
        log("warm-up errors:", data["warmup_direct"], data["warmup_routed"])

        schedule = arrivals(args.rate, args.seconds, adapters, args.seed)
        data["config"] = _config(args, requests=len(schedule), adapters=len(adapters))
        urls_of = {"direct": direct_url, "routed": routed_url}
        await _open_rounds(session, args, result, fleet, schedule, urls_of, deadline=deadline)
        _added(data)
        result.save()
        await _closed_rounds(session, args, result, fleet, adapters, urls_of, deadline=deadline)


async def _load_adapters(
    session: aiohttp.ClientSession, adapters: list[str], pod_ports: list[int]
) -> None:
    """Each adapter onto the pod the plan gives it (round robin, as write_inputs)."""
    for i, name in enumerate(adapters):
        body = {"lora_name": name, "lora_path": f"s3://adapters/{name}"}
        url = f"http://{HOST}:{pod_ports[i % len(pod_ports)]}/v1/load_lora_adapter"
        async with session.post(url, json=body) as reply:
            await reply.read()


def _config(args: argparse.Namespace, *, requests: int, adapters: int) -> dict[str, Any]:
    return {
        "rate_rps": args.rate,
        "seconds": args.seconds,
        "requests": requests,
        "pods": args.pods,
        "adapters": adapters,
        "pod_ttft_ms": args.pod_ttft_ms,
        "pod_tpot_ms": args.pod_tpot_ms,
        "max_tokens": args.max_tokens,
        "python": sys.version.split()[0],
        "aiohttp": aiohttp.__version__,
        "loop": type(asyncio.get_running_loop()).__module__,
    }


async def _open_rounds(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    result: Result,
    fleet: Fleet,
    schedule: list[tuple[float, str]],
    urls_of: dict[str, dict[str, str]],
    *,
    deadline: float,
) -> None:
    """``--rounds`` direct/routed pairs of the same arrivals, each with the pods' and the
    router's CPU per request; stops before a round that would pass the time cap."""
    data = result.data
    order = ["direct", "routed"] * args.rounds
    for index, path in enumerate(order):
        if time.monotonic() > deadline - args.seconds - 5:
            data["errors"].append(f"time cap: skipped {path} round {index // 2}")
            break
        pods_cpu = sum(cpu_s(c.pid) for c in fleet.pods)
        router_cpu = cpu_s(fleet.router.pid)
        log(f"{path}: {len(schedule)} requests over {args.seconds:g} s ...")
        got = await open_loop(session, schedule, urls_of[path], args.max_tokens, 30.0)
        n = max(got["ok"], 1)
        got["pods_cpu_us_per_request"] = (
            (sum(cpu_s(c.pid) for c in fleet.pods) - pods_cpu) / n * 1e6
        )
        got["router_cpu_us_per_request"] = (cpu_s(fleet.router.pid) - router_cpu) / n * 1e6
        key = path if args.rounds == 1 else f"{path}_{index // 2}"
        data[key] = got
        lat = got["latency"]
        log(
            f"{path}: ok {got['ok']}/{got['sent']} errors {got['errors']} "
            f"achieved {got['achieved_rps']:.1f}/s p50 {lat['p50_ms']:.3f} "
            f"p99 {lat['p99_ms']:.3f} ms, send lag p99 {got['send_lag_ms']['p99']:.2f} ms"
            if lat["p50_ms"] is not None
            else f"{path}: no successful request; errors {got['errors']}"
        )
        result.save()


def _added(data: dict[str, Any]) -> None:
    """The routed path's latency minus the direct path's, each the median over rounds."""
    runs = {
        path: [
            data[k]
            for k in data
            if k.startswith(path) and isinstance(data[k], dict) and "latency" in data[k]
        ]
        for path in ("direct", "routed")
    }
    direct, routed = runs["direct"], runs["routed"]
    if direct and routed:
        added = {}
        for q in ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms"):
            d = statistics.median(x["latency"][q] for x in direct if x["latency"][q] is not None)
            r = statistics.median(x["latency"][q] for x in routed if x["latency"][q] is not None)
            added[q] = r - d
        data["added_ms"] = added
        log("added latency (ms):", json.dumps({k: round(v, 3) for k, v in added.items()}))


async def _closed_rounds(
    session: aiohttp.ClientSession,
    args: argparse.Namespace,
    result: Result,
    fleet: Fleet,
    adapters: list[str],
    urls_of: dict[str, dict[str, str]],
    *,
    deadline: float,
) -> None:
    """The closed-loop maximum of each path (64 workers), when the time cap allows both."""
    data = result.data
    if args.closed_seconds > 0 and time.monotonic() < deadline - 2 * args.closed_seconds - 3:
        for path, urls in urls_of.items():
            router_cpu = cpu_s(fleet.router.pid)
            got = await closed_loop(session, adapters, urls, 64, args.closed_seconds)
            got["router_cpu_us_per_request"] = (
                (cpu_s(fleet.router.pid) - router_cpu) / max(got["ok"], 1) * 1e6
            )
            data[f"closed_{path}"] = got
            log(
                f"closed loop {path}: {got['rps']:.0f} req/s (ok {got['ok']}, "
                f"failed {got['failed']})"
            )
        result.save()
    elif args.closed_seconds > 0:
        data["errors"].append("time cap: skipped the closed-loop runs")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=1, help="direct/routed pairs")
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--adapters-per-pod", type=int, default=2)
    parser.add_argument("--pod-ttft-ms", type=float, default=0.0)
    parser.add_argument("--pod-tpot-ms", type=float, default=0.0)
    parser.add_argument("--pod-uvloop", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--router-cores", type=int, default=2)
    parser.add_argument("--pod-cores", type=int, default=4)
    parser.add_argument("--gen-cores", type=int, default=2)
    parser.add_argument("--connections", type=int, default=1024)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--closed-seconds", type=float, default=5.0)
    parser.add_argument("--start-timeout", type=float, default=60.0)
    parser.add_argument("--time-cap", type=float, default=150.0, help="stop new phases after")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    result = Result(args.out)
    procs: dict[str, Any] = {}

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    runner: Callable[[Coroutine[Any, Any, None]], None]
    try:
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:
            runner = asyncio.run
        runner(run(args, result, procs))
    except BaseException as exc:
        result.data["errors"].append(f"{type(exc).__name__}: {exc}")
        log("FAILED:", type(exc).__name__, exc)
    finally:
        stop_children(procs)
        tmp = procs.get("tmp")
        if tmp is not None:
            tails = {}
            for name in ("router.log", "pod-0.log"):
                path = tmp / name
                if path.exists():
                    tails[name] = path.read_text(errors="replace")[-1500:]
            result.data["log_tails"] = tails
            shutil.rmtree(tmp, ignore_errors=True)
        result.save()
    if result.data["errors"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
