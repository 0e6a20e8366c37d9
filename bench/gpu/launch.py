"""Start emulated pods or the lorafleet router without ``placement.cli``.

``python -m placement router`` imports every CLI module, and with them ortools,
kubernetes, apscheduler and matplotlib: more than a bench machine without network
can be given. This launcher imports only ``placement.emulator``, ``placement.inputs``
and ``placement.router`` and builds both the way ``placement/cli/emulate_cmds.py``
and ``placement/cli/router_cmds.py`` do.

    python bench/gpu/launch.py pods --ports 0,0 --ports-file /tmp/x/pods.json
    python bench/gpu/launch.py router --fleet F --plan P --catalog C --port 0 \
        --port-file /tmp/x/router.port

``pods`` serves one emulated pod per port in this process (start one process per pod
to give each pod its own event loop), and writes a fleet.yaml naming them, the same
text ``lorafleet emulate`` prints. ``router`` runs uvicorn with httptools and uvloop
(``run_router``) until SIGTERM/SIGINT. Port 0 lets the kernel choose: the pods write
{name: URL} to ``--ports-file`` and the router its port to ``--port-file`` once they
listen, as ``lorafleet emulate`` and ``lorafleet router`` do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"


def _fleet_yaml(handles: list[Any], *, engine: str, base_model: str) -> str:
    """What ``lorafleet emulate`` prints (emulate_cmds._fleet_yaml), for these handles."""
    config = handles[0].pod.config
    lines = [
        "pools:",
        "  - name: emulated",
        f"    base_model: {base_model}",
        f"    served_model_name: {config.served_model_name}",
        f"    engine: {engine}",
        f"    max_lora_rank: {config.max_lora_rank}",
        f"    pod_defaults: {{max_loras: {config.max_loras}, max_cpu_loras: {config.cpu_slots}}}",
        "    pods:",
    ]
    lines += [f'      - {{name: {h.name}, url: "{h.url}"}}' for h in handles]
    return "\n".join(lines) + "\n"


def _pods(args: argparse.Namespace) -> None:
    from placement.domain import Engine
    from placement.emulator import (
        ZERO_LATENCY,
        Latency,
        PodConfig,
        build_pod,
        listening_sockets,
        serve_fleet,
    )
    from placement.inputs.files import write_atomically

    engine = Engine(args.engine)
    if args.ttft_ms == 0 and args.tpot_ms == 0:
        latency = ZERO_LATENCY
    else:
        latency = replace(ZERO_LATENCY, ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, activate_ms=0.0)
    assert isinstance(latency, Latency)
    template = PodConfig(
        engine=engine,
        served_model_name=args.served_model_name,
        max_loras=args.max_loras,
        max_cpu_loras=args.max_cpu_loras,
        max_lora_rank=args.max_lora_rank,
        latency=latency,
    )
    problems = template.problems()
    if problems:
        sys.exit("pod config: " + "; ".join(problems))
    # Each socket is bound here, port 0 to a port the kernel chooses, before any pod is built.
    sockets = [listening_sockets(1, base_port=int(p))[0] for p in args.ports.split(",") if p]
    ports = [sock.getsockname()[1] for sock in sockets]
    first = args.first_index
    handles = [
        build_pod(
            replace(template, name=f"pod-{first + i}", seed=template.seed + first + i),
            url=f"http://{HOST}:{port}",
        )
        for i, port in enumerate(ports)
    ]
    if args.fleet_out:
        text = _fleet_yaml(handles, engine=engine.value, base_model=args.base_model)
        Path(args.fleet_out).write_text(text)

    def listening() -> None:
        if args.ports_file:
            urls = {str(handle.name): handle.url for handle in handles}
            write_atomically(Path(args.ports_file), json.dumps(urls) + "\n")

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_fleet(handles, stop=stop, sockets=sockets, on_listening=listening)

    if args.uvloop:
        import uvloop

        uvloop.run(serve())
    else:
        asyncio.run(serve())


def _router(args: argparse.Namespace) -> None:
    # The same steps as placement/cli/router_cmds.py:router, minus typer and Kubernetes.
    from placement.inputs import load_catalog, load_fleet
    from placement.router.sources import FilePlanSource
    from placement.router.wiring import build_router, run_router, write_port_file
    from placement.settings import RouterSettings, Settings

    fleet = load_fleet(args.fleet)
    catalog = load_catalog(args.catalog, fleet=fleet) if args.catalog else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    app = build_router(
        fleet=fleet,
        plan=FilePlanSource(Path(args.plan)) if args.plan else None,
        catalog=catalog,
        settings=Settings(router=RouterSettings(policy=args.policy)),
        # The CLI's clock options at their defaults give the wall clock, which is
        # build_router's default too (the keyword's name has changed over time).
    )

    def listening(port: int) -> None:
        if args.port_file:
            write_port_file(Path(args.port_file), port)
        print(f"lorafleet router on http://{args.host}:{port}", file=sys.stderr, flush=True)

    run_router(app, host=args.host, port=args.port, on_listening=listening)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pods = sub.add_parser("pods", help="emulated vLLM/SGLang pods, one per port")
    pods.add_argument(
        "--ports", required=True, help="comma-separated ports on 127.0.0.1 (0: any free one)"
    )
    pods.add_argument("--ports-file", help="write {name: URL} here as JSON once listening")
    pods.add_argument("--first-index", type=int, default=0, help="name of the first: pod-N")
    pods.add_argument("--engine", default="vllm")
    pods.add_argument("--served-model-name", default="base-model")
    pods.add_argument("--base-model", default="llama-3.1-8b")
    pods.add_argument("--max-loras", type=int, default=4)
    pods.add_argument("--max-cpu-loras", type=int, default=16)
    pods.add_argument("--max-lora-rank", type=int, default=64)
    pods.add_argument("--ttft-ms", type=float, default=0.0, help="0 and 0: zero latency")
    pods.add_argument("--tpot-ms", type=float, default=0.0)
    pods.add_argument("--uvloop", action="store_true", help="serve on uvloop")
    pods.add_argument("--fleet-out", help="write the fleet.yaml of these pods here")
    router = sub.add_parser("router", help="the lorafleet router (as `lorafleet router`)")
    router.add_argument("--fleet", required=True)
    router.add_argument("--plan")
    router.add_argument("--catalog")
    router.add_argument("--policy", default="plan")
    router.add_argument("--host", default=HOST)
    router.add_argument("--port", type=int, required=True, help="0: any free one")
    router.add_argument("--port-file", help="write the port here once listening")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.command == "pods":
        _pods(args)
    else:
        _router(args)
    print(f"{args.command} exited after {time.perf_counter() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
