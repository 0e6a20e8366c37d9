"""The load of router_latency.py: Poisson arrivals sent open loop, and a closed-loop maximum.

Owns the arrival sequence (the same for the direct and the routed path), sending each
request at its offset whatever is in flight and timing it (from the send and from the
intended send, with how late the generator sent), the closed-loop throughput of a
number of workers, and the percentiles. It starts no process (``router_fleet``) and
records no result (router_latency.py).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import aiohttp

PROMPT = "Summarise the following support ticket in one sentence: the printer is offline."


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
    out: list[tuple[float, str]] = []
    t = 0.0
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
