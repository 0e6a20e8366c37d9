"""What the router adds: latency at 500 req/s, routing decision time, max throughput.

Runs emulated vLLM pods with zero simulated latency in one child process and the
router in another, and drives both from this process with aiohttp, so every figure
comes with its baseline from the same run (calling the emulated pod directly). Both
children bind port 0 and write the ports they were given to a file this process reads.

    .venv/bin/python -m bench.router_overhead [--seconds 4] [--rate 500] [--profile PATH]

Targets: added latency p50 <= 1 ms and p99 <= 5 ms at 500 req/s; a routing
decision <= 50 us p99 with 64 pods; >= 2,000 req/s through one router process; the
router's CPU per proxied request at most half the emulated pod's in the same run
(``router_over_pod_cpu`` <= 0.5). Both CPU figures are /proc's user plus system time of
the child over the closed-loop phase, background loops (the router's scrapes) included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from bench.routing_latency import make_topology
from placement.plan import Plan, plan_to_json
from placement.router.picking import Picker
from placement.router.state import Topology
from placement.settings import LoadCostSettings, RouterSettings
from tests import factories

# argv: the number of pods, the file to write their ports to (one per line).
PODS_SCRIPT = """
import asyncio, sys
from dataclasses import replace
from pathlib import Path
from placement.emulator import (EmulatedFleet, PodConfig, ZERO_LATENCY, listening_sockets,
    ports_of, serve_fleet)
from placement.inputs.files import write_atomically
config = replace(PodConfig(), max_loras=4, max_cpu_loras=16, latency=ZERO_LATENCY)
sockets = listening_sockets(int(sys.argv[1]))
fleet = EmulatedFleet.start(len(sockets), ports=ports_of(sockets), config=config)
text = "".join(f"{port}\\n" for port in ports_of(sockets))
asyncio.run(serve_fleet(fleet.handles, sockets=sockets,
    on_listening=lambda: write_atomically(Path(sys.argv[2]), text)))
"""

# argv: the pods' ports (comma-separated), the router's port file, the plan, the adapters.
ROUTER_SCRIPT = """
import sys
from functools import partial
from pathlib import Path
from placement.domain import Adapter, AdapterId, Catalog
from placement.emulator import EmulatedFleet, PodConfig
from placement.router.wiring import build_router, run_router, write_port_file
from dataclasses import replace
config = replace(PodConfig(), max_loras=4, max_cpu_loras=16)
ports = [int(port) for port in sys.argv[1].split(",")]
fleet = EmulatedFleet.start(len(ports), ports=ports, config=config).domain()
names = sys.argv[4].split(",")
catalog = Catalog(adapters=tuple(Adapter(name=AdapterId(n), base_model="base-model", rank=8,
    alpha=8.0, target_modules=("q_proj",), dtype="float16", source=f"s3://a/{n}",
    size_bytes=50_000_000) for n in names))
run_router(build_router(fleet=fleet, plan=sys.argv[3], catalog=catalog), host="127.0.0.1",
    port=0, on_listening=partial(write_port_file, Path(sys.argv[2])))
"""

BODY = {"prompt": "hello", "max_tokens": 1}


def _plan(pods: int, adapters: list[str]) -> Plan:
    """Each adapter hot on one pod, dealt round-robin."""
    hot = {f"pod-{k}": adapters[k::pods] for k in range(min(pods, len(adapters)))}
    return factories.make_plan(hot, plan_id="bench", created=datetime.now(UTC))


def _ports_in(path: Path, process: subprocess.Popen[bytes]) -> list[int]:
    """The ports a child wrote to ``path`` once listening, one per line."""
    deadline = time.monotonic() + 60
    while not path.exists():
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing was written to {path}")
        time.sleep(0.05)
    return [int(line) for line in path.read_text().split()]


async def _wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(url) as reply:
                    if reply.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} never came up")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _paced(urls: list[str], models: list[str], rate: float, seconds: float) -> list[float]:
    """Open loop: one request every 1/rate seconds; latency of each in ms."""
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            body = dict(BODY, model=models[i % len(models)])
            started = time.perf_counter()
            async with session.post(urls[i % len(urls)], json=body) as reply:
                await reply.read()
            if reply.status == 200:
                latencies.append((time.perf_counter() - started) * 1000.0)

        tasks, start = [], time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return latencies


async def _closed(
    urls: list[str], models: list[str], workers: int, seconds: float
) -> tuple[float, int, int]:
    """Closed loop with ``workers`` in flight: requests per second, requests, and how
    many of them were not answered 200 (a router that fails fast must not look cheap)."""
    done = failed = 0
    connector = aiohttp.TCPConnector(limit=workers)
    async with aiohttp.ClientSession(connector=connector) as session:
        stop = time.perf_counter() + seconds

        async def worker(k: int) -> None:
            nonlocal done, failed
            i = k
            while time.perf_counter() < stop:
                body = dict(BODY, model=models[i % len(models)])
                async with session.post(urls[i % len(urls)], json=body) as reply:
                    await reply.read()
                done += 1
                failed += reply.status != 200
                i += workers

        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(workers)))
        return done / (time.perf_counter() - started), done, failed


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decision_topology(pods: int, names: list[str], rng: random.Random) -> Topology:
    """The decision's topology: ``routing_latency``'s, with 8 adapters used lately per
    pod; its pre-filter ranks the observed queues, as the router's after a scrape."""
    return make_topology(pods, names, rng, used_per_pod=8)


def _decision_us(pods: int = 64, adapters: int = 2000, calls: int = 20000) -> dict[str, float]:
    """Routing decisions over 64 pods: planned adapters (2 replicas), and unplanned ones."""
    names = [f"a{i}" for i in range(adapters)]
    rng = random.Random(0)
    topology = decision_topology(pods, names, rng)
    picker = Picker(settings=RouterSettings(), load_cost=LoadCostSettings())
    chosen = [rng.choice(names) for _ in range(calls)]
    wall, cpu = [], []
    for name in chosen:
        started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
        picker.pick(topology, name)
        cpu.append((time.thread_time_ns() - started_cpu) / 1000.0)
        wall.append((time.perf_counter_ns() - started) / 1000.0)
    # Wall time includes preemption by other processes on a shared machine; the
    # thread's CPU time is what one decision costs.
    return {
        "wall_p50_us": statistics.median(wall),
        "wall_p99_us": _pct(wall, 0.99),
        "cpu_p50_us": statistics.median(cpu),
        "cpu_p99_us": _pct(cpu, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument(
        "--profile",
        type=Path,
        help="run the router under cProfile, write its stats here and print where its "
        "time goes (the CPU figures of such a run are the profiler's, not the router's)",
    )
    args = parser.parse_args()

    decision = _decision_us()
    print(
        "routing decision, 64 pods (us):", json.dumps({k: round(v, 1) for k, v in decision.items()})
    )

    models = [f"lora-{i}" for i in range(2 * args.pods)]
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = Path(tmp) / "plan.json"
        plan_path.write_text(plan_to_json(_plan(args.pods, models)))
        pods_file, router_file = Path(tmp) / "pods.ports", Path(tmp) / "router.port"
        pods = subprocess.Popen([sys.executable, "-c", PODS_SCRIPT, str(args.pods), str(pods_file)])
        router = None
        try:
            pod_ports = _ports_in(pods_file, pods)
            router = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    ROUTER_SCRIPT if args.profile is None else _profiled(args.profile),
                    ",".join(map(str, pod_ports)),
                    str(router_file),
                    str(plan_path),
                    ",".join(models),
                ],
                stderr=subprocess.DEVNULL,
            )
            (router_port,) = _ports_in(router_file, router)
            args.pods_pid, args.router_pid = pods.pid, router.pid
            asyncio.run(_run(args, pod_ports, router_port, models))
        finally:
            for child in (router, pods):
                if child is not None:
                    child.terminate()
                    child.wait()
    if args.profile is not None:
        _print_profile(args.profile)


def _profiled(path: Path) -> str:
    """The router's script under cProfile (its main thread: the event loop), the stats
    written when it ends."""
    # From the serving on (not the imports), in CPU time (a shared machine's preemption
    # is not the router's); uvicorn raises SIGTERM again once it has shut down: here
    # that ends the script, and the stats are written.
    assert "\nrun_router(" in ROUTER_SCRIPT
    script = ROUTER_SCRIPT.replace("\nrun_router(", "\n_profile.enable()\nrun_router(")
    return (
        "import cProfile, signal, time\n"
        "def _end(*_):\n    raise SystemExit(0)\n"
        "signal.signal(signal.SIGTERM, _end)\n"
        "_profile = cProfile.Profile(time.thread_time)\n"
        f"try:\n    exec({script!r})\n"
        f"finally:\n    _profile.disable()\n    _profile.dump_stats({str(path)!r})\n"
    )


#: Where a function's own time goes, by the file it is in (first match).
_AREAS = (
    ("lorafleet", "/placement/"),
    ("lorafleet policies", "/policies/"),
    ("aiohttp (upstream client)", "/aiohttp/"),
    ("uvicorn, httptools (server)", "uvicorn"),
    ("asyncio", "/asyncio/"),
    ("prometheus_client", "prometheus_client"),
)


def _print_profile(path: Path) -> None:
    stats = pstats.Stats(str(path))
    own: dict[str, float] = {}
    total = 0.0
    for (filename, _line, _name), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]  # typeshed's Stats has no stats
        area = next((label for label, part in _AREAS if part in filename), None)
        if area is None:
            area = "C (sockets, parsers, builtins)" if filename == "~" else "other Python"
        own[area] = own.get(area, 0.0) + tottime
        total += tottime
    print("router's own CPU time by area (cProfile, main thread, while serving):")
    for area, seconds in sorted(own.items(), key=lambda item: -item[1]):
        print(f"  {area:34s} {seconds:7.2f} s  {100 * seconds / total:5.1f}%")
    stats.sort_stats("tottime").print_stats(25)


async def _run(
    args: argparse.Namespace, pod_ports: list[int], router_port: int, models: list[str]
) -> None:
    pod_urls = [f"http://127.0.0.1:{port}" for port in pod_ports]
    direct = [f"{url}/v1/completions" for url in pod_urls]
    routed = [f"http://127.0.0.1:{router_port}/v1/completions"]
    for url in pod_urls:
        await _wait_up(f"{url}/health")
    await _wait_up(f"http://127.0.0.1:{router_port}/healthz")
    # Direct calls need the adapters registered; the router loads them itself.
    async with aiohttp.ClientSession() as session:
        for i, name in enumerate(models):
            body = {"lora_name": name, "lora_path": f"s3://a/{name}"}
            async with session.post(f"{pod_urls[i % args.pods]}/v1/load_lora_adapter", json=body):
                pass
    pod_models = [[m for j, m in enumerate(models) if j % args.pods == i] for i in range(args.pods)]
    direct_models = [pod_models[i % args.pods][(i // args.pods) % 2] for i in range(2 * args.pods)]
    await _paced(routed, models, 100, 1.0)  # warm-up: loads, connections
    lat_direct = await _paced(direct, direct_models, args.rate, args.seconds)
    lat_routed = await _paced(routed, models, args.rate, args.seconds)
    sent = int(args.rate * args.seconds)
    result = {
        "rate_rps": args.rate,
        "direct_failed": sent - len(lat_direct),
        "routed_failed": sent - len(lat_routed),
        "direct_p50_ms": _pct(lat_direct, 0.5),
        "direct_p99_ms": _pct(lat_direct, 0.99),
        "routed_p50_ms": _pct(lat_routed, 0.5),
        "routed_p99_ms": _pct(lat_routed, 0.99),
    }
    result["added_p50_ms"] = result["routed_p50_ms"] - result["direct_p50_ms"]
    result["added_p99_ms"] = result["routed_p99_ms"] - result["direct_p99_ms"]
    pods_cpu = _cpu_s(args.pods_pid)
    direct_rps, direct_n, direct_not_200 = await _closed(direct, direct_models, 64, args.seconds)
    pods_cpu_per_request = (_cpu_s(args.pods_pid) - pods_cpu) / direct_n
    router_cpu = _cpu_s(args.router_pid)
    routed_rps, routed_n, routed_not_200 = await _closed(routed, models, 64, args.seconds)
    router_cpu_per_request = (_cpu_s(args.router_pid) - router_cpu) / routed_n
    # What one router process could carry on a core of its own: 1 / its CPU per request.
    result["router_cpu_us_per_request"] = router_cpu_per_request * 1e6
    result["pod_cpu_us_per_request"] = pods_cpu_per_request * 1e6
    # Target: at most 0.5 (the router costs at most half of what the pod it fronts does).
    result["router_over_pod_cpu"] = router_cpu_per_request / pods_cpu_per_request
    result["router_capacity_rps_per_core"] = 1.0 / router_cpu_per_request
    result["direct_max_rps"] = direct_rps
    result["routed_max_rps"] = routed_rps
    result["routed_over_direct"] = routed_rps / direct_rps
    result["closed_loop_not_200"] = direct_not_200 + routed_not_200
    print(json.dumps({k: round(v, 3) for k, v in result.items()}, indent=2))


if __name__ == "__main__":
    main()
