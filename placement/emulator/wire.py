"""What both emulated dialects share on the wire: OpenAI completions and admin routes.

Completions answer in the OpenAI shape, or as SSE chunks (``data: {...}`` then
``data: [DONE]``) with ``"stream": true``. The admin routes are the emulator's own:

- ``GET /admin/stats``: what the engine model holds: ``listed`` (also as
  ``registered``), ``parked`` (SGLang: unloaded by its soft cap or an unload, reloaded
  on use), ``host`` and ``gpu`` in LRU order, ``ghosts`` (vLLM GPU slots held by
  unloaded names), ``pinned``; counters (loads, unloads, gpu_activations,
  gpu_evictions, host_evictions, unlisted, cold_reloads, requests, injected_errors,
  restarts, over_limit) and peaks.
- ``POST /admin/fault``: ``{"error_rate": 0.2, "slow_load_ms": 500, "down_s": 1.5}``,
  any subset; ``down_s`` kills the pod now and brings it back empty after that long.
- ``POST /admin/restart``: come back empty at once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any, TypedDict

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from placement.emulator.pod import EmulatedPod

ErrorBody = Callable[[int, str, str | None], Response]

DEFAULT_MAX_TOKENS = 16


async def read_json(request: Request) -> dict[str, Any]:
    """The JSON object body, or an empty dict when it is absent or not an object."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}


def _prompt_tokens(body: dict[str, Any]) -> int:
    if isinstance(body.get("messages"), list):
        text = " ".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    else:
        text = str(body.get("prompt", ""))
    return max(1, len(text.split()))


def _max_tokens(body: dict[str, Any]) -> int:
    raw = body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    return raw if isinstance(raw, int) and raw > 0 else DEFAULT_MAX_TOKENS


def _choice(*, chat: bool, text: str, finish: str | None, stream: bool) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    key = "delta" if stream else "message"
    return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}


def _envelope(*, chat: bool, model: str, request_id: str, stream: bool) -> dict[str, Any]:
    kind = "chat.completion" if chat else "text_completion"
    return {
        "id": request_id,
        "object": f"{kind}.chunk" if stream and chat else kind,
        "created": int(time.time()),
        "model": model,
    }


async def complete(
    pod: EmulatedPod, *, adapter: str | None, model: str, body: dict[str, Any], chat: bool
) -> Response:
    """Admit the request on ``pod``, then answer it whole or as an SSE stream."""
    prompt_tokens, max_tokens = _prompt_tokens(body), _max_tokens(body)
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    entry = await pod.admit(adapter)  # what it runs on, for its release
    tokens = pod.generate(prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    if body.get("stream"):
        return _ReleasingStream(
            _stream(tokens, chat=chat, model=model, request_id=request_id),
            release=lambda: pod.release(adapter, entry),
        )
    try:
        text = "".join([f" tok{index}" async for index in tokens])
    finally:
        await pod.release(adapter, entry)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens,
    }
    envelope = _envelope(chat=chat, model=model, request_id=request_id, stream=False)
    choice = _choice(chat=chat, text=text, finish="length", stream=False)
    return JSONResponse({**envelope, "choices": [choice], "usage": usage})


class _ReleasingStream(StreamingResponse):
    """An SSE stream that ends its request once sent, or once the send fails: Starlette
    never iterates a body whose start it could not send (the client left), so a
    ``finally`` in the body would not run."""

    def __init__(self, content: AsyncIterator[str], *, release: Callable[[], Awaitable[None]]):
        super().__init__(content, media_type="text/event-stream")
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


async def _stream(
    tokens: AsyncIterator[int], *, chat: bool, model: str, request_id: str
) -> AsyncIterator[str]:
    envelope = _envelope(chat=chat, model=model, request_id=request_id, stream=True)
    async for index in tokens:
        choice = _choice(chat=chat, text=f" tok{index}", finish=None, stream=True)
        yield f"data: {json.dumps({**envelope, 'choices': [choice]})}\n\n"
    last = _choice(chat=chat, text="", finish="length", stream=True)
    yield f"data: {json.dumps({**envelope, 'choices': [last]})}\n\n"
    yield "data: [DONE]\n\n"


def model_card(model_id: str, *, root: str, parent: str | None, owned_by: str) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": 0,
        "owned_by": owned_by,
        "root": root,
        "parent": parent,
        "permission": [],
    }


def models_listing(pod: EmulatedPod, *, owned_by: str) -> dict[str, Any]:
    config = pod.config
    base = model_card(
        config.served_model_name, root=config.model_path, parent=None, owned_by=owned_by
    )
    cards = [
        model_card(name, root=adapter.path, parent=config.served_model_name, owned_by=owned_by)
        for name, adapter in pod.listed.items()
    ]
    return {"object": "list", "data": [base, *cards]}


class PodStats(TypedDict):
    """What ``GET /admin/stats`` answers (the module docstring lists it), typed."""

    pod: str
    engine: str
    engine_model: str
    registered: list[str]
    listed: list[str]
    parked: list[str]
    host: list[str]
    gpu: list[str]
    ghosts: int
    residency_s: dict[str, list[float]]
    pinned: list[str]
    running: int
    waiting: int
    limits: dict[str, int | None]
    storage: dict[str, object] | None
    batch: dict[str, Any] | None
    queued: int
    batch_peaks: dict[str, int]
    counters: dict[str, int]
    peaks: dict[str, int]
    faults: dict[str, float | bool]


def pod_stats(pod: EmulatedPod) -> PodStats:
    """What ``GET /admin/stats`` answers (the module docstring lists it)."""
    model = pod.residency
    now = pod.clock()
    return {
        "pod": pod.config.name,
        "engine": pod.config.engine.value,
        "engine_model": pod.config.model.value,
        "registered": list(model.listed),
        "listed": list(model.listed),
        "parked": list(model.parked),
        "host": list(model.in_host()),
        "gpu": list(model.on_gpu()),
        "ghosts": model.ghosts_on_gpu(),
        "residency_s": {
            "ended": [round(v, 3) for v in pod.residencies_s],
            "ongoing": [round(now - t, 3) for stamps in pod.activated_at.values() for t in stamps],
        },
        "pinned": sorted(model.pinned),
        "running": sum(pod.running.values()),
        "waiting": sum(pod.waiting.values()),
        "limits": {"max_loras": pod.config.max_loras, "max_cpu_loras": pod.config.cpu_slots},
        "storage": pod.config.storage_stats(),
        "batch": None if pod.config.batch is None else asdict(pod.config.batch),
        "queued": pod.seats.queued,
        "batch_peaks": {"running": pod.seats.peak_taken, "queued": pod.seats.peak_queued},
        "counters": dict(pod.counters),
        "peaks": dict(pod.peaks),
        "faults": {
            "error_rate": pod.faults.error_rate,
            "slow_load_ms": pod.faults.slow_load_ms,
            "down": pod.is_down(),
        },
    }


def add_admin_routes(app: FastAPI, pod: EmulatedPod) -> None:
    @app.get("/admin/stats")
    async def stats() -> JSONResponse:
        return JSONResponse(pod_stats(pod))

    @app.post("/admin/fault")
    async def fault(request: Request) -> JSONResponse:
        body = await read_json(request)
        changes = {
            key: float(body[key])
            for key in ("error_rate", "slow_load_ms")
            if isinstance(body.get(key), int | float)
        }
        pod.set_faults(**changes)
        if isinstance(body.get("down_s"), int | float):
            pod.kill(float(body["down_s"]))
        return JSONResponse(pod_stats(pod)["faults"])

    @app.post("/admin/restart")
    async def restart() -> JSONResponse:
        pod.restart()
        return JSONResponse({"restarted": pod.config.name})


Serve = Callable[..., Awaitable[Response]]
Guard = Callable[..., Response | None]


def add_serving_routes(
    app: FastAPI,
    pod: EmulatedPod,
    *,
    serve: Serve,
    guard: Guard,
    metrics_text: Callable[[EmulatedPod], str] | None,
    owned_by: str,
) -> None:
    """The routes both engines answer alike: completions, chat, models, health, metrics.

    ``serve(request, chat=...)`` is the engine's own way of naming models; ``guard`` its
    answer for a pod that is down or injecting errors; without ``metrics_text`` there is
    no ``/metrics`` route (FastAPI's 404), as on SGLang without ``--enable-metrics``."""

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)

    @app.get("/v1/models")
    async def models() -> Response:
        if (refused := guard(pod)) is not None:
            return refused
        return JSONResponse(models_listing(pod, owned_by=owned_by))

    @app.get("/health")
    async def health() -> Response:
        return guard(pod, inject=False) or Response(status_code=200)

    if metrics_text is None:
        return

    @app.get("/metrics")
    async def metrics() -> Response:
        if (refused := guard(pod, inject=False)) is not None:
            return refused
        return PlainTextResponse(metrics_text(pod), media_type="text/plain; version=0.0.4")


def error_stream(event: dict[str, Any]) -> StreamingResponse:
    """A stream that fails before its first token: 200, one error event, then [DONE]."""

    async def events() -> AsyncIterator[str]:
        yield f"data: {json.dumps(event)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
