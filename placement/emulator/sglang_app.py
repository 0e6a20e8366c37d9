"""An emulated SGLang pod: the routes and texts of POD-API.md's SGLang table.

LoRA failures are HTTP 400 ``{"success": false, "error_message": ...}``; requests name
an adapter as ``<served-base>:<adapter>`` and a bare adapter name is "not served".
The full-pool, rank and pin texts are SGLang's (tokenizer and LoRA managers); the
missing-path text is this emulator's own, worded like SGLang's. A dead pod answers 503.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from placement.emulator.pod import (
    AlreadyLoadedError,
    BadPathError,
    EmulatedPod,
    EmulatorError,
    InjectedError,
    NotLoadedError,
    PinLimitError,
    PodDownError,
    PoolFullError,
    RankTooLargeError,
)
from placement.emulator.wire import add_admin_routes, add_serving_routes, complete, read_json


def _lora_answer(pod: EmulatedPod, *, ok: bool, message: str = "") -> JSONResponse:
    body = {
        "success": ok,
        "error_message": message,
        "loaded_adapters": {name: adapter.path for name, adapter in pod.listed.items()},
    }
    return JSONResponse(body, status_code=200 if ok else 400)


def _openai_error(status: int, message: str) -> JSONResponse:
    body = {"object": "error", "message": message, "type": "NotFoundError", "code": status}
    return JSONResponse(body, status_code=status)


def _guard(pod: EmulatedPod, *, inject: bool = True) -> Response | None:
    try:
        pod.check(inject=inject)
    except PodDownError:
        return PlainTextResponse(f"pod {pod.config.name} is down", status_code=503)
    except InjectedError:
        return PlainTextResponse("Internal Server Error (injected)", status_code=500)
    return None


def _load_refusal(pod: EmulatedPod, exc: EmulatorError, name: str, path: str) -> str:
    config = pod.config
    messages: dict[type[EmulatorError], str] = {
        AlreadyLoadedError: f"Failed to load LoRA adapter {name} because it is already loaded",
        BadPathError: f"Failed to load LoRA adapter {name}: no adapter found at {path}",
        PoolFullError: (
            f"Cannot load LoRA adapter {name} at path {path}. Maximum number of loaded "
            f"LoRA adapters is {config.cpu_slots}. Please unload some LoRA adapters before "
            "loading new ones."
        ),
        PinLimitError: (
            f"Failed to load LoRA adapter {name} as a pinned adapter. It is not allowed to "
            "pin all slots in the LoRA memory pool to avoid starvation for unpinned adapters "
            "and base models. Please increase your `--max-loras-per-batch` or load it as "
            "unpinned LoRA adapters."
        ),
    }
    if isinstance(exc, RankTooLargeError):
        return (
            f"LoRA adapter {name} with rank {exc.rank} is incompatible with the current LoRA "
            "memory pool configuration. Please ensure that the LoRA adapter's rank is within "
            "the configured `--max-lora-rank` and that the target modules are included in "
            "`--lora-target-modules`."
        )
    return messages.get(type(exc), f"Failed to load LoRA adapter {name}: {type(exc).__name__}")


def _metrics_text(pod: EmulatedPod) -> str:
    labels = f'model_name="{pod.config.served_model_name}"'
    gauges = {
        "sglang:num_running_reqs": sum(pod.running.values()),
        "sglang:num_queue_reqs": sum(pod.waiting.values()),
        "sglang:token_usage": pod.kv_usage,
        "sglang:lora_pool_slots_used": len(pod.gpu),
        "sglang:lora_pool_slots_total": pod.config.max_loras,
    }
    lines = []
    for name, value in gauges.items():
        lines += [f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)}"]
    return "\n".join(lines) + "\n"


def _add_lora_routes(app: FastAPI, pod: EmulatedPod) -> None:
    @app.post("/load_lora_adapter")
    async def load(request: Request) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        if not pod.config.enable_lora:
            message = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
            return _lora_answer(pod, ok=False, message=message)
        body = await read_json(request)
        name, path = str(body.get("lora_name", "")), str(body.get("lora_path", ""))
        try:
            await pod.load(name, path, pinned=bool(body.get("pinned", False)))
        except PodDownError:
            return PlainTextResponse(f"pod {pod.config.name} restarted", status_code=503)
        except EmulatorError as exc:
            return _lora_answer(pod, ok=False, message=_load_refusal(pod, exc, name, path))
        return _lora_answer(pod, ok=True)

    @app.post("/unload_lora_adapter")
    async def unload(request: Request) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        name = str((await read_json(request)).get("lora_name", ""))
        try:
            await pod.unload(name)
        except NotLoadedError:
            loaded = ", ".join(repr(n) for n in pod.listed)
            message = f"LoRA with name {name} does not exist. Loaded LoRAs: dict_keys([{loaded}])"
            return _lora_answer(pod, ok=False, message=message)
        except PodDownError:
            return PlainTextResponse(f"pod {pod.config.name} restarted", status_code=503)
        return _lora_answer(pod, ok=True)


def _add_serving_routes(app: FastAPI, pod: EmulatedPod) -> None:
    async def serve(request: Request, *, chat: bool) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        body = await read_json(request)
        base = pod.config.served_model_name
        model = str(body.get("model") or base)
        head, _, adapter = model.partition(":")
        if model != base and (head != base or adapter not in pod.listed):
            return _openai_error(404, f"Model '{model}' is not served.")
        try:
            return await complete(pod, adapter=adapter or None, model=model, body=body, chat=chat)
        except PodDownError:
            return PlainTextResponse(f"pod {pod.config.name} restarted", status_code=503)

    add_serving_routes(
        app, pod, serve=serve, guard=_guard, metrics_text=_metrics_text, owned_by="sglang"
    )


def create_sglang_app(pod: EmulatedPod) -> FastAPI:
    app = FastAPI(title=f"emulated SGLang {pod.config.name}", docs_url=None, redoc_url=None)
    _add_lora_routes(app, pod)
    _add_serving_routes(app, pod)
    add_admin_routes(app, pod)
    return app
