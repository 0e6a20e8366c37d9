"""Throughput against router worker count, and the loads the pods paid, on one trace.

Emulated vLLM pods (zero simulated latency) run in one child process; for each worker
count, ``lorafleet router --workers N`` runs in front of them (the pods restarted
empty first), and this process sends the same trace through it: a closed loop over
``--connections`` keep-alive connections, ``--requests`` requests for adapters the
plan places (one pod each; ``--unplanned``: also some it does not), all cold at first.

Per run: requests/s (wall), the router's CPU (parent and workers, from /proc), requests
per router CPU second, the busiest worker's CPU share, and the capacity the workers
would have with a core each (requests over the busiest worker's CPU seconds: the
figure that scales with workers when the machine is not shared), the workers' CPU share
when idle (their scrapes and polls, measured for ``--idle-s`` before the trace from
/proc's schedstat; each worker's in ``idle_cpu_share_each``, in fork order: worker 0,
which scrapes for all, first), the
rate the workers would carry at saturation with a core each (``saturation_rps_core_each``:
each worker's core spends its idle share on its rounds and the rest on requests at its
own CPU per request, less its idle rounds during the trace; the router saturates when
the worker with the largest share of the requests does, so the kernel's uneven split of
the connections counts), and the loads and GPU activations the pods made (their
``/admin/stats`` counters). Extra loads: those of N workers less those of 1 (the
workers' claims, ``router.load_claims``, make a cold adapter's first load agree across
workers). With ``--unplanned N`` (adapters outside the plan, hashed by each worker's own
queue counts) or long queues, loads can differ between runs of one worker count too; by
default every adapter is planned.

Of the two figures, ``saturation_rps_core_each`` is the one that reads "requests per
second of router CPU with a core per worker": the trace runs at the rate this machine's
pods and driver allow (a fraction of the router's), so ``capacity_rps_core_each``
charges the workers' time-driven rounds over the whole run to the requests, where at
saturation a core spends only their idle share on them.

What explains a ratio: ``connections_each`` (each worker's established connections a
quarter into the trace, from /proc/net/tcp), ``reconnects`` (connections the client
opened past its first ones: the workers closing what one holds past its share),
``wakeups_per_request`` and ``preemptions_per_request`` (the workers' main threads'
voluntary and involuntary context switches). ``--alone N`` also runs N one-process
routers side by side, each over 1/N of the connections and of the trace, sharing
nothing: the processes of ``--workers N`` without the workers' agreement, so that
``cpu_over_alone`` (the workers' CPU per request over theirs) tells what the workers'
sharing costs from what a second busy process costs on the machine.

    .venv/bin/python -m bench.router_workers [--workers 1,2] [--requests 3000]
        [--connections 32] [--unplanned 0] [--idle-s 2] [--alone 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import aiohttp

from bench.router_overhead import PODS_SCRIPT, _cpu_s, _ports_in
from placement.plan import plan_to_json
from tests import factories

LORAFLEET = Path(sys.executable).parent / "lorafleet"


def _fleet_yaml(ports: list[int]) -> str:
    pods = "".join(
        f'      - {{name: pod-{i}, url: "http://127.0.0.1:{port}"}}\n'
        for i, port in enumerate(ports)
    )
    return (
        "pools:\n  - name: emulated\n    base_model: llama-3.1-8b\n"
        "    served_model_name: base-model\n    engine: vllm\n    max_lora_rank: 64\n"
        f"    pod_defaults: {{max_loras: 4, max_cpu_loras: 16}}\n    pods:\n{pods}"
    )


def _catalog_yaml(names: list[str]) -> str:
    return "adapters:\n" + "".join(
        f"  - {{name: {n}, base_model: llama-3.1-8b, rank: 8, source: s3://a/{n}}}\n" for n in names
    )


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(part) for part in path.read_text().split()] if path.exists() else []


def _run_s(pid: int) -> float:
    """CPU seconds the process's live threads ran, to the nanosecond (/proc schedstat;
    /proc/PID/stat counts in clock ticks, 10 ms, too coarse for a few idle seconds)."""
    total_ns = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total_ns += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
    return total_ns / 1e9


def _switches(pid: int) -> tuple[int, int]:
    """A process's main thread's voluntary (it slept: a wake-up each) and involuntary
    (preempted) context switches, from /proc."""
    fields = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"])


def _connections_of(pids: list[int], port: int) -> list[int]:
    """The established connections to ``port`` each process holds (/proc/net/tcp*)."""
    inodes: dict[str, int] = {}
    for index, pid in enumerate(pids):
        with contextlib.suppress(FileNotFoundError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes[link[8:-1]] = index
    counts = [0] * len(pids)
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == "01" and fields[9] in inodes:
                    counts[inodes[fields[9]]] += 1
    return counts


async def _drive(
    url: str, trace: list[str], connections: int, *, on_quarter: Callable[[], None]
) -> tuple[float, int, int]:
    """The trace over ``connections`` keep-alive connections; seconds taken, 200s, and
    the connections opened past the first ``connections`` (the workers' rebalancing).
    ``on_quarter`` runs once, a quarter of the way through (every connection open)."""
    connector = aiohttp.TCPConnector(limit=connections)
    ok = 0
    reconnects = -connections  # the first of each connection is no reconnect
    opened = aiohttp.TraceConfig()

    async def count_opened(*_: object) -> None:
        nonlocal reconnects
        reconnects += 1

    opened.on_connection_create_end.append(count_opened)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[opened]) as session:
        position = 0

        async def worker() -> None:
            nonlocal position, ok
            while position < len(trace):
                model = trace[position]
                position += 1
                if position == len(trace) // 4:
                    on_quarter()
                body = {"model": model, "prompt": "hello", "max_tokens": 1}
                async with session.post(f"{url}/v1/completions", json=body) as reply:
                    await reply.read()
                    ok += reply.status == 200

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return time.perf_counter() - started, ok, reconnects


async def _pods_admin(ports: list[int], action: str) -> dict[str, int]:
    """Restart every pod empty (``restart``) or sum their counters (``counters``)."""
    total: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:
        for port in ports:
            base = f"http://127.0.0.1:{port}/admin"
            if action == "restart":
                async with session.post(f"{base}/restart") as reply:
                    await reply.read()
            else:
                async with session.get(f"{base}/stats") as reply:
                    stats = await reply.json()
                for name, count in stats["counters"].items():
                    total[name] = total.get(name, 0) + int(count)
    return total


async def _ready(url: str, deadline_s: float) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline_s:
            try:
                async with session.get(f"{url}/readyz") as reply:
                    if reply.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} never became ready")


def _start_router(
    workers: int, tmp: Path, *, name: str
) -> tuple[subprocess.Popen[bytes], int, IO[bytes]]:
    """``lorafleet router --workers N`` ready on a port of the kernel's choosing."""
    port_file = tmp / f"{name}.port"
    command = [
        str(LORAFLEET), "router", "--fleet", str(tmp / "fleet.yaml"),
        "--plan", str(tmp / "plan.json"), "--catalog", str(tmp / "catalog.yaml"),
        "--port", "0", "--port-file", str(port_file), "--workers", str(workers),
    ]  # fmt: skip
    errors = (tmp / f"{name}.stderr").open("wb")
    router = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
    try:
        (port,) = _ports_in(port_file, router)
        asyncio.run(_ready(f"http://127.0.0.1:{port}", time.monotonic() + 60))
    except RuntimeError:
        router.kill()
        errors.close()
        tail = (tmp / f"{name}.stderr").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"router --workers {workers} did not start:\n{tail}") from None
    return router, port, errors


def _run_alone(
    routers: int, args: argparse.Namespace, tmp: Path, ports: list[int]
) -> dict[str, Any]:
    """``routers`` one-process routers side by side, each driven over its share of the
    connections and of the trace: the processes of ``--workers N``, sharing nothing."""
    asyncio.run(_pods_admin(ports, "restart"))
    started = [_start_router(1, tmp, name=f"alone-{i}") for i in range(routers)]
    try:
        pids = [(_children(router.pid) or [router.pid])[0] for router, _, _ in started]
        time.sleep(3.0 + args.idle_s)  # as long as the workers' runs wait
        before = {pid: _cpu_s(pid) for pid in pids}
        share = args.connections // routers

        async def drive() -> list[tuple[float, int, int]]:
            return await asyncio.gather(*(
                _drive(f"http://127.0.0.1:{port}", args.trace[i::routers], share,
                       on_quarter=lambda: None)
                for i, (_, port, _) in enumerate(started)
            ))  # fmt: skip

        driven = asyncio.run(drive())
        spent = [_cpu_s(pid) - before[pid] for pid in pids]
    finally:
        for router, _, errors in started:
            router.terminate()
            router.wait(timeout=60)
            errors.close()
    ok = sum(got for _, got, _ in driven)
    return {
        "alone": routers,
        "requests_ok": ok,
        "rps": ok / max(seconds for seconds, _, _ in driven),
        "router_cpu_s": [round(cpu_s, 3) for cpu_s in spent],
        "cpu_us_per_request": 1e6 * sum(spent) / max(ok, 1),
    }


def _run(workers: int, args: argparse.Namespace, tmp: Path, ports: list[int]) -> dict[str, Any]:
    asyncio.run(_pods_admin(ports, "restart"))
    before_run = asyncio.run(_pods_admin(ports, "counters"))  # counters outlive restarts
    router, port, errors = _start_router(workers, tmp, name=f"router-{workers}")
    url = f"http://127.0.0.1:{port}"
    try:
        pids = [router.pid, *_children(router.pid)]
        # What the workers spend with no requests (their scrapes and plan polls), per
        # second, to tell it from what the requests cost.
        time.sleep(3.0)  # past the start's first rounds
        idle = {pid: _run_s(pid) for pid in pids}
        time.sleep(args.idle_s)
        idle_rate = {pid: (_run_s(pid) - idle[pid]) / args.idle_s for pid in pids}
        before = {pid: _cpu_s(pid) for pid in pids}
        workers_only = pids[1:] or pids
        switched = {pid: _switches(pid) for pid in workers_only}
        split: list[int] = []

        def count_connections() -> None:
            split.extend(_connections_of(workers_only, port))

        seconds, ok, reconnects = asyncio.run(
            _drive(url, args.trace, args.connections, on_quarter=count_connections)
        )
        spent = {pid: _cpu_s(pid) - before[pid] for pid in pids}
        switches = [
            [b - a for a, b in zip(switched[pid], _switches(pid), strict=True)]
            for pid in workers_only
        ]
        after_run = asyncio.run(_pods_admin(ports, "counters"))
    finally:
        router.terminate()
        router.wait(timeout=60)
        errors.close()
    cpu_s = sum(spent.values())
    busiest_s = max(spent[pid] for pid in workers_only)
    # At saturation each worker's core does its idle rounds and its share of the
    # requests (the kernel's split of the connections, as in this run): the router
    # saturates when the worker with the most request CPU does.
    request_cpu_s = {pid: max(1e-9, spent[pid] - idle_rate[pid] * seconds) for pid in pids}
    saturation_rps = min(ok * (1.0 - idle_rate[pid]) / request_cpu_s[pid] for pid in workers_only)
    return {
        "workers": workers,
        "requests_ok": ok,
        "rps": ok / seconds,
        "router_cpu_s": cpu_s,
        "requests_per_router_cpu_s": ok / cpu_s,
        "worker_cpu_s": [round(spent[pid], 3) for pid in pids[1:]] or [round(cpu_s, 3)],
        "connections_each": split,
        "reconnects": reconnects,
        "wakeups_per_request": sum(v for v, _ in switches) / max(ok, 1),
        "preemptions_per_request": sum(n for _, n in switches) / max(ok, 1),
        "busiest_worker_cpu_share": busiest_s / seconds,
        "capacity_rps_core_each": ok / busiest_s,
        "saturation_rps_core_each": saturation_rps,
        "request_cpu_us": 1e6 * sum(request_cpu_s[pid] for pid in workers_only) / ok,
        "cpu_us_per_request": 1e6 * sum(spent[pid] for pid in workers_only) / ok,
        "idle_cpu_share": sum(idle_rate.values()),
        "idle_cpu_share_each": [round(idle_rate[pid], 4) for pid in workers_only],
        **{
            f"pod_{name}": after_run.get(name, 0) - before_run.get(name, 0)
            for name in ("loads", "gpu_activations", "gpu_evictions")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument(
        "--unplanned", type=int, default=0, help="adapters the plan does not place (hashed)"
    )
    parser.add_argument("--idle-s", type=float, default=2.0, help="idle CPU measured first")
    parser.add_argument(
        "--alone",
        type=int,
        default=0,
        help="also N one-process routers side by side, sharing nothing (0: not run)",
    )
    args = parser.parse_args()
    planned = [f"lora-{i}" for i in range(4 * args.pods)]
    unplanned = [f"extra-{i}" for i in range(args.unplanned)]
    args.trace = [
        unplanned[i % len(unplanned)] if unplanned and i % 10 == 9 else planned[i % len(planned)]
        for i in range(args.requests)
    ]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        pods_file = tmp / "pods.ports"
        pods = subprocess.Popen([sys.executable, "-c", PODS_SCRIPT, str(args.pods), str(pods_file)])
        try:
            ports = _ports_in(pods_file, pods)
            (tmp / "fleet.yaml").write_text(_fleet_yaml(ports))
            (tmp / "catalog.yaml").write_text(_catalog_yaml(planned + unplanned))
            hot = {f"pod-{k}": planned[k :: args.pods] for k in range(args.pods)}
            (tmp / "plan.json").write_text(
                plan_to_json(factories.make_plan(hot, plan_id="w", created=datetime.now(UTC)))
            )
            runs = [_run(int(n), args, tmp, ports) for n in args.workers.split(",")]
            alone = _run_alone(args.alone, args, tmp, ports) if args.alone > 1 else None
        finally:
            pods.terminate()
            pods.wait()
    base = runs[0]
    for run in runs:
        run["capacity_over_first"] = run["capacity_rps_core_each"] / base["capacity_rps_core_each"]
        run["saturation_over_first"] = (
            run["saturation_rps_core_each"] / base["saturation_rps_core_each"]
        )
        run["extra_loads_over_first"] = run["pod_loads"] - base["pod_loads"]
        run["extra_activations_over_first"] = (
            run["pod_gpu_activations"] - base["pod_gpu_activations"]
        )
        if alone is not None and run["workers"] == alone["alone"]:
            run["cpu_over_alone"] = run["cpu_us_per_request"] / alone["cpu_us_per_request"]
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in run.items()}))
    if alone is not None:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in alone.items()}))


if __name__ == "__main__":
    main()
