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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx

from bench.router_overhead import PODS_SCRIPT, _ports_in, _wait_up
from placement.emulator import EmulatedFleet, PodConfig
from placement.router import FleetPodSource, Router
from placement.router.scrape_http import AiohttpScrapes, HttpxScrapes, ScrapeHttp
from placement.router.sources import StaticPlanSource
from placement.settings import RouterSettings


async def _block(router: Router, http: ScrapeHttp, rounds: int) -> float:
    """CPU seconds of ``rounds`` scrape rounds through ``http``."""
    router.scrape_http = http
    await router.scrape_all()  # connections opened outside the measure
    started = time.process_time()
    for _ in range(rounds):
        await router.scrape_all()
    return time.process_time() - started


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
    async with httpx.AsyncClient(limits=limits) as client:
        ways: dict[str, ScrapeHttp] = {"httpx": HttpxScrapes(client), "aiohttp": AiohttpScrapes()}
        try:
            for _ in range(args.blocks):
                for name, http in ways.items():
                    spent[name].append(await _block(router, http, args.rounds))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
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
