"""An emulated vLLM pod: the routes, status codes and texts of POD-API.md's vLLM table.

Error bodies are ``{"error": {"message", "type", "param", "code"}}``, or the flat
``{"message", "type", "param", "code"}`` of older vLLM (``vllm_flat_errors``). Without
runtime LoRA updating the two POST routes are simply not mounted, so FastAPI answers its
own 404 ``{"detail":"Not Found"}`` as vLLM does. A dead pod answers 503.

Load failures (vllm/entrypoints/openai/models/serving.py,
``OpenAIServingModels.load_lora_adapter``): the engine's error text, 404 when it says
"No adapter found", 400 otherwise. The engine wraps the worker's error as a failed
utility call, so the text starts with ``Call to add_lora method failed:``
(vllm-project/vllm#30690 shows it).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from placement.emulator.config import PodConfig
from placement.emulator.pod import EmulatedPod
from placement.emulator.refusals import (
    AlreadyLoadedError,
    BadPathError,
    EmulatorError,
    InjectedError,
    NotLoadedError,
    PodDownError,
    RankTooLargeError,
)
from placement.emulator.wire import add_admin_routes, add_serving_routes, complete, read_json

_KINDS = {400: "InvalidUserInput", 404: "NotFoundError", 500: "InternalServerError"}

#: How the API server words an engine-side failure of ``add_lora``.
ADD_LORA_FAILED = "Call to add_lora method failed: "


def vllm_error(
    status: int,
    message: str,
    param: str | None = None,
    *,
    kind: str | None = None,
    flat: bool = False,
) -> JSONResponse:
    kind = kind or _KINDS.get(status, "ServiceUnavailableError")
    error = {"message": message, "type": kind, "param": param, "code": status}
    return JSONResponse(error if flat else {"error": error}, status_code=status)


def _error(config: PodConfig, status: int, message: str, **kwargs: str | None) -> JSONResponse:
    return vllm_error(status, message, flat=config.vllm_flat_errors, **kwargs)


def _guard(pod: EmulatedPod, *, inject: bool = True) -> Response | None:
    try:
        pod.check(inject=inject)
    except PodDownError:
        return _error(pod.config, 503, f"pod {pod.config.name} is down")
    except InjectedError:
        return _error(pod.config, 500, "injected failure")
    return None


def _metrics_text(pod: EmulatedPod) -> str:
    labels = f'engine="0",model_name="{pod.config.served_model_name}"'
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(sum(pod.running.values()))}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(sum(pod.waiting.values()))}",
        f"# TYPE {pod.config.kv_metric} gauge",
        f"{pod.config.kv_metric}{{{labels}}} {pod.kv_usage}",
        "# TYPE vllm:lora_requests_info gauge",
    ]
    for (waiting, running), stamp in pod.lora_info.items():
        info = (
            f'max_lora="{pod.config.max_loras}",waiting_lora_adapters="{waiting}",'
            f'running_lora_adapters="{running}"'
        )
        lines.append(f"vllm:lora_requests_info{{{info}}} {stamp}")
    return "\n".join(lines) + "\n"


def _load_refusal(pod: EmulatedPod, exc: Exception, name: str, path: str) -> Response:
    config = pod.config
    if isinstance(exc, AlreadyLoadedError):
        return _error(
            config,
            400,
            f"The lora adapter '{name}' has already been loaded. If you want to load the "
            "adapter in place, set 'load_inplace' to True.",
        )
    if isinstance(exc, BadPathError):
        message = f"{ADD_LORA_FAILED}Loading lora {name} failed: No adapter found for {path}"
        return _error(config, 404, message, kind="NotFoundError")
    if isinstance(exc, RankTooLargeError):
        message = (
            f"{ADD_LORA_FAILED}LoRA rank {exc.rank} is greater than max_lora_rank "
            f"{config.max_lora_rank}."
        )
        return _error(config, 400, message, kind="BadRequestError")
    return _error(config, 503, f"pod {config.name} restarted")


def _add_lora_routes(app: FastAPI, pod: EmulatedPod) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load(request: Request) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        body = await read_json(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            return _error(pod.config, 400, "Both 'lora_name' and 'lora_path' must be provided.")
        try:
            await pod.load(name, path, inplace=body.get("load_inplace") is True)
        except EmulatorError as exc:
            return _load_refusal(pod, exc, name, path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        name = (await read_json(request)).get("lora_name")
        if not isinstance(name, str) or not name:
            message = "'lora_name' needs to be provided to unload a LoRA adapter."
            return _error(pod.config, 400, message)
        try:
            await pod.unload(name)
        except NotLoadedError:
            return _error(pod.config, 404, f"The lora adapter '{name}' cannot be found.")
        except PodDownError:
            return _error(pod.config, 503, f"pod {pod.config.name} restarted")
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
        missing = _error(pod.config, 404, f"The model `{model}` does not exist.", param="model")
        if model != base and model not in pod.residency.listed:
            return missing
        try:
            return await complete(
                pod, adapter=None if model == base else model, model=model, body=body, chat=chat
            )
        except NotLoadedError:  # unloaded between the check above and the engine's
            return missing
        except PodDownError:
            return _error(pod.config, 503, f"pod {pod.config.name} restarted")

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
