"""The proxy's upstream client alone: CPU per request through aiohttp (the router's data
path before router/upstream.py, configured as it was) and through ``router.upstream``.

One emulated vLLM pod (zero simulated latency) runs in a child process; this process
sends ``--requests`` completions over ``--concurrency`` keep-alive connections on uvloop
(as the router runs), each client in turn, ``--rounds`` times, and prints this process's
CPU time per request (``time.process_time``: the client's parsing, pooling and socket
calls, and the event loop's share). Every answer must be a 200.

    .venv/bin/python -m bench.upstream_client [--rounds 4] [--requests 4000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import uvloop

from bench.router_overhead import PODS_SCRIPT, _ports_in, _wait_up
from placement.router.upstream import Upstreams

BODY = b'{"model": "base-model", "prompt": "hello", "max_tokens": 1}'
WARM_UP = 200


async def _per_request_us(one: Callable[[], Awaitable[None]], requests: int, workers: int) -> float:
    for _ in range(WARM_UP):
        await one()
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return (time.process_time() - started) / requests * 1e6


async def _aiohttp(url: str, requests: int, workers: int) -> float:
    connector = aiohttp.TCPConnector(limit=1024, limit_per_host=0, keepalive_timeout=4.0)
    timeout = aiohttp.ClientTimeout(total=600.0, sock_connect=2.0)
    async with aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        timeout=timeout,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    ) as session:
        headers = {"content-type": "application/json"}

        async def one() -> None:
            async with session.post(url, data=BODY, headers=headers) as reply:
                await reply.read()
                if reply.status != 200:
                    raise RuntimeError(f"aiohttp: the pod answered {reply.status}")

        return await _per_request_us(one, requests, workers)


async def _upstream(url: str, requests: int, workers: int) -> float:
    client = Upstreams(
        timeout_s=600.0, connect_timeout_s=2.0, keepalive_s=4.0, max_connections=1024
    )

    async def one() -> None:
        reply = await client.post("pod-0", url, BODY, whole=True)  # as the proxy reads an answer
        try:
            await reply.read()
            if reply.status != 200:
                raise RuntimeError(f"upstream: the pod answered {reply.status}")
        finally:
            reply.release()

    try:
        return await _per_request_us(one, requests, workers)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ports_file = Path(tmp) / "pods.ports"
        pods = subprocess.Popen([sys.executable, "-c", PODS_SCRIPT, "1", str(ports_file)])
        try:
            (port,) = _ports_in(ports_file, pods)
            asyncio.run(_wait_up(f"http://127.0.0.1:{port}/health"))
            url = f"http://127.0.0.1:{port}/v1/completions"
            figures: dict[str, list[float]] = {"aiohttp": [], "router.upstream": []}
            for _ in range(args.rounds):  # alternated: the machine's load hits both alike
                figures["aiohttp"].append(
                    uvloop.run(_aiohttp(url, args.requests, args.concurrency))
                )
                figures["router.upstream"].append(
                    uvloop.run(_upstream(url, args.requests, args.concurrency))
                )
        finally:
            pods.terminate()
            pods.wait()
    for name, values in figures.items():
        rounded = ", ".join(f"{value:.0f}" for value in values)
        print(
            f"{name:16s} client CPU us/request: {rounded} (median {statistics.median(values):.0f})"
        )
    ratio = statistics.median(figures["router.upstream"]) / statistics.median(figures["aiohttp"])
    print(f"router.upstream over aiohttp (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
