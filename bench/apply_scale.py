"""Apply plans of about 1,000 actions to 64 emulated vLLM pods and report the wall time.

Target: 1,000 actions over 64 pods within 30 s. Two steps: from empty pods
to plan A (loads and warm-ups), then plan A to plan B (moves: loads, warm-ups, then
unloads). The pods run in a subprocess (``lorafleet emulate``) on real sockets, or
in-process with ``--in-process``; latencies are the emulate command's defaults
(cold load 10 ms + 0.2 ms/MB, GPU swap 25 ms, TTFT 20 ms). The baseline in the same
run is the critical path: the slowest pod's sum of simulated action times, which no
executor can beat; the ratio says how close the executor gets to it.

    .venv/bin/python -m bench.apply_scale [--pods 64] [--in-process]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import httpx

from placement.actuation.apply import apply_plan, make_clients
from placement.actuation.executor import Ledger
from placement.domain import Action, ActionKind, Catalog, PodId
from placement.emulator import EmulatedFleet, Latency, PodConfig
from placement.plan import Plan
from placement.settings import ExecutorSettings
from tests import factories

LATENCY = Latency(load_ms=10.0, load_ms_per_mb=0.2, activate_ms=25.0, ttft_ms=20.0, tpot_ms=5.0)
ADAPTER_MB = 50
N_ADAPTERS = 200
NAMES = [f"ad-{i:03d}" for i in range(N_ADAPTERS)]
HOT, WARM = 4, 8


def _catalog() -> Catalog:
    return factories.catalog(
        *(
            factories.adapter(
                name, size_bytes=ADAPTER_MB * 1_000_000, source=f"s3://adapters/{name}"
            )
            for name in NAMES
        )
    )


def _plan(pods: list[PodId], *, seed: int) -> Plan:
    """HOT adapters hot and WARM warm on each pod, drawn at random from the catalog."""
    rng = random.Random(seed)
    hot: dict[str, list[str]] = {}
    warm: dict[str, list[str]] = {}
    for pod in pods:
        chosen = rng.sample(NAMES, HOT + WARM)
        hot[pod], warm[pod] = chosen[:HOT], chosen[HOT:]
    return factories.make_plan(hot, warm, plan_id=f"bench-{seed}", created=datetime.now(UTC))


def _critical_path_s(actions: tuple[Action, ...]) -> float:
    """The slowest pod's sum of simulated times: a bound no executor beats."""
    per_pod: defaultdict[PodId, float] = defaultdict(float)
    load_ms = LATENCY.cold_ms(ADAPTER_MB * 1_000_000)
    warm_ms = LATENCY.swap_ms(ADAPTER_MB * 1_000_000) + LATENCY.ttft_ms
    for action in actions:
        kind = action.kind
        cost = load_ms if kind is ActionKind.LOAD else warm_ms if kind is ActionKind.WARMUP else 0.0
        per_pod[action.pod] += cost
    return max(per_pod.values(), default=0.0) / 1000.0


def _start_subprocess(n: int, ports_file: Path) -> subprocess.Popen[bytes]:
    """``lorafleet emulate`` on ports of the kernel's choosing, written to ``ports_file``."""
    command = [
        sys.executable, "-c", "from placement.cli import main; main()",
        "emulate", "--pods", str(n), "--port", "0", "--ports-file", str(ports_file),
        "--max-loras", "4", "--max-cpu-loras", "16", "--max-lora-rank", "64",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


async def _pod_ports(ports_file: Path, process: subprocess.Popen[bytes]) -> list[int]:
    """The pods' ports, once the emulate process has written them (every pod listening)."""
    deadline = time.monotonic() + 60
    while not ports_file.exists():
        if process.poll() is not None:
            raise RuntimeError(f"lorafleet emulate exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"lorafleet emulate did not write {ports_file}")
        await asyncio.sleep(0.1)
    urls = json.loads(ports_file.read_text())
    return [httpx.URL(urls[f"pod-{i}"]).port or 0 for i in range(len(urls))]


async def _wait_up(http: httpx.AsyncClient, urls: list[str]) -> None:
    deadline = time.monotonic() + 60
    for url in urls:
        while True:
            try:
                if (await http.get(url + "/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up")
            await asyncio.sleep(0.1)


async def _bench(n: int, *, in_process: bool) -> None:
    config = PodConfig(max_loras=4, max_cpu_loras=16, max_lora_rank=64, latency=LATENCY)
    process: subprocess.Popen[bytes] | None = None
    if in_process:  # no sockets: the URLs only key the in-process transport
        fleet = EmulatedFleet.start(n, config=config)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            process = _start_subprocess(n, Path(scratch) / "pods.json")
            try:
                ports = await _pod_ports(Path(scratch) / "pods.json", process)
            except BaseException:
                process.terminate()
                process.wait(timeout=10)
                raise
        # The same pods, in this process too: their URLs and limits for the planner.
        fleet = EmulatedFleet.start(n, ports=ports, config=config)
    domain = fleet.domain()
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    http = fleet.http() if in_process else httpx.AsyncClient(limits=limits)
    try:
        async with http:
            if process is not None:
                await _wait_up(http, [h.url for h in fleet.handles])
            clients = make_clients(domain, http=http, timeout_s=30.0)
            ledger, catalog = Ledger(), _catalog()
            pods = [pod.name for pod in domain.pods]
            mode = "in-process" if in_process else "sockets (pods in a subprocess)"
            print(f"{n} emulated vLLM pods, {mode}")
            steps = (("empty -> A", _plan(pods, seed=1)), ("A -> B", _plan(pods, seed=2)))
            for label, plan in steps:
                start = time.perf_counter()
                outcome = await apply_plan(
                    plan, fleet=domain, catalog=catalog, clients=clients,
                    settings=ExecutorSettings(), rng=random.Random(0), ledger=ledger,
                )  # fmt: skip
                wall_s = time.perf_counter() - start
                kinds = Counter(a.kind.value for a in outcome.actions)
                bound_s = _critical_path_s(outcome.actions)
                print(
                    f"  {label}: {len(outcome.actions)} actions ({dict(kinds)}), "
                    f"ok={outcome.report.ok}, wall {wall_s:.2f} s, "
                    f"critical path {bound_s:.2f} s, ratio {wall_s / max(bound_s, 1e-9):.2f}, "
                    f"{len(outcome.actions) / wall_s:.0f} actions/s"
                )
            again = time.perf_counter()
            repeat = await apply_plan(
                _plan(pods, seed=2), fleet=domain, catalog=catalog, clients=clients,
                settings=ExecutorSettings(), rng=random.Random(0), ledger=ledger,
            )  # fmt: skip
            print(
                f"  B again: {len(repeat.actions)} actions, "
                f"wall {time.perf_counter() - again:.2f} s"
            )
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--in-process", action="store_true")
    args = parser.parse_args()
    asyncio.run(_bench(args.pods, in_process=args.in_process))


if __name__ == "__main__":
    main()
