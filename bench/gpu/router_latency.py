"""The router's added latency at a fixed open-loop rate, with cores of its own.

Starts N emulated vLLM pods (one process each) and the lorafleet router as separate
processes through bench/gpu/launch.py, each pinned to its own cores
(sched_setaffinity), writes fleet.yaml, catalog.yaml and plan.json to a temporary
directory, and from this process (pinned to other cores) sends the same Poisson
arrival sequence of non-streamed completions, each naming an adapter as its model,
once directly to the pod that holds the adapter and once through the router.

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
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LAUNCH = HERE / "launch.py"
HOST = "127.0.0.1"
PROMPT = "Summarise the following support ticket in one sentence: the printer is offline."


def log(*parts: Any) -> None:
    print("[router]", *parts, flush=True)


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
    entries, by_pod = {}, {}
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


async def wait_up(session: aiohttp.ClientSession, url: str, deadline: float, procs: list) -> None:
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


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(lat: list[float]) -> dict[str, float | None]:
    return {
        "n": len(lat),
        "mean_ms": statistics.fmean(lat) if lat else None,
        "p50_ms": pct(lat, 0.50),
        "p90_ms": pct(lat, 0.90),
        "p95_ms": pct(lat, 0.95),
        "p99_ms": pct(lat, 0.99),
        "p999_ms": pct(lat, 0.999),
        "max_ms": max(lat) if lat else None,
    }


def arrivals(rate: float, seconds: float, models: list[str], seed: int) -> list[tuple[float, str]]:
    """A Poisson arrival sequence: (offset in s, adapter), the same for both paths."""
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append((t, rng.choice(models)))


async def open_loop(
    session: aiohttp.ClientSession,
    schedule: list[tuple[float, str]],
    url_of: dict[str, str],
    max_tokens: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Send each request at its offset, whatever is in flight (open loop)."""
    latencies: list[float] = []
    from_intended: list[float] = []
    lag: list[float] = []
    errors: dict[str, int] = {}
    first_send = last_done = None
    per_request = aiohttp.ClientTimeout(total=timeout_s)

    async def one(intended: float, model: str) -> None:
        nonlocal last_done
        body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "stream": False}
        started = time.perf_counter()
        lag.append((started - intended) * 1000.0)
        try:
            async with session.post(url_of[model], json=body, timeout=per_request) as reply:
                await reply.read()
                status = reply.status
        except Exception as exc:
            kind = type(exc).__name__
            errors[kind] = errors.get(kind, 0) + 1
            return
        done = time.perf_counter()
        if status != 200:
            errors[f"http_{status}"] = errors.get(f"http_{status}", 0) + 1
            return
        latencies.append((done - started) * 1000.0)
        from_intended.append((done - intended) * 1000.0)
        last_done = done

    tasks = []
    start = time.perf_counter() + 0.05
    first_send = start
    for offset, model in schedule:
        intended = start + offset
        delay = intended - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(intended, model)))
    await asyncio.gather(*tasks)
    span = (last_done or time.perf_counter()) - first_send
    duration = schedule[-1][0] if schedule else 0.0
    return {
        "sent": len(schedule),
        "ok": len(latencies),
        "errors": errors,
        "offered_rps": len(schedule) / duration if duration else None,
        "achieved_rps": len(latencies) / span if span > 0 else None,
        "latency": summary(latencies),
        "latency_from_intended": summary(from_intended),
        "send_lag_ms": {"p50": pct(lag, 0.5), "p99": pct(lag, 0.99), "max": max(lag or [0])},
    }


async def closed_loop(
    session: aiohttp.ClientSession,
    models: list[str],
    url_of: dict[str, str],
    workers: int,
    seconds: float,
) -> dict[str, Any]:
    done, failed = 0, 0
    stop = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal done, failed
        i = k
        while time.perf_counter() < stop:
            model = models[i % len(models)]
            body = {"model": model, "prompt": PROMPT, "max_tokens": 1}
            try:
                async with session.post(url_of[model], json=body) as reply:
                    await reply.read()
                    if reply.status == 200:
                        done += 1
                    else:
                        failed += 1
            except Exception:
                failed += 1
            i += workers

    started = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(workers)))
    elapsed = time.perf_counter() - started
    return {"rps": done / elapsed, "ok": done, "failed": failed, "workers": workers}


class Result:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.data: dict[str, Any] = {"bench": "router_latency", "errors": []}

    def save(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.data, indent=2, default=str))


async def run(args: argparse.Namespace, result: Result, procs: dict[str, Any]) -> None:
    data = result.data
    deadline = time.monotonic() + args.time_cap
    layout = core_layout(args.router_cores, args.pod_cores, args.gen_cores)
    data["cores"] = layout
    log("cores:", json.dumps({k: v for k, v in layout.items() if k != "all"}))
    adapters = [f"lora-{i}" for i in range(args.pods * args.adapters_per_pod)]
    tmp = Path(tempfile.mkdtemp(prefix="lorafleet-router-bench-"))
    procs["tmp"] = tmp
    launch = [sys.executable, str(LAUNCH)]
    started = time.monotonic()
    up_by = started + args.start_timeout
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
    data["ports"] = {"pods": pod_ports, "router": router_port}
    os.sched_setaffinity(0, set(layout["gen"]))

    direct_url = {
        name: f"http://{HOST}:{pod_ports[i % args.pods]}/v1/completions"
        for i, name in enumerate(adapters)
    }
    routed_url = {name: f"http://{HOST}:{router_port}/v1/completions" for name in adapters}
    connector = aiohttp.TCPConnector(limit=args.connections, limit_per_host=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        for port in pod_ports:
            await wait_up(session, f"http://{HOST}:{port}/health", up_by, [*children, router])
        await wait_up(session, f"http://{HOST}:{router_port}/healthz", up_by, [*children, router])
        data["startup_s"] = round(time.monotonic() - started, 2)
        log(f"pods and router up in {data['startup_s']} s; {len(adapters)} adapters")
        for i, name in enumerate(adapters):
            body = {"lora_name": name, "lora_path": f"s3://adapters/{name}"}
            url = f"http://{HOST}:{pod_ports[i % args.pods]}/v1/load_lora_adapter"
            async with session.post(url, json=body) as reply:
                await reply.read()
        await asyncio.sleep(1.0)  # let the router scrape every pod once or twice
        # Warm-up both paths: connections, the router's ledger, the JIT-free caches.
        warm = arrivals(100.0, args.warmup_s, adapters, args.seed + 1)
        data["warmup_direct"] = (await open_loop(session, warm, direct_url, 1, 10.0))["errors"]
        data["warmup_routed"] = (await open_loop(session, warm, routed_url, 1, 10.0))["errors"]
        log("warm-up errors:", data["warmup_direct"], data["warmup_routed"])

        schedule = arrivals(args.rate, args.seconds, adapters, args.seed)
        data["config"] = {
            "rate_rps": args.rate,
            "seconds": args.seconds,
            "requests": len(schedule),
            "pods": args.pods,
            "adapters": len(adapters),
            "pod_ttft_ms": args.pod_ttft_ms,
            "pod_tpot_ms": args.pod_tpot_ms,
            "max_tokens": args.max_tokens,
            "python": sys.version.split()[0],
            "aiohttp": aiohttp.__version__,
            "loop": type(asyncio.get_running_loop()).__module__,
        }
        order = ["direct", "routed"] * args.rounds
        for index, path in enumerate(order):
            if time.monotonic() > deadline - args.seconds - 5:
                result.data["errors"].append(f"time cap: skipped {path} round {index // 2}")
                break
            urls = direct_url if path == "direct" else routed_url
            pods_cpu = sum(cpu_s(c.pid) for c in children)
            router_cpu = cpu_s(router.pid)
            log(f"{path}: {len(schedule)} requests over {args.seconds:g} s ...")
            got = await open_loop(session, schedule, urls, args.max_tokens, 30.0)
            n = max(got["ok"], 1)
            got["pods_cpu_us_per_request"] = (
                (sum(cpu_s(c.pid) for c in children) - pods_cpu) / n * 1e6
            )
            got["router_cpu_us_per_request"] = (cpu_s(router.pid) - router_cpu) / n * 1e6
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
        direct = [
            data[k]
            for k in data
            if k.startswith("direct") and isinstance(data[k], dict) and "latency" in data[k]
        ]
        routed = [
            data[k]
            for k in data
            if k.startswith("routed") and isinstance(data[k], dict) and "latency" in data[k]
        ]
        if direct and routed:
            added = {}
            for q in ("p50_ms", "p90_ms", "p95_ms", "p99_ms", "p999_ms", "mean_ms"):
                d = statistics.median(
                    x["latency"][q] for x in direct if x["latency"][q] is not None
                )
                r = statistics.median(
                    x["latency"][q] for x in routed if x["latency"][q] is not None
                )
                added[q] = r - d
            data["added_ms"] = added
            log("added latency (ms):", json.dumps({k: round(v, 3) for k, v in added.items()}))
        result.save()

        if args.closed_seconds > 0 and time.monotonic() < deadline - 2 * args.closed_seconds - 3:
            for path, urls in (("direct", direct_url), ("routed", routed_url)):
                router_cpu = cpu_s(router.pid)
                got = await closed_loop(session, adapters, urls, 64, args.closed_seconds)
                got["router_cpu_us_per_request"] = (
                    (cpu_s(router.pid) - router_cpu) / max(got["ok"], 1) * 1e6
                )
                data[f"closed_{path}"] = got
                log(
                    f"closed loop {path}: {got['rps']:.0f} req/s (ok {got['ok']}, "
                    f"failed {got['failed']})"
                )
            result.save()
        elif args.closed_seconds > 0:
            data["errors"].append("time cap: skipped the closed-loop runs")


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


def main() -> None:
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
    args = parser.parse_args()

    result = Result(args.out)
    procs: dict[str, Any] = {}

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
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
    sys.path.insert(0, str(ROOT))
    main()
