"""The processes of router_latency.py: emulated vLLM pods and the router, each on its cores.

Owns the core layout (disjoint sets for the router, the pods and the load generator
when there are enough cores), the inputs the router reads (fleet.yaml, catalog.yaml,
plan.json in a temporary folder), spawning each child through launch.py pinned to its
cores and dying with this process, waiting for the port file each child writes (port
0: the kernel's port, never one chosen here) and for its health route, the children's
CPU from /proc, and stopping them. It sends no load (``router_load``) and records no
result (router_latency.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LAUNCH = HERE / "launch.py"
HOST = "127.0.0.1"


def core_layout(router_cores: int, pod_cores: int, gen_cores: int) -> dict[str, Any]:
    """Disjoint core sets for router, pods and generator; all shared when too few cores."""
    cores = sorted(os.sched_getaffinity(0))
    need = router_cores + pod_cores + gen_cores
    if len(cores) >= need + 2:
        # Leave the first two cores (interrupts, the shell, nvidia daemons) to others.
        rest = cores[2:]
    elif len(cores) >= need:
        rest = cores
    else:
        return {"pinned": False, "router": cores, "pods": cores, "gen": cores, "all": cores}
    return {
        "pinned": True,
        "router": rest[:router_cores],
        "pods": rest[router_cores : router_cores + pod_cores],
        "gen": rest[router_cores + pod_cores : need],
        "all": cores,
    }


def write_inputs(tmp: Path, pod_ports: list[int], adapters: list[str], rank: int) -> None:
    pods = len(pod_ports)
    fleet = [
        "pools:",
        "  - name: emulated",
        "    base_model: llama-3.1-8b",
        "    served_model_name: base-model",
        "    engine: vllm",
        "    max_lora_rank: 64",
        "    pod_defaults: {max_loras: 4, max_cpu_loras: 16}",
        "    pods:",
    ]
    fleet += [
        f'      - {{name: pod-{i}, url: "http://{HOST}:{port}"}}'
        for i, port in enumerate(pod_ports)
    ]
    (tmp / "fleet.yaml").write_text("\n".join(fleet) + "\n")
    catalog = ["adapters:"]
    for name in adapters:
        catalog += [
            f"- name: {name}",
            "  base_model: llama-3.1-8b",
            f"  rank: {rank}",
            "  target_modules: [q_proj, v_proj]",
            f"  source: s3://adapters/{name}",
        ]
    (tmp / "catalog.yaml").write_text("\n".join(catalog) + "\n")

    from placement.domain import AdapterId, PodId, Tier
    from placement.plan import AdapterPlan, Plan, PodPlan, plan_to_json

    now = datetime.now(UTC)
    entries: dict[AdapterId, AdapterPlan] = {}
    by_pod: dict[PodId, list[AdapterId]] = {}
    for index, name in enumerate(adapters):
        pod = PodId(f"pod-{index % pods}")
        entries[AdapterId(name)] = AdapterPlan(tier=Tier.HOT, pods=MappingProxyType({pod: 1.0}))
        by_pod.setdefault(pod, []).append(AdapterId(name))
    plan = Plan(
        id="bench-gpu",
        created_at=now,
        valid_from=now - timedelta(minutes=1),
        valid_until=now + timedelta(hours=2),
        pods=MappingProxyType({p: PodPlan(hot=tuple(a)) for p, a in by_pod.items()}),
        adapters=MappingProxyType(entries),
    )
    (tmp / "plan.json").write_text(plan_to_json(plan))


def spawn(cmd: list[str], cores: list[int], log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), str(ROOT)] if p)
    handle = log_path.open("wb")
    cpu_set = set(cores)

    def pin() -> None:
        os.sched_setaffinity(0, cpu_set)
        # Die with this process, even if it is killed without a chance to clean up.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PDEATHSIG

    return subprocess.Popen(
        cmd,
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=pin,  # noqa: PLW1509 (spawned before any thread starts)
        cwd=str(ROOT),
    )


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_file(path: Path, deadline: float, proc: subprocess.Popen[bytes]) -> str:
    """The text of ``path`` once ``proc`` has written it (by rename: whole)."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"a child exited with {proc.returncode} before writing {path}")
        with contextlib.suppress(FileNotFoundError):
            return path.read_text()
        await asyncio.sleep(0.05)
    raise RuntimeError(f"nothing was written to {path}")


async def wait_up(
    session: aiohttp.ClientSession,
    url: str,
    deadline: float,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a child exited with {proc.returncode} before {url} was up")
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as reply:
                if reply.status < 500:
                    return
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} never came up")


def stop_children(procs: dict[str, Any]) -> None:
    children = [*procs.get("pods", []), *([procs["router"]] if "router" in procs else [])]
    for child in children:
        if child.poll() is None:
            child.terminate()
    end = time.monotonic() + 5
    for child in children:
        try:
            child.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@dataclass(frozen=True, kw_only=True)
class Fleet:
    """The children once each has written its port."""

    pods: list[subprocess.Popen[bytes]]
    router: subprocess.Popen[bytes]
    pod_ports: list[int]
    router_port: int


async def start_fleet(
    args: argparse.Namespace,
    layout: dict[str, Any],
    *,
    adapters: list[str],
    tmp: Path,
    up_by: float,
    procs: dict[str, Any],
) -> Fleet:
    """The pods (one process each), then the router over them, each on its cores; each
    child goes into ``procs`` as soon as it is spawned, so that it is stopped whatever
    fails next."""
    launch = [sys.executable, str(LAUNCH)]
    children: list[subprocess.Popen[bytes]] = []
    for i in range(args.pods):
        cmd = [*launch, "pods", "--ports", "0", "--first-index", str(i)]
        cmd += ["--ports-file", str(tmp / f"pod-{i}.json")]
        cmd += ["--ttft-ms", str(args.pod_ttft_ms), "--tpot-ms", str(args.pod_tpot_ms)]
        if args.pod_uvloop:
            cmd.append("--uvloop")
        core = [layout["pods"][i % len(layout["pods"])]] if layout["pinned"] else layout["pods"]
        children.append(spawn(cmd, core, tmp / f"pod-{i}.log"))
    procs["pods"] = children
    pod_ports = []
    for i, child in enumerate(children):
        urls = json.loads(await wait_file(tmp / f"pod-{i}.json", up_by, child))
        pod_ports.append(int(urls[f"pod-{i}"].rsplit(":", 1)[1]))
    write_inputs(tmp, pod_ports, adapters, rank=16)
    router_cmd = [*launch, "router", "--fleet", str(tmp / "fleet.yaml")]
    router_cmd += ["--plan", str(tmp / "plan.json"), "--catalog", str(tmp / "catalog.yaml")]
    router_cmd += ["--port", "0", "--port-file", str(tmp / "router.port")]
    router = spawn(router_cmd, layout["router"], tmp / "router.log")
    procs["router"] = router
    router_port = int(await wait_file(tmp / "router.port", up_by, router))
    return Fleet(pods=children, router=router, pod_ports=pod_ports, router_port=router_port)


async def wait_healthy(session: aiohttp.ClientSession, fleet: Fleet, up_by: float) -> None:
    """Every pod's ``/health`` and the router's ``/healthz`` answer."""
    children = [*fleet.pods, fleet.router]
    for port in fleet.pod_ports:
        await wait_up(session, f"http://{HOST}:{port}/health", up_by, children)
    await wait_up(session, f"http://{HOST}:{fleet.router_port}/healthz", up_by, children)
