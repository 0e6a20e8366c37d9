"""``lorafleet emulate``: N emulated vLLM or SGLang pods on 127.0.0.1, until Ctrl-C.

The pods follow an engine model (``--engine-model``: vllm, sglang with the soft cap, or
sglang-hard-cap, SGLang before it) and the version knobs real engines differ by.
``--port 0`` gives each pod a port of its own from the kernel, and ``--ports-file``
says which once every pod listens: what a program that starts the pods (the demo,
tests) reads, instead of choosing ports that another process may take first.

Where the pods read adapters from: ``--fleet`` takes the storage of a fleet.yaml's pool
(``--pool``, else the first), and ``--storage-kind``, ``--storage-bandwidth`` and
``--storage-first-byte-ms`` override its fields, or give one (kind and bandwidth at
least) where the pool has none. A cold read then waits the storage's first byte and
size / bandwidth (``placement.emulator.config`` says why that time is the storage's,
not the engine's); without a storage the pods read at ``--load-ms-per-mb``, as from
local NVMe.

How long a request takes: without the batch flags, a request runs at once, its first
token after ``--ttft-ms`` and each after ``--tpot-ms``. Any of ``--max-num-seqs``,
``--prefill-ms-per-token``, ``--decode-ms-per-step``, ``--batch-step-slowdown`` and
``--adapter-step-cost`` makes the pods the replay's pod (``BatchTiming``), the others
taken from the settings tree (``SimSettings``): at most ``--max-num-seqs`` requests run,
the rest wait in arrival order, the first token follows the prompt's prefill, and each
token after takes a decode step that grows with the batch and its distinct adapters;
``--ttft-ms`` and ``--tpot-ms`` are then added on top.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import socket
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from placement.cli.app import app, err, out, report_errors
from placement.cli.emulate_storage import pods_storage, storage_note, storage_yaml
from placement.domain import Engine
from placement.emulator.config import BatchTiming, Faults, Latency, PodConfig
from placement.emulator.fleet import (
    HOST,
    EmulatedFleet,
    listening_sockets,
    ports_of,
    serve_fleet,
)
from placement.errors import InputError, Problem
from placement.inputs.files import write_atomically
from placement.inputs.fleet import STORAGE_KINDS
from placement.residency import EngineModel
from placement.settings import SimSettings


def batch_timing(
    max_num_seqs: int | None,
    prefill_ms_per_token: float | None,
    decode_ms_per_step: float | None,
    batch_step_slowdown: float | None,
    adapter_step_cost: float | None,
) -> BatchTiming | None:
    """The replay's batch model when any of its flags is given (the rest from the
    settings tree); None when none is."""
    given = (
        max_num_seqs,
        prefill_ms_per_token,
        decode_ms_per_step,
        batch_step_slowdown,
        adapter_step_cost,
    )
    if all(value is None for value in given):
        return None
    sim = SimSettings()
    return BatchTiming(
        max_num_seqs=sim.max_num_seqs if max_num_seqs is None else max_num_seqs,
        prefill_ms_per_token=_given(prefill_ms_per_token, sim.prefill_ms_per_token),
        decode_ms_per_step=_given(decode_ms_per_step, sim.decode_ms_per_step),
        batch_step_slowdown=_given(batch_step_slowdown, sim.batch_step_slowdown),
        adapter_step_cost=_given(adapter_step_cost, sim.adapter_step_cost),
    )


def _given(value: float | None, setting: float) -> float:
    return setting if value is None else value


def _fleet_yaml(fleet: EmulatedFleet, *, base_model: str) -> str:
    config = fleet.handles[0].pod.config
    lines = [
        "pools:",
        "  - name: emulated",
        f"    base_model: {base_model}",
        f"    served_model_name: {config.served_model_name}",
        f"    engine: {fleet.engine.value}",
        f"    max_lora_rank: {config.max_lora_rank}",
        *storage_yaml(config.storage),
        f"    pod_defaults: {{max_loras: {config.max_loras}, max_cpu_loras: {config.cpu_slots}}}",
        "    pods:",
    ]
    lines += [f'      - {{name: {h.name}, url: "{h.url}"}}' for h in fleet.handles]
    return "\n".join(lines)


async def _crash_now_and_then(fleet: EmulatedFleet, *, every_s: float, down_s: float) -> None:
    """Kill a random pod every ``every_s`` seconds; it comes back empty after ``down_s``."""
    rng = random.Random(0)
    while True:
        await asyncio.sleep(every_s)
        victim = rng.choice(fleet.handles)
        victim.pod.kill(down_s)
        err().print(f"{victim.name} died; back empty in {down_s:g} s")


def _write_ports_file(path: Path, fleet: EmulatedFleet) -> None:
    """Pod name -> URL as one JSON object, whole or not at all (readers poll for it)."""
    urls = {str(handle.name): handle.url for handle in fleet.handles}
    write_atomically(path, json.dumps(urls, indent=2) + "\n")


async def _serve(
    fleet: EmulatedFleet,
    sockets: list[socket.socket],
    *,
    crash_every_s: float,
    down_s: float,
    ports_file: Path | None,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    crasher = None
    if crash_every_s > 0:
        crasher = asyncio.create_task(
            _crash_now_and_then(fleet, every_s=crash_every_s, down_s=down_s)
        )
    on_listening = partial(_write_ports_file, ports_file, fleet) if ports_file else None
    await serve_fleet(fleet.handles, stop=stop, sockets=sockets, on_listening=on_listening)
    if crasher is not None:
        crasher.cancel()


def _checked(template: PodConfig, *, kv_capacity_tokens: int | None) -> PodConfig:
    """The pods' config with ``--kv-capacity-tokens`` over it, its problems refused."""
    if kv_capacity_tokens is not None:
        template = replace(template, kv_capacity_tokens=kv_capacity_tokens)
    problems = template.problems()
    if problems:
        raise InputError([Problem(source="emulate", message=p) for p in problems])
    return template


def _listening_sockets(pods: int, port: int) -> list[socket.socket]:
    """A listening socket per pod from ``port`` on (0: each its own free port)."""
    if port and port + pods - 1 > 65535:
        raise InputError(
            [Problem(source="--port", message=f"{pods} pods from port {port} pass 65535")]
        )
    try:
        return listening_sockets(pods, base_port=port)
    except OSError as exc:
        raise InputError(
            [
                Problem(
                    source="--port",
                    message=f"cannot listen on {HOST}:{port}..{port + pods - 1}: "
                    f"{exc.strerror or exc}",
                )
            ]
        ) from None


def _start_fleet(
    sockets: list[socket.socket], template: PodConfig, *, base_model: str
) -> EmulatedFleet:
    """One pod per socket; says where they listen and prints their fleet.yaml."""
    pods, engine, ports = len(sockets), template.engine, ports_of(sockets)
    fleet = EmulatedFleet.start(pods, engine=engine, ports=ports, config=template)
    err().print(
        f"{pods} emulated {engine.value} pods ({template.model.value}) on {HOST}, ports "
        + ", ".join(map(str, ports))
        + storage_note(template.storage)
    )
    out().print(_fleet_yaml(fleet, base_model=base_model), highlight=False, markup=False)
    return fleet


# Past 80 lines for its option declarations alone (each flag's name, default and help
# in one place, as ``--help`` shows them); the body maps the flags onto one PodConfig
# and makes a few named calls.
@app.command()
@report_errors
def emulate(
    pods: Annotated[int, typer.Option(min=1, help="How many pods.")] = 4,
    engine: Annotated[Engine, typer.Option(help="The dialect the pods speak.")] = Engine.VLLM,
    engine_model: Annotated[
        EngineModel | None,
        typer.Option(
            help="What loads, unloads and requests do (default: the engine's current model; "
            "sglang-hard-cap is SGLang before its soft --max-loaded-loras)."
        ),
    ] = None,
    port: Annotated[
        int,
        typer.Option(
            min=0,
            max=65535,
            help="The first pod's port on 127.0.0.1, the others following; 0: each pod a "
            "free port of its own (see --ports-file).",
        ),
    ] = 18000,
    ports_file: Annotated[
        Path | None,
        typer.Option(
            help="Write {pod name: URL} here as JSON (atomically) once every pod listens."
        ),
    ] = None,
    served_model_name: Annotated[str, typer.Option(help="The name requests use.")] = "base-model",
    base_model: Annotated[
        str, typer.Option(help="The built-in base model the printed fleet.yaml names.")
    ] = "llama-3.1-8b",
    max_loras: Annotated[int, typer.Option(help="GPU slots per pod.")] = 4,
    max_cpu_loras: Annotated[int, typer.Option(help="Host cache slots per pod.")] = 16,
    max_lora_rank: Annotated[int, typer.Option(help="The rank cap.")] = 64,
    load_ms: Annotated[float, typer.Option(help="Fixed time of a cold load.")] = 10.0,
    load_ms_per_mb: Annotated[float, typer.Option(help="Cold load time per MB.")] = 0.2,
    activate_ms: Annotated[float, typer.Option(help="GPU swap time (stalls the batch).")] = 25.0,
    ttft_ms: Annotated[float, typer.Option(help="Time to first token.")] = 20.0,
    tpot_ms: Annotated[float, typer.Option(help="Time per output token.")] = 5.0,
    max_num_seqs: Annotated[
        int | None,
        typer.Option(
            min=1, help="Requests running at once; the rest wait (default: the replay's)."
        ),
    ] = None,
    prefill_ms_per_token: Annotated[
        float | None, typer.Option(min=0.0, help="Prefill time per prompt token (ms).")
    ] = None,
    decode_ms_per_step: Annotated[
        float | None, typer.Option(min=0.0, help="A decode step of a small batch (ms).")
    ] = None,
    batch_step_slowdown: Annotated[
        float | None, typer.Option(min=0.0, help="How much slower a full batch's step is.")
    ] = None,
    adapter_step_cost: Annotated[
        float | None,
        typer.Option(min=0.0, help="A step's extra cost per distinct adapter past the first."),
    ] = None,
    kv_capacity_tokens: Annotated[
        int | None, typer.Option(min=1, help="KV cache per pod, in tokens (the KV gauge).")
    ] = None,
    error_rate: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of 500s.")] = 0.0,
    slow_load_ms: Annotated[float, typer.Option(help="Extra time on every load.")] = 0.0,
    missing_pattern: Annotated[
        str, typer.Option(help="lora_path regex the pods treat as missing.")
    ] = r"(^|[/:])missing",
    no_runtime_updating: Annotated[
        bool, typer.Option(help="Act as vLLM without VLLM_ALLOW_RUNTIME_LORA_UPDATING.")
    ] = False,
    vllm_flat_errors: Annotated[
        bool, typer.Option(help="Answer older vLLM's flat error bodies, not {'error': {...}}.")
    ] = False,
    vllm_old_kv_metric: Annotated[
        bool, typer.Option(help="Export vllm:gpu_cache_usage_perc (vLLM before #18354).")
    ] = False,
    sglang_metrics: Annotated[
        bool,
        typer.Option(
            "--sglang-metrics/--no-sglang-metrics",
            help="SGLang's --enable-metrics; without it /metrics is a 404.",
        ),
    ] = True,
    sglang_dp_size: Annotated[
        int, typer.Option(min=1, help="SGLang's --dp-size; above 1 loads and unloads fail.")
    ] = 1,
    sglang_old_naming: Annotated[
        bool,
        typer.Option(help="Act as SGLang before model='<base>:<adapter>' (reads lora_path only)."),
    ] = False,
    crash_every_s: Annotated[
        float, typer.Option(help="Kill a random pod this often (0: never); its port closes.")
    ] = 0.0,
    down_s: Annotated[float, typer.Option(help="How long a killed pod stays down.")] = 2.0,
    seed: Annotated[int, typer.Option(help="Seed of the injected failures.")] = 0,
    fleet_file: Annotated[
        Path | None,
        typer.Option(
            "--fleet", help="Read adapters from the storage of this fleet.yaml's pool (--pool)."
        ),
    ] = None,
    pool: Annotated[
        str | None, typer.Option(help="The --fleet pool whose storage to take (default: first).")
    ] = None,
    storage_kind: Annotated[
        str | None,
        typer.Option(help=f"Where adapters are read from: {', '.join(STORAGE_KINDS)}."),
    ] = None,
    storage_bandwidth: Annotated[
        str | None, typer.Option(help="The storage's read rate per second, e.g. 200MB.")
    ] = None,
    storage_first_byte_ms: Annotated[
        float | None, typer.Option(help="The storage's wait for the first byte (ms).")
    ] = None,
) -> None:
    """Serve emulated pods that speak the engine's API exactly (POD-API.md).

    Each pod also answers GET /admin/stats, POST /admin/fault
    {"error_rate", "slow_load_ms", "down_s"} and POST /admin/restart. A killed pod
    refuses connections until it comes back empty.
    """
    storage = pods_storage(
        fleet=fleet_file,
        pool=pool,
        kind=storage_kind,
        bandwidth=storage_bandwidth,
        first_byte_ms=storage_first_byte_ms,
    )
    template = _checked(
        PodConfig(
            engine=engine,
            served_model_name=served_model_name,
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
            max_lora_rank=max_lora_rank,
            engine_model=engine_model,
            runtime_lora_updating=not no_runtime_updating,
            vllm_flat_errors=vllm_flat_errors,
            vllm_old_kv_metric=vllm_old_kv_metric,
            sglang_metrics=sglang_metrics,
            sglang_dp_size=sglang_dp_size,
            sglang_model_naming=not sglang_old_naming,
            missing_pattern=missing_pattern,
            latency=Latency(
                load_ms=load_ms,
                load_ms_per_mb=load_ms_per_mb,
                activate_ms=activate_ms,
                ttft_ms=ttft_ms,
                tpot_ms=tpot_ms,
            ),
            batch=batch_timing(
                max_num_seqs,
                prefill_ms_per_token,
                decode_ms_per_step,
                batch_step_slowdown,
                adapter_step_cost,
            ),
            storage=storage,
            faults=Faults(error_rate=error_rate, slow_load_ms=slow_load_ms),
            seed=seed,
        ),
        kv_capacity_tokens=kv_capacity_tokens,
    )
    sockets = _listening_sockets(pods, port)
    fleet = _start_fleet(sockets, template, base_model=base_model)
    asyncio.run(
        _serve(fleet, sockets, crash_every_s=crash_every_s, down_s=down_s, ports_file=ports_file)
    )
