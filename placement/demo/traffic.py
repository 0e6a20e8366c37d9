"""Replay a slice of a request log through an OpenAI-compatible endpoint, in accelerated time.

``select`` thins a time window of the log to a request budget (keeping each request's
adapter, tenant and token counts, and the order and relative timing of what is kept)
and compresses its clock by ``speed``; ``drive`` sends it with the real ``openai``
client, streaming, and times the first token of each answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import openai
import pandas as pd

#: Prompts and answers are capped so that emulated pods stay far from KV pressure.
MAX_PROMPT_WORDS = 256
MAX_OUTPUT_TOKENS = 16


@dataclass(frozen=True, kw_only=True)
class Shot:
    """One request to send ``at_s`` seconds after the replay starts."""

    at_s: float
    adapter: str
    tenant: str
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, kw_only=True)
class ShotResult:
    adapter: str
    ok: bool
    ttft_ms: float
    error: str = ""


def select(
    frame: pd.DataFrame,
    *,
    start: datetime,
    end: datetime,
    max_requests: int,
    speed: float,
    rng: np.random.Generator,
) -> list[Shot]:
    """The requests of [start, end), thinned at random to ``max_requests``, on a fast clock."""
    window = frame[(frame["ts"] >= start) & (frame["ts"] < end)]
    if len(window) > max_requests:
        keep = np.sort(rng.choice(len(window), size=max_requests, replace=False))
        window = window.iloc[keep]
    offsets_s = (window["ts"] - pd.Timestamp(start)).dt.total_seconds().to_numpy() / speed
    tenants = (
        window["tenant"].astype(str) if "tenant" in window else pd.Series("", index=window.index)
    )
    prompts = (
        window["prompt_tokens"] if "prompt_tokens" in window else pd.Series(64, index=window.index)
    )
    outputs = (
        window["output_tokens"] if "output_tokens" in window else pd.Series(8, index=window.index)
    )
    return [
        Shot(
            at_s=float(at),
            adapter=str(adapter),
            tenant=str(tenant),
            prompt_tokens=int(p),
            output_tokens=int(o),
        )
        for at, adapter, tenant, p, o in zip(
            offsets_s, window["adapter"].astype(str), tenants, prompts, outputs, strict=True
        )
    ]


async def _send(client: openai.AsyncOpenAI, shot: Shot) -> ShotResult:
    words = " ".join(["lorem"] * min(MAX_PROMPT_WORDS, max(1, shot.prompt_tokens)))
    began = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=shot.adapter,
            messages=[{"role": "user", "content": words}],
            max_tokens=min(MAX_OUTPUT_TOKENS, max(1, shot.output_tokens)),
            stream=True,
            user=shot.tenant or openai.omit,
        )
        first_ms: float | None = None
        async for _chunk in stream:
            if first_ms is None:
                first_ms = (time.perf_counter() - began) * 1000
        return ShotResult(adapter=shot.adapter, ok=True, ttft_ms=first_ms or 0.0)
    except openai.APIError as exc:
        return ShotResult(adapter=shot.adapter, ok=False, ttft_ms=0.0, error=type(exc).__name__)


async def drive(
    shots: Sequence[Shot],
    *,
    base_url: str,
    concurrency: int = 64,
    on_done: Callable[[ShotResult], None] | None = None,
) -> list[ShotResult]:
    """Send every shot at its time (or as soon as a connection frees up) and collect results."""
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key="lorafleet-demo", max_retries=0, timeout=60.0
    )
    gate = asyncio.Semaphore(concurrency)
    results: list[ShotResult] = []

    async def one(shot: Shot) -> None:
        async with gate:
            result = await _send(client, shot)
        results.append(result)
        if on_done is not None:
            on_done(result)

    loop = asyncio.get_running_loop()
    started = loop.time()
    tasks = []
    async with client:
        for shot in shots:
            delay = started + shot.at_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(shot)))
        await asyncio.gather(*tasks)
    return results
