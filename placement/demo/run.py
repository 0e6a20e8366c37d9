"""The whole loop on one machine: emulated pods, the controller and the router, live.

For each policy the demo restarts the emulated pods empty, starts a router (and for
lorafleet the controller, which forecasts from the history, plans, preloads before
the traffic and keeps replanning from what the router logs), replays the same slice
of a scenario's day through the router with the ``openai`` client on a warped clock,
and measures the outcome from the pods' own counters and the router's request log,
not from the simulator. The emulated pods read adapters from the storage of the
scenario's pool (fleet.yaml ``storage``): a cold load waits its first byte and
transfer in wall milliseconds, as the pods' other latencies are (unwarped). Every child
process is stopped when the demo ends.

No child is told a port chosen in advance: the pods and the router bind port 0 and
write the ports the kernel gave them to a file the demo waits for (``--ports-file``,
``--port-file``), and the controller's webhook, which the demo never calls, takes
port 0 too. A port found free by a scan can be taken by another process before the
child binds it, and the child then dies at startup.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import numpy as np
import pandas as pd
import yaml

from placement.demo.processes import LocalProcesses
from placement.demo.traffic import Shot, ShotResult, drive, select
from placement.domain import Pod
from placement.inputs import load_catalog, load_fleet, load_request_log
from placement.inputs.request_log import write_request_log
from placement.synth.scenario import load_scenario

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "data" / "war-story"
POLICIES = ("round-robin", "epp", "lorafleet")


#: How long a router or controller gets to finish its log before it is killed.
STOP_GRACE_S = 30.0


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    scenario: Path = DEFAULT_SCENARIO
    #: Local hours of the scenario's last day to replay: the whole day by default (the
    #: war story's Thursday, with the morning rise and the 10:15 experiment).
    window_hours: tuple[float, float] = (0.0, 24.0)
    requests_per_policy: int = 3000
    wall_s_per_policy: float = 45.0
    policies: tuple[str, ...] = POLICIES
    seed: int = 1
    #: Emulated pod latencies (ms): a cold load, a GPU swap that stalls the batch.
    load_ms: float = 40.0
    load_ms_per_mb: float = 0.5
    activate_ms: float = 60.0
    ttft_ms: float = 25.0
    tpot_ms: float = 2.0
    #: Wall seconds between the controller's plans and forecasts.
    plan_every_s: int = 6
    #: Wall seconds the controller runs before the traffic starts (its preloads).
    lead_s: float = 20.0
    #: Availability replicas (two copies) guard against pod failures: the demo runs the
    #: planner's default share, as a user's fleet would (None: PlannerSettings').
    replicate_share: float | None = None


@dataclass(frozen=True, kw_only=True)
class PolicyResult:
    policy: str
    requests: int
    errors: int
    gpu_hit_rate: float
    activations: int
    evictions: int
    #: GPU activations per pod per second of replay (wall clock).
    loads_per_pod_s: float
    #: How long adapters stayed on a GPU slot, in seconds of replay (wall clock).
    residency_p50_s: float
    residency_p95_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float


@dataclass(frozen=True, kw_only=True)
class Stage:
    """A moment in the demo, for a progress display."""

    policy: str
    message: str
    done: int = 0
    total: int = 0


Progress = Callable[[Stage], None]


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """Everything the runs share: files in the work directory, the shots, the clock."""

    workdir: Path
    catalog: Path
    #: The scenario's fleet.yaml, and its copy naming the emulated pods' URLs (written
    #: by ``start_pods`` once the pods listen).
    fleet_source: Path
    fleet: Path
    pipelines: Path | None
    history: Path
    pods: int
    served_model: str
    start: datetime
    speed: float
    shots: tuple[Shot, ...]
    #: The emulated pods' URLs, in the order of fleet.yaml; known once they listen.
    pod_urls: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PodCounts:
    """What one emulated pod reports in /admin/stats that the demo measures."""

    activations: int
    evictions: int
    residency_ended_s: tuple[float, ...]
    residency_ongoing_s: tuple[float, ...]


def _window(
    options: DemoOptions, last_ts: pd.Timestamp, timezone: str
) -> tuple[datetime, datetime]:
    midnight = last_ts.tz_convert(ZoneInfo(timezone)).normalize()
    start = midnight + pd.Timedelta(hours=options.window_hours[0])
    end = midnight + pd.Timedelta(hours=options.window_hours[1])
    return start.to_pydatetime(), end.to_pydatetime()


def _served_model(fleet: Path) -> str:
    raw = yaml.safe_load(fleet.read_text())
    return str(raw["pools"][0].get("served_model_name") or raw["pools"][0]["base_model"])


def _fleet_on_urls(source: Path, target: Path, urls: Sequence[str]) -> None:
    """Copy fleet.yaml with its pods, in order, moved onto the emulated pods' URLs."""
    raw = yaml.safe_load(source.read_text())
    pods = [pod for pool in raw["pools"] for pod in pool["pods"]]
    for pod, url in zip(pods, urls, strict=True):
        pod["url"] = url
    target.write_text(yaml.safe_dump(raw, sort_keys=False))


def prepare(options: DemoOptions, workdir: Path) -> Prepared:
    """Read the scenario, cut the history and the replayed window, write the children's files."""
    files = load_scenario(options.scenario / "scenario.yaml")
    load_catalog(files.catalog, fleet=load_fleet(files.fleet))  # fail early on bad inputs
    frame = load_request_log(files.log).frame
    start, end = _window(options, frame["ts"].iloc[-1], files.scenario.timezone)
    speed = (end - start).total_seconds() / options.wall_s_per_policy
    rng = np.random.default_rng(options.seed)
    # The replay keeps a share of the window's requests; the history keeps the same share,
    # so that the rates the controller learns are the rates the router will see.
    in_window = int(((frame["ts"] >= start) & (frame["ts"] < end)).sum())
    keep = min(1.0, options.requests_per_policy / max(in_window, 1))
    past = frame[frame["ts"] < start]
    history = workdir / "history.parquet"
    write_request_log(past[rng.random(len(past)) < keep], history)
    shots = select(
        frame, start=start, end=end, max_requests=options.requests_per_policy, speed=speed, rng=rng
    )
    return Prepared(
        workdir=workdir,
        catalog=files.catalog.resolve(),
        fleet_source=files.fleet,
        fleet=workdir / "fleet.yaml",
        pipelines=files.pipelines.resolve() if files.pipelines else None,
        history=history,
        pods=len(load_fleet(files.fleet).pods),
        served_model=_served_model(files.fleet),
        start=start,
        speed=speed,
        shots=tuple(shots),
    )


def _emulate_args(
    options: DemoOptions, prepared: Prepared, ports_file: Path, limits: Pod
) -> list[str]:
    return [
        "emulate", "--pods", str(prepared.pods), "--port", "0", "--ports-file", str(ports_file),
        "--served-model-name", prepared.served_model,
        "--max-loras", str(limits.max_loras), "--max-cpu-loras", str(limits.max_cpu_loras),
        "--max-lora-rank", str(limits.max_lora_rank),
        "--load-ms", str(options.load_ms), "--load-ms-per-mb", str(options.load_ms_per_mb),
        "--activate-ms", str(options.activate_ms), "--ttft-ms", str(options.ttft_ms),
        "--tpot-ms", str(options.tpot_ms),
        # The pods read adapters from the pool's storage (fleet.yaml), as the replay does.
        "--fleet", str(prepared.fleet_source.resolve()), "--pool", str(limits.pool),
    ]  # fmt: skip


def start_pods(options: DemoOptions, prepared: Prepared, processes: LocalProcesses) -> Prepared:
    """Start the emulated pods on ports of their own, then write fleet.yaml naming them."""
    first = load_fleet(prepared.fleet_source).pods[0]
    ports_file = prepared.workdir / "pods.json"
    ports_file.unlink(missing_ok=True)  # a kept work directory has the last run's
    child = processes.start("pods", _emulate_args(options, prepared, ports_file, first))
    by_name = json.loads(processes.wait_for_file(child, ports_file, timeout_s=60.0))
    urls = tuple(str(by_name[f"pod-{i}"]) for i in range(prepared.pods))
    _fleet_on_urls(prepared.fleet_source, prepared.fleet, urls)
    return replace(prepared, pod_urls=urls)


def _pod_counts(urls: Sequence[str]) -> list[PodCounts]:
    counts = []
    with httpx.Client(timeout=10.0) as client:
        for url in urls:
            stats = client.get(f"{url}/admin/stats").json()
            counters, residency = stats["counters"], stats["residency_s"]
            counts.append(
                PodCounts(
                    activations=int(counters.get("gpu_activations", 0)),
                    evictions=int(counters.get("gpu_evictions", 0)),
                    residency_ended_s=tuple(residency["ended"]),
                    residency_ongoing_s=tuple(residency["ongoing"]),
                )
            )
    return counts


def _restart_pods(urls: Sequence[str]) -> None:
    with httpx.Client(timeout=10.0) as client:
        for url in urls:
            client.post(f"{url}/admin/restart").raise_for_status()


def _controller_config(
    options: DemoOptions, prepared: Prepared, live_log: Path, origin_s: float
) -> Path:
    config = {
        "catalog": str(prepared.catalog),
        "fleet": str(prepared.fleet),
        "history": {"log": str(prepared.history), "live_log": str(live_log)},
        "state_dir": str(prepared.workdir / "controller-state"),
        "webhook": {"host": "127.0.0.1", "port": 0},  # the demo never calls it
        "intervals": {
            "ingest_s": options.plan_every_s, "forecast_s": options.plan_every_s,
            "plan_s": options.plan_every_s, "watchdog_s": 2,
        },
        "planner": {"time_limit_s": 2.0}
        | ({} if options.replicate_share is None else {"replicate_share": options.replicate_share}),
        "clock": {
            "start": prepared.start.isoformat(), "speed": prepared.speed, "origin_s": origin_s,
        },
    }  # fmt: skip
    if prepared.pipelines is not None:
        config["pipelines"] = str(prepared.pipelines)
    path = prepared.workdir / "controller.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else 0.0


def _measure(
    policy: str, prepared: Prepared, log_path: Path, before: list[PodCounts], after: list[PodCounts]
) -> PolicyResult:
    log = load_request_log(log_path).frame
    adapters = log[log["adapter"] != prepared.served_model]
    outcomes = adapters["outcome"].dropna()
    outcomes = outcomes[outcomes != ""]
    status = pd.to_numeric(
        adapters.get("status", pd.Series(200, index=adapters.index)), errors="coerce"
    )
    ttft = pd.to_numeric(adapters["ttft_ms"], errors="coerce").dropna()
    activations = sum(a.activations - b.activations for a, b in zip(after, before, strict=True))
    residency_s: list[float] = []
    for old, new in zip(before, after, strict=True):
        residency_s += list(new.residency_ended_s[len(old.residency_ended_s) :])
        residency_s += list(new.residency_ongoing_s)
    wall_s = max(prepared.shots[-1].at_s if prepared.shots else 1.0, 1.0)
    return PolicyResult(
        policy=policy,
        requests=len(adapters),
        errors=int((status >= 400).sum()),
        gpu_hit_rate=float((outcomes == "gpu_hit").mean()) if len(outcomes) else 0.0,
        activations=activations,
        evictions=sum(a.evictions - b.evictions for a, b in zip(after, before, strict=True)),
        loads_per_pod_s=activations / len(after) / wall_s,
        residency_p50_s=_percentile(residency_s, 50),
        residency_p95_s=_percentile(residency_s, 95),
        ttft_p50_ms=_percentile(list(ttft), 50),
        ttft_p95_ms=_percentile(list(ttft), 95),
    )


def run_policy(
    policy: str,
    options: DemoOptions,
    prepared: Prepared,
    processes: LocalProcesses,
    progress: Progress,
) -> PolicyResult:
    """One policy on freshly restarted pods; the router (and controller) stop afterwards."""
    _restart_pods(prepared.pod_urls)
    before = _pod_counts(prepared.pod_urls)
    port_file = prepared.workdir / f"router-{policy}.port"
    port_file.unlink(missing_ok=True)
    log_path = prepared.workdir / f"requests-{policy}.jsonl"
    log_path.unlink(missing_ok=True)
    origin_s = time.time() + (options.lead_s if policy == "lorafleet" else 3.0)
    router_args = [
        "router", "--fleet", str(prepared.fleet), "--catalog", str(prepared.catalog),
        "--port", "0", "--port-file", str(port_file), "--request-log", str(log_path),
        "--clock-start", prepared.start.isoformat(), "--clock-speed", str(prepared.speed),
        "--clock-origin", str(origin_s),
    ]  # fmt: skip
    children = []
    if policy == "lorafleet":
        progress(Stage(policy=policy, message="controller: forecast, plan and preload"))
        config = _controller_config(options, prepared, log_path, origin_s)
        controller = processes.start("controller", ["controller", "--config", str(config)])
        children.append(controller)
        plan_path = prepared.workdir / "controller-state" / "plan.json"
        processes.wait_for_file(controller, plan_path, timeout_s=120.0)
        router_args += ["--plan", str(plan_path)]
    else:
        router_args += ["--policy", policy]
    router = processes.start(f"router-{policy}", router_args)
    children.append(router)
    # The port file is written once the router accepts connections (its lifespan done).
    port = int(processes.wait_for_file(router, port_file, timeout_s=60.0))
    url = f"http://127.0.0.1:{port}"
    delay = origin_s - time.time()
    if delay > 0:
        progress(Stage(policy=policy, message=f"preloading for {delay:.0f} s before the traffic"))
        time.sleep(delay)
    done = 0

    def on_done(_result: ShotResult) -> None:
        nonlocal done
        done += 1
        if done % 50 == 0 or done == len(prepared.shots):
            progress(
                Stage(policy=policy, message="replaying", done=done, total=len(prepared.shots))
            )

    asyncio.run(drive(prepared.shots, base_url=f"{url}/v1", on_done=on_done))
    after = _pod_counts(prepared.pod_urls)
    for child in reversed(children):
        # A router flushes its request log on the way out; on a loaded machine that can
        # take more than the default grace, and a SIGKILL would drop its last rows.
        processes.stop(child, grace_s=STOP_GRACE_S)
    return _measure(policy, prepared, log_path, before, after)


def run_demo(
    options: DemoOptions, workdir: Path, processes: LocalProcesses, progress: Progress
) -> list[PolicyResult]:
    prepared = prepare(options, workdir)
    progress(Stage(policy="", message=f"starting {prepared.pods} emulated pods"))
    prepared = start_pods(options, prepared, processes)
    return [
        run_policy(policy, options, prepared, processes, progress) for policy in options.policies
    ]
