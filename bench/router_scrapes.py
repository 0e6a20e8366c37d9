"""The CPU a router spends on one scrape round, through httpx and through aiohttp.

Emulated vLLM pods (zero simulated latency) run in a child process; this process
builds a ``Router`` in front of them and runs its scrape round (``scrape_all``: every
pod's ``/metrics``, parsed, and every ``listing_every_scrapes``-th round each pod's
``/v1/models``) in blocks of ``--rounds``, alternating the two ways of reading the pods:
``HttpxScrapes`` over an ``httpx.AsyncClient`` made as the router made it before
(one keep-alive pool) and ``AiohttpScrapes`` (what a started router uses now). The
figure is this process's CPU (user plus system, ``time.process_time``) per round and
per pod read, the median over ``--blocks`` blocks of each; the pods' CPU is not
counted. A router worker runs one round every ``scrape_interval_s`` (0.25 s), so a
round's CPU times four is the share of a core each worker spends on scrapes at idle.

    .venv/bin/python -m bench.router_scrapes [--pods 4] [--rounds 200] [--blocks 5]

With ``--gc-freeze`` (without ``--stall``): each block also runs the aiohttp way with the
heap frozen (``gc.freeze()``, as a router frozen after its start), ``aiohttp_frozen``:
after the others in even blocks, before them in odd ones.

With ``--stall``: the event loop's longest stall while the router scrapes one pod whose
``/metrics`` is a vLLM page of ``--page-bytes`` (about 8 MB, under the 8 MiB cap: read
whole; its ``lora_requests_info`` series grown), served by a plain HTTP server in a
child process; once as it is, once with one line the parser refuses (the lenient
reading's line-by-line path). A task on the loop sleeps 1 ms at a time; its lateness is
the loop's stall (what a proxied request would have waited). The figures are the
longest and the 99th percentile lateness over ``--rounds`` scrape rounds, and a round's
wall and CPU seconds.

    .venv/bin/python -m bench.router_scrapes --stall [--page-bytes 8000000] [--rounds 3]

With ``--stall --gc-freeze``: each page is measured ``--pairs`` times, alternating: as
it is and with ``gc.freeze()`` after the router's first scrape round (its start; every
way runs ``gc.collect()`` there first, so none starts from an emptier heap), so
that the collector's full passes (which hold the GIL, in the parse thread, over the
whole heap) no longer walk what the process held at its start. ``--gc-threshold
700,10,40`` adds a third way: those thresholds (``gc.set_threshold``) from the same
point. Each way's figures also count the full collections a round and the longest.

    .venv/bin/python -m bench.router_scrapes --stall --gc-freeze [--gc-threshold T] [--pairs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.router_overhead import PODS_SCRIPT, _pct, _ports_in, _wait_up
from placement.emulator import EmulatedFleet, PodConfig
from placement.router import FleetPodSource, Router
from placement.router.scrape_http import AiohttpScrapes, HttpxScrapes, ScrapeHttp
from placement.router.sources import StaticPlanSource
from placement.settings import RouterSettings


async def _block(router: Router, http: ScrapeHttp, rounds: int) -> float:
    """CPU seconds of ``rounds`` scrape rounds through ``http``."""
    router.scrape_http = http
    await router.scrape_all()  # connections opened outside the measure
    gc.collect()  # each block from a collected heap, as the frozen one (_frozen_block)
    started = time.process_time()
    for _ in range(rounds):
        await router.scrape_all()
    return time.process_time() - started


async def _frozen_block(
    router: Router, ways: dict[str, ScrapeHttp], args: argparse.Namespace
) -> float:
    """The aiohttp block with the heap frozen (as a router frozen after its start)."""
    gc.collect()
    gc.freeze()
    try:
        return await _block(router, ways["aiohttp"], args.rounds)
    finally:
        gc.unfreeze()


async def _measure(ports: list[int], args: argparse.Namespace) -> dict[str, object]:
    config = replace(PodConfig(), max_loras=4, max_cpu_loras=16)
    fleet = EmulatedFleet.start(len(ports), ports=ports, config=config).domain()
    for pod in fleet.pods:
        await _wait_up(pod.url + "/health")
    settings = RouterSettings()
    router = Router(
        plan_source=StaticPlanSource(None),
        pod_source=FleetPodSource(fleet),
        settings=settings,
    )
    await router.refresh_pods()
    most = settings.max_connections
    limits = httpx.Limits(max_connections=most, max_keepalive_connections=most)
    spent: dict[str, list[float]] = {"httpx": [], "aiohttp": []}
    if args.gc_freeze:
        spent["aiohttp_frozen"] = []
    async with httpx.AsyncClient(limits=limits) as client:
        ways: dict[str, ScrapeHttp] = {"httpx": HttpxScrapes(client), "aiohttp": AiohttpScrapes()}
        try:
            for block in range(args.blocks):
                frozen_first = args.gc_freeze and block % 2 == 1  # no order favoured
                if frozen_first:
                    spent["aiohttp_frozen"].append(await _frozen_block(router, ways, args))
                for name, http in ways.items():
                    spent[name].append(await _block(router, http, args.rounds))
                if args.gc_freeze and not frozen_first:
                    spent["aiohttp_frozen"].append(await _frozen_block(router, ways, args))
        finally:
            await ways["aiohttp"].close()
    unhealthy = [str(pod) for pod, state in router.topology.pods.items() if not state.healthy]
    per_round_us = {
        name: round(statistics.median(values) / args.rounds * 1e6, 1)
        for name, values in spent.items()
    }
    return {
        "pods": len(ports),
        "rounds_per_block": args.rounds,
        "blocks": args.blocks,
        "listing_every_scrapes": settings.listing_every_scrapes,
        "cpu_us_per_round": per_round_us,
        "cpu_us_per_pod_scrape": {k: round(v / len(ports), 1) for k, v in per_round_us.items()},
        "idle_core_share_at_4_rounds_per_s": {
            k: round(v * 4 / 1e6, 4) for k, v in per_round_us.items()
        },
        "aiohttp_over_httpx": round(per_round_us["aiohttp"] / per_round_us["httpx"], 3),
        "unhealthy_pods": unhealthy,
    }


# argv: the page's file, the port file. A plain server: its CPU is not the router's.
PAGE_SCRIPT = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from placement.inputs.files import write_atomically
page = Path(sys.argv[1]).read_bytes()
listing = b'{"object": "list", "data": [{"id": "base-model", "object": "model"}]}'
class Pod(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = {"/metrics": page, "/v1/models": listing}.get(self.path, b"ok")
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Pod)
write_atomically(Path(sys.argv[2]), f"{server.server_address[1]}\\n")
server.serve_forever()
"""

_HEAD = (
    'vllm:num_requests_running{engine="0",model_name="base-model"} 1.0\n'
    'vllm:num_requests_waiting{engine="0",model_name="base-model"} 0.0\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="base-model"} 0.25\n'
    "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
    "# TYPE vllm:lora_requests_info gauge\n"
)


def _big_page(size: int, *, broken: bool) -> bytes:
    """A vLLM page of about ``size`` bytes, its LoRA series grown; one line in its middle
    the parser refuses if ``broken``."""
    lines: list[str] = []
    total = len(_HEAD)
    while total < size:
        line = (
            f'vllm:lora_requests_info{{max_lora="4",running_lora_adapters="a{len(lines)}",'
            f'waiting_lora_adapters=""}} {1.7e9 + len(lines)}\n'
        )
        lines.append(line)
        total += len(line)
    if broken:
        lines.insert(len(lines) // 2, "<!-- a proxy's banner -->\n")
    return (_HEAD + "".join(lines)).encode()


class _FullCollections:
    """The collector's full (generation 2) passes while it is installed: their count and
    the longest, in seconds (``gc.callbacks``, called in whichever thread collects)."""

    def __init__(self) -> None:
        self.took_s: list[float] = []
        self._began_s = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began_s = time.perf_counter()
        else:
            self.took_s.append(time.perf_counter() - self._began_s)


async def _stalls(
    port: int, rounds: int, *, freeze: bool = False, threshold: tuple[int, ...] = ()
) -> dict[str, float]:
    """The loop's lateness while ``rounds`` scrape rounds read the pod on ``port``; with
    ``freeze``, the heap frozen (``gc.freeze``) after the first round, until the end;
    with ``threshold``, the collector's thresholds set to it meanwhile."""
    fleet = EmulatedFleet.start(1, ports=[port], config=PodConfig()).domain()
    router = Router(
        plan_source=StaticPlanSource(None),
        pod_source=FleetPodSource(fleet),
        settings=RouterSettings(),
    )
    await router.refresh_pods()
    router.scrape_http = AiohttpScrapes()
    late_s: list[float] = []
    done, frozen, thresholds = False, 0, gc.get_threshold()

    async def tick() -> None:
        while not done:
            asked_s = time.perf_counter()
            await asyncio.sleep(0.001)
            late_s.append(time.perf_counter() - asked_s - 0.001)

    try:
        await router.scrape_all()  # the connection opened, the first listing read
        # Every way starts from a collected heap, not only the frozen one (else it alone
        # would start from an emptier heap).
        gc.collect()
        if freeze:
            gc.freeze()
        frozen, thresholds = gc.get_freeze_count(), gc.get_threshold()
        if threshold:
            gc.set_threshold(*threshold)
        ticking = asyncio.create_task(tick())
        await asyncio.sleep(0.05)
        late_s.clear()
        gc.callbacks.append(full := _FullCollections())
        wall_s, cpu_s = time.perf_counter(), time.process_time()
        try:
            for _ in range(rounds):
                await router.scrape_all()
        finally:
            gc.callbacks.remove(full)
        wall_s, cpu_s = time.perf_counter() - wall_s, time.process_time() - cpu_s
        done = True
        await ticking
    finally:
        await router.scrape_http.close()
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    (state,) = router.topology.pods.values()
    return {
        "frozen_objects": frozen,
        "full_gc_per_round": round(len(full.took_s) / rounds, 1),
        "longest_full_gc_ms": round(max(full.took_s, default=0.0) * 1e3, 1),
        "longest_stall_ms": round(max(late_s) * 1e3, 1),
        "p99_stall_ms": round(_pct(late_s, 0.99) * 1e3, 1),
        "wall_s_per_round": round(wall_s / rounds, 3),
        "cpu_s_per_round": round(cpu_s / rounds, 3),
        "healthy": state.healthy,
    }


def _gc_ways(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The ways of running the collector to compare with as it is (``_stalls``' keywords)."""
    ways: dict[str, dict[str, Any]] = {}
    if args.gc_freeze:
        ways["frozen"] = {"freeze": True}
    if args.gc_threshold:
        ways["threshold"] = {"threshold": tuple(int(t) for t in args.gc_threshold.split(","))}
    return ways


def _stall_figures(args: argparse.Namespace) -> dict[str, object]:
    figures: dict[str, object] = {"page_bytes": args.page_bytes, "rounds": args.rounds}
    for name, broken in (("whole", False), ("one_bad_line", True)):
        with tempfile.TemporaryDirectory() as scratch:
            page_file, port_file = Path(scratch) / "page", Path(scratch) / "port"
            page_file.write_bytes(_big_page(args.page_bytes, broken=broken))
            pod = subprocess.Popen(
                [sys.executable, "-c", PAGE_SCRIPT, str(page_file), str(port_file)]
            )
            try:
                (port,) = _ports_in(port_file, pod)
                ways: dict[str, dict[str, Any]] = {"as_is": {}} | _gc_ways(args)
                if len(ways) == 1:
                    figures[name] = asyncio.run(_stalls(port, args.rounds))
                    continue
                figures[name] = [
                    {
                        way: asyncio.run(_stalls(port, args.rounds, **how))
                        for way, how in ways.items()
                    }
                    for _ in range(args.pairs)
                ]
            finally:
                pod.terminate()
                pod.wait()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--rounds", type=int, help="200 rounds a block; 3 with --stall")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--stall", action="store_true", help="the loop's stall on a big page")
    parser.add_argument("--page-bytes", type=int, default=8_000_000)
    parser.add_argument(
        "--gc-freeze", action="store_true", help="also with gc.freeze(), alternating"
    )
    parser.add_argument("--gc-threshold", help="with --stall: also with these gc thresholds")
    parser.add_argument("--pairs", type=int, default=2, help="with --gc-freeze or --gc-threshold")
    args = parser.parse_args()
    if args.stall:
        args.rounds = args.rounds or 3
        print(json.dumps(_stall_figures(args), indent=2))
        return
    args.rounds = args.rounds or 200
    with tempfile.TemporaryDirectory() as scratch:
        pods_file = Path(scratch) / "pods"
        pods = subprocess.Popen([sys.executable, "-c", PODS_SCRIPT, str(args.pods), str(pods_file)])
        try:
            figures = asyncio.run(_measure(_ports_in(pods_file, pods), args))
        finally:
            pods.terminate()
            pods.wait()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
