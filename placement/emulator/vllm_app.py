"""An emulated vLLM pod: the routes, status codes and texts of POD-API.md's vLLM table.

Error bodies are ``{"error": {"message", "type", "param", "code"}}``. Without runtime
LoRA updating the two POST routes are simply not mounted, so FastAPI answers its own
404 ``{"detail":"Not Found"}`` as vLLM does. A dead pod answers 503.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from placement.emulator.pod import (
    AlreadyLoadedError,
    BadPathError,
    EmulatedPod,
    InjectedError,
    NotLoadedError,
    PodDownError,
    RankTooLargeError,
)
from placement.emulator.wire import add_admin_routes, add_serving_routes, complete, read_json

_KINDS = {400: "InvalidUserInput", 404: "NotFoundError", 500: "InternalServerError"}


def vllm_error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = _KINDS.get(status, "ServiceUnavailableError")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def _guard(pod: EmulatedPod, *, inject: bool = True) -> Response | None:
    try:
        pod.check(inject=inject)
    except PodDownError:
        return vllm_error(503, f"pod {pod.config.name} is down")
    except InjectedError:
        return vllm_error(500, "injected failure")
    return None


def _metrics_text(pod: EmulatedPod) -> str:
    labels = f'engine="0",model_name="{pod.config.served_model_name}"'
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(sum(pod.running.values()))}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(sum(pod.waiting.values()))}",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {pod.kv_usage}",
        "# TYPE vllm:lora_requests_info gauge",
    ]
    for (waiting, running), stamp in pod.lora_info.items():
        info = (
            f'max_lora="{pod.config.max_loras}",waiting_lora_adapters="{waiting}",'
            f'running_lora_adapters="{running}"'
        )
        lines.append(f"vllm:lora_requests_info{{{info}}} {stamp}")
    return "\n".join(lines) + "\n"


def _add_lora_routes(app: FastAPI, pod: EmulatedPod) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load(request: Request) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        body = await read_json(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            return vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.")
        try:
            await pod.load(name, path)
        except AlreadyLoadedError:
            return vllm_error(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
            )
        except BadPathError:
            return vllm_error(404, f"Loading lora {name} failed: No adapter found for {path}")
        except RankTooLargeError as exc:
            limit = pod.config.max_lora_rank
            return vllm_error(500, f"LoRA rank {exc.rank} is greater than max_lora_rank {limit}.")
        except PodDownError:
            return vllm_error(503, f"pod {pod.config.name} restarted")
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        name = (await read_json(request)).get("lora_name")
        if not isinstance(name, str) or not name:
            return vllm_error(400, "'lora_name' needs to be provided to unload a LoRA adapter.")
        try:
            await pod.unload(name)
        except NotLoadedError:
            return vllm_error(404, f"The lora adapter '{name}' cannot be found.")
        except PodDownError:
            return vllm_error(500, f"Failed to remove lora adapter '{name}' from the engine.")
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def _add_serving_routes(app: FastAPI, pod: EmulatedPod) -> None:
    async def serve(request: Request, *, chat: bool) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        body = await read_json(request)
        model = body.get("model")
        base = pod.config.served_model_name
        if model is None:
            model = base
        if model != base and model not in pod.listed:
            return vllm_error(404, f"The model `{model}` does not exist.", param="model")
        try:
            return await complete(
                pod, adapter=None if model == base else model, model=model, body=body, chat=chat
            )
        except PodDownError:
            return vllm_error(503, f"pod {pod.config.name} restarted")

    add_serving_routes(
        app, pod, serve=serve, guard=_guard, metrics_text=_metrics_text, owned_by="vllm"
    )


def create_vllm_app(pod: EmulatedPod) -> FastAPI:
    app = FastAPI(title=f"emulated vLLM {pod.config.name}", docs_url=None, redoc_url=None)
    if pod.config.runtime_lora_updating:
        _add_lora_routes(app, pod)
    _add_serving_routes(app, pod)
    add_admin_routes(app, pod)
    return app
