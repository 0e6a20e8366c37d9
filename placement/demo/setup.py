"""What every policy's run shares (``Prepared``: the files, the requests and events on
the demo's clock) and the emulated pods.

``start_pods`` starts the emulated pods on ports the kernel gives them, with the
replay's pod model by default (``PodTimings.replayed``: the model the war story is
calibrated on, in wall milliseconds, from ``SimSettings``: at most ``max_num_seqs``
requests running per pod and the rest queued, a prefill per prompt token, a decode step
that slows with the batch and its distinct adapters), and writes the fleet.yaml that
names them;
``pod_counts`` reads their counters, ``restart_pods`` empties them between policies.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import httpx
import yaml

from placement.demo.measure import PodCounts
from placement.demo.processes import LocalProcesses
from placement.demo.traffic import EventShot, Shot
from placement.domain import Pod
from placement.emulator.config import BatchTiming
from placement.inputs import load_fleet
from placement.settings import Settings

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "data" / "war-story"
POLICIES = ("round-robin", "epp", "lorafleet")


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
    #: The scenario's moment the replay starts at (the warm-up's start), and the
    #: measured window's start and end.
    start: datetime
    speed: float
    shots: tuple[Shot, ...]
    measured_from: datetime | None = None
    measured_to: datetime | None = None
    events: tuple[EventShot, ...] = ()
    #: The scenario's median prompt, in tokens (a pod's prefill time).
    prompt_median: float = 1020.0
    #: The emulated pods' URLs, in the order of fleet.yaml; known once they listen.
    pod_urls: tuple[str, ...] = ()

    @property
    def warmup_wall_s(self) -> float:
        """Wall seconds from the replay's start to the measured window's."""
        opened = self.measured_from or self.start
        return (opened - self.start).total_seconds() / self.speed

    @property
    def window_wall_s(self) -> float:
        if self.measured_from is None or self.measured_to is None:
            return max(self.shots[-1].at_s if self.shots else 1.0, 1.0)
        return (self.measured_to - self.measured_from).total_seconds() / self.speed


def served_model(fleet: Path) -> str:
    raw = yaml.safe_load(fleet.read_text())
    return str(raw["pools"][0].get("served_model_name") or raw["pools"][0]["base_model"])


def _fleet_on_urls(source: Path, target: Path, urls: Sequence[str]) -> None:
    """Copy fleet.yaml with its pods, in order, moved onto the emulated pods' URLs."""
    raw = yaml.safe_load(source.read_text())
    pods = [pod for pool in raw["pools"] for pod in pool["pods"]]
    for pod, url in zip(pods, urls, strict=True):
        pod["url"] = url
    target.write_text(yaml.safe_dump(raw, sort_keys=False))


@dataclass(frozen=True, kw_only=True)
class PodTimings:
    """An emulated pod's latencies in wall milliseconds: a cold read, a swap onto the GPU
    (which stalls the pod's batch), fixed times for the first token and each one after,
    and the batch model (None: none; requests run at once at the fixed times)."""

    load_ms: float
    load_ms_per_mb: float
    activate_ms: float
    ttft_ms: float
    tpot_ms: float
    batch: BatchTiming | None = None
    #: The pod's KV cache in tokens (its KV gauge); None: the emulator's.
    kv_capacity_tokens: int | None = None

    @classmethod
    def replayed(cls, settings: Settings, *, prompt_tokens: float | None = None) -> PodTimings:
        """The replay's pod model (the one the war story is calibrated on): a swap is the
        load phases from host RAM; the batch, each request's prefill and its decode steps
        are ``SimSettings``' (``BatchTiming.of``), with no fixed time beside them. Cold
        reads as the earlier demo's. ``prompt_tokens`` is not used: each request's
        prefill is its own prompt's (kept for callers that still pass the median)."""
        del prompt_tokens
        sim, cost = settings.sim, settings.load_cost
        return cls(
            load_ms=40.0,
            load_ms_per_mb=0.5,
            activate_ms=cost.warm_load_ms(0),
            ttft_ms=0.0,
            tpot_ms=0.0,
            batch=BatchTiming.of(sim),
            kv_capacity_tokens=sim.kv_capacity_tokens,
        )

    def emulate_flags(self) -> list[str]:
        """The ``lorafleet emulate`` flags of these timings."""
        flags = [
            "--load-ms", str(self.load_ms), "--load-ms-per-mb", str(self.load_ms_per_mb),
            "--activate-ms", str(self.activate_ms), "--ttft-ms", str(self.ttft_ms),
            "--tpot-ms", str(self.tpot_ms),
        ]  # fmt: skip
        if self.batch is not None:
            flags += [
                "--max-num-seqs", str(self.batch.max_num_seqs),
                "--prefill-ms-per-token", str(self.batch.prefill_ms_per_token),
                "--decode-ms-per-step", str(self.batch.decode_ms_per_step),
                "--batch-step-slowdown", str(self.batch.batch_step_slowdown),
                "--adapter-step-cost", str(self.batch.adapter_step_cost),
            ]  # fmt: skip
        if self.kv_capacity_tokens is not None:
            flags += ["--kv-capacity-tokens", str(self.kv_capacity_tokens)]
        return flags


def _emulate_args(
    timings: PodTimings, prepared: Prepared, ports_file: Path, limits: Pod
) -> list[str]:
    return [
        "emulate", "--pods", str(prepared.pods), "--port", "0", "--ports-file", str(ports_file),
        "--served-model-name", prepared.served_model,
        "--max-loras", str(limits.max_loras), "--max-cpu-loras", str(limits.max_cpu_loras),
        "--max-lora-rank", str(limits.max_lora_rank),
        *timings.emulate_flags(),
        # The pods read adapters from the pool's storage (fleet.yaml), as the replay does.
        "--fleet", str(prepared.fleet_source.resolve()), "--pool", str(limits.pool),
    ]  # fmt: skip


def start_pods(timings: PodTimings, prepared: Prepared, processes: LocalProcesses) -> Prepared:
    """Start the emulated pods on ports of their own, then write fleet.yaml naming them."""
    first = load_fleet(prepared.fleet_source).pods[0]
    ports_file = prepared.workdir / "pods.json"
    ports_file.unlink(missing_ok=True)  # a kept work directory has the last run's
    child = processes.start("pods", _emulate_args(timings, prepared, ports_file, first))
    by_name = json.loads(processes.wait_for_file(child, ports_file, timeout_s=60.0))
    urls = tuple(str(by_name[f"pod-{i}"]) for i in range(prepared.pods))
    _fleet_on_urls(prepared.fleet_source, prepared.fleet, urls)
    return replace(prepared, pod_urls=urls)


async def pod_counts(urls: Sequence[str]) -> list[PodCounts]:
    async with httpx.AsyncClient(timeout=10.0) as client:
        answers = await asyncio.gather(*(client.get(f"{url}/admin/stats") for url in urls))
    return [PodCounts.from_stats(answer.json()) for answer in answers]


def restart_pods(urls: Sequence[str]) -> None:
    with httpx.Client(timeout=10.0) as client:
        for url in urls:
            client.post(f"{url}/admin/restart").raise_for_status()
