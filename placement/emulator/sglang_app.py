"""An emulated SGLang pod: the routes and texts of POD-API.md's SGLang table.

LoRA failures are HTTP 400 ``{"success": false, "error_message": ...}``
(python/sglang/srt/entrypoints/http_server.py, ``load_lora_adapter``); the texts are
SGLang's (python/sglang/srt/lora/lora_manager.py, ``LoRAManager.validate_new_adapter``;
python/sglang/srt/lora/lora_registry.py, ``LoRARegistry.unregister``), except the
missing-path one, which is this emulator's own worded like them. With ``--dp-size`` above
1 the load and unload paths fail an assertion outside the handler's ``except
ValueError``: FastAPI's plain 500.

A request names its adapter as ``model: "<base>:<adapter>"`` (split at the first colon;
sgl-project/sglang#11570) or ``lora_path: "<adapter>"``; engines before that read only
``lora_path`` and run the base model for any other ``model``. An adapter the engine does
not serve is refused with 400 (streamed, before PR #21900: 200, an error event, then
``[DONE]``); the text is the tokenizer manager's ("Got LoRA adapter that has never been
loaded", since the soft cap of sgl-project/sglang#11526) or, before it, the registry's
("The following requested LoRA adapters are not loaded"). Since the soft cap an adapter
unloaded (over HTTP, or by the cap) is still served: the request loads it again, pinned
if it was (``PodResidency.unload``); before it, an unloaded name is refused. A dead pod
answers 503.

Where SGLang's versions differ the default engine model follows the newest source read
(sgl-project/sglang, 2026), ``EngineModel.SGLANG_HARD_CAP`` the engines before PR #11526:

- a stream refused before its first chunk: since PR #21900 (April 2026) the handlers
  pull the first chunk before they answer, so the refusal is the same 400 JSON as a
  whole request (python/sglang/srt/entrypoints/openai/serving_completions.py and
  serving_chat.py, ``_handle_streaming_request``); before, 200, one error event, then
  ``[DONE]``.
- the registry's names in its texts: since the soft cap the registry is an
  ``OrderedDict`` kept in LRU order (python/sglang/srt/lora/lora_registry.py,
  ``LoRARegistry.__init__``), so ``self._registry.keys()`` prints ``odict_keys([...])``;
  before, a plain dict's ``dict_keys([...])``. The tokenizer manager's
  ``lora_ref_cache`` is a plain dict on every version.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from placement.emulator.pod import EmulatedPod
from placement.emulator.refusals import (
    AlreadyLoadedError,
    BadPathError,
    EmulatorError,
    InjectedError,
    NotLoadedError,
    PinLimitError,
    PodDownError,
    PoolFullError,
    RankTooLargeError,
)
from placement.emulator.wire import (
    add_admin_routes,
    add_serving_routes,
    complete,
    error_stream,
    read_json,
)
from placement.residency import EngineModel


def _lora_answer(pod: EmulatedPod, *, ok: bool, message: str = "") -> JSONResponse:
    body = {
        "success": ok,
        "error_message": message,
        "loaded_adapters": {name: adapter.path for name, adapter in pod.listed.items()},
    }
    return JSONResponse(body, status_code=200 if ok else 400)


def _openai_error(status: int, message: str, kind: str = "NotFoundError") -> JSONResponse:
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return JSONResponse(body, status_code=status)


def _guard(pod: EmulatedPod, *, inject: bool = True) -> Response | None:
    try:
        pod.check(inject=inject)
    except PodDownError:
        return PlainTextResponse(f"pod {pod.config.name} is down", status_code=503)
    except InjectedError:
        return PlainTextResponse("Internal Server Error (injected)", status_code=500)
    return None


def _dp_assertion(pod: EmulatedPod) -> Response | None:
    """``assert dp_size == 1, "dp_size must be 1 for dynamic lora loading"`` escapes the
    handler, so FastAPI answers its own 500 (the text is only in the server's log)."""
    if pod.config.sglang_dp_size > 1:
        return PlainTextResponse("Internal Server Error", status_code=500)
    return None


def _load_refusal(pod: EmulatedPod, exc: EmulatorError, name: str, path: str) -> str:
    config = pod.config
    messages: dict[type[EmulatorError], str] = {
        AlreadyLoadedError: f"Failed to load LoRA adapter {name} because it is already loaded",
        BadPathError: f"Failed to load LoRA adapter {name}: no adapter found at {path}",
        PoolFullError: (
            f"Cannot load LoRA adapter {name} at path {path}. Maximum number of loaded "
            f"LoRA adapters is {config.max_cpu_loras}. Please unload some LoRA adapters "
            "before loading new ones."
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


def registry_keys(pod: EmulatedPod, names: Iterable[str]) -> str:
    """``LoRARegistry._registry.keys()`` as SGLang prints it: ``odict_keys`` since the
    soft cap made the registry an ``OrderedDict``, ``dict_keys`` before."""
    kind = "dict_keys" if pod.config.model is EngineModel.SGLANG_HARD_CAP else "odict_keys"
    return f"{kind}([{', '.join(repr(name) for name in names)}])"


def not_loaded_text(pod: EmulatedPod, adapter: str) -> str:
    """What the engine says of a request for an adapter it does not serve.

    Before PR #11526: python/sglang/srt/lora/lora_registry.py ``LoRARegistry.acquire``
    (``_lookup``). Since: python/sglang/srt/managers/tokenizer_manager.py
    ``TokenizerManager._resolve_lora_path``, for a name missing from ``lora_ref_cache``
    (a plain dict, hence ``dict_keys``)."""
    model = pod.residency
    if pod.config.model is EngineModel.SGLANG_HARD_CAP:
        return (
            f"The following requested LoRA adapters are not loaded: {adapter}\n"
            f"Loaded adapters: {registry_keys(pod, pod.listed)}."
        )
    known = ", ".join(repr(name) for name in [*model.listed, *model.parked])
    return (
        f"Got LoRA adapter that has never been loaded: {adapter}\n"
        f"All loaded adapters: dict_keys([{known}])."
    )


def _metrics_text(pod: EmulatedPod) -> str:
    labels = f'model_name="{pod.config.served_model_name}"'
    in_batch = sum(1 for name, count in pod.running.items() if count > 0 and name)
    gauges = {
        "sglang:num_running_reqs": sum(pod.running.values()),
        "sglang:num_queue_reqs": sum(pod.waiting.values()),
        "sglang:token_usage": pod.kv_usage,
        # Distinct adapters in the running batch, not adapters resident on the GPU.
        "sglang:lora_pool_slots_used": in_batch,
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
        if (refused := _dp_assertion(pod)) is not None:
            return refused
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
        if (refused := _dp_assertion(pod)) is not None:
            return refused
        name = str((await read_json(request)).get("lora_name", ""))
        try:
            await pod.unload(name)
        except NotLoadedError:
            # python/sglang/srt/lora/lora_registry.py ``LoRARegistry.unregister``
            loaded = registry_keys(pod, pod.residency.listed)
            message = f"LoRA with name {name} does not exist. Loaded LoRAs: {loaded}"
            return _lora_answer(pod, ok=False, message=message)
        except PodDownError:
            return PlainTextResponse(f"pod {pod.config.name} restarted", status_code=503)
        return _lora_answer(pod, ok=True)


def requested_adapter(pod: EmulatedPod, body: dict[str, Any]) -> str | None:
    """The adapter a request names, as this engine's version reads it (None: the base)."""
    lora_path = body.get("lora_path")
    explicit = lora_path if isinstance(lora_path, str) and lora_path else None
    model = body.get("model")
    if pod.config.sglang_model_naming and isinstance(model, str) and ":" in model:
        return model.partition(":")[2] or explicit
    return explicit


def _add_serving_routes(app: FastAPI, pod: EmulatedPod) -> None:
    async def serve(request: Request, *, chat: bool) -> Response:
        if (refused := _guard(pod)) is not None:
            return refused
        body = await read_json(request)
        model = str(body.get("model") or pod.config.served_model_name)
        adapter = requested_adapter(pod, body)
        try:
            if adapter is not None and not pod.residency.serves(adapter):
                raise NotLoadedError()
            return await complete(pod, adapter=adapter, model=model, body=body, chat=chat)
        except PinLimitError:  # a pinned adapter's reload after an unload, pins full since
            # python/sglang/srt/managers/tokenizer_manager.py ``_resolve_lora_path``
            name = adapter or ""
            load_refusal = _load_refusal(pod, PinLimitError(), name, "")
            message = f"Failed to implicitly load LoRA adapter {name}: {load_refusal}"
            return _openai_error(400, message, kind="BadRequestError")
        except NotLoadedError:
            message = not_loaded_text(pod, adapter or "")
            # Since PR #21900 a stream is refused before its 200 (module docstring).
            if body.get("stream") and pod.config.model is EngineModel.SGLANG_HARD_CAP:
                return error_stream(
                    {
                        "object": "error",
                        "message": message,
                        "type": "BadRequestError",
                        "param": None,
                        "code": 400,
                    }
                )
            return _openai_error(400, message, kind="BadRequestError")
        except PodDownError:
            return PlainTextResponse(f"pod {pod.config.name} restarted", status_code=503)

    metrics = _metrics_text if pod.config.sglang_metrics else None
    add_serving_routes(app, pod, serve=serve, guard=_guard, metrics_text=metrics, owned_by="sglang")


def create_sglang_app(pod: EmulatedPod) -> FastAPI:
    app = FastAPI(title=f"emulated SGLang {pod.config.name}", docs_url=None, redoc_url=None)
    _add_lora_routes(app, pod)
    _add_serving_routes(app, pod)
    add_admin_routes(app, pod)
    return app
