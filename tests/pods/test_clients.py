"""Engine clients at the wire: every answer of a pod maps onto the exception tree."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import httpx
import pytest

from placement.adapters.engines import engine_client
from placement.adapters.http_engine import engine_http_client
from placement.adapters.metrics_text import parse_sglang_metrics, parse_vllm_metrics
from placement.domain import AdapterId, Engine, Pod
from placement.errors import PermanentEngineError, RetryableEngineError
from placement.ports import EngineClient
from placement.settings import ENGINE_KEEPALIVE_S
from tests.factories import pod

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]


def _pod(engine: Engine) -> Pod:
    return pod(
        "pod-3",
        url="http://127.0.0.1:18003",
        engine=engine,
        max_loras=2,
        max_cpu_loras=4,
        max_lora_rank=16,
    )


def _client(engine: Engine, handler: Handler) -> EngineClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return engine_client(_pod(engine), http=http, served_model_name="base")


def _answer(status: int, body: object) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    return handler


def _vllm_error(status: int, message: str, kind: str = "InvalidUserInput") -> Handler:
    return _answer(
        status, {"error": {"message": message, "type": kind, "param": None, "code": status}}
    )


def _vllm_flat_error(status: int, message: str, kind: str = "BadRequestError") -> Handler:
    """The body of vLLM before the nested ``{"error": {...}}``."""
    return _answer(
        status,
        {"object": "error", "message": message, "type": kind, "param": None, "code": status},
    )


def _sglang_error(message: str) -> Handler:
    return _answer(400, {"success": False, "error_message": message})


LOAD_SUCCESS = [
    pytest.param(
        Engine.VLLM,
        _answer(200, "Success: LoRA adapter 'a' added successfully."),
        True,
        id="vllm-loaded",
    ),
    pytest.param(
        Engine.VLLM,
        _vllm_error(
            400,
            "The lora adapter 'a' has already been loaded. If you want to load the adapter"
            " in place, set 'load_inplace' to True.",
        ),
        False,
        id="vllm-already",
    ),
    pytest.param(
        Engine.SGLANG,
        _answer(200, {"success": True, "error_message": "", "loaded_adapters": {"a": "/p"}}),
        True,
        id="sglang-loaded",
    ),
    pytest.param(
        Engine.SGLANG,
        _sglang_error("Failed to load LoRA adapter a because it is already loaded"),
        False,
        id="sglang-already",
    ),
]


@pytest.mark.parametrize(("engine", "handler", "changed"), LOAD_SUCCESS)
async def test_load_success_and_already_loaded(
    engine: Engine, handler: Handler, changed: bool
) -> None:
    client = _client(engine, handler)
    assert await client.load(AdapterId("a"), lora_path="/p") is changed


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def _time_out(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("slow", request=request)


LOAD_FAILURES = [
    pytest.param(
        Engine.VLLM,
        _answer(404, {"detail": "Not Found"}),
        PermanentEngineError,
        "set VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 on pod-3",
        id="vllm-runtime-off",
    ),
    pytest.param(
        Engine.VLLM,
        _vllm_error(404, "Loading lora a failed: No adapter found for /p", "NotFoundError"),
        PermanentEngineError,
        "'/p'",
        id="vllm-bad-path",
    ),
    pytest.param(
        Engine.VLLM,
        _vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided."),
        PermanentEngineError,
        "must be provided",
        id="vllm-400",
    ),
    pytest.param(
        Engine.VLLM,
        _vllm_error(400, "LoRA rank 64 is greater than max_lora_rank 16.", "BadRequestError"),
        PermanentEngineError,
        "400 LoRA rank 64 is greater than max_lora_rank 16.",
        id="vllm-rank-400-nested",
    ),
    pytest.param(
        Engine.VLLM,
        _vllm_flat_error(400, "LoRA rank 64 is greater than max_lora_rank 16.", "BadRequestError"),
        PermanentEngineError,
        "400 LoRA rank 64 is greater than max_lora_rank 16.",
        id="vllm-rank-400-flat",
    ),
    pytest.param(
        Engine.VLLM,
        _vllm_flat_error(404, "Loading lora a failed: No adapter found for /p", "NotFoundError"),
        PermanentEngineError,
        "404 Loading lora a failed: No adapter found for /p",
        id="vllm-bad-path-flat",
    ),
    pytest.param(
        Engine.VLLM,
        _vllm_error(500, "boom", "InternalServerError"),
        RetryableEngineError,
        "500",
        id="vllm-500",
    ),
    pytest.param(
        Engine.VLLM, _answer(503, "unavailable"), RetryableEngineError, "503", id="vllm-503-text"
    ),
    pytest.param(Engine.VLLM, _refuse, RetryableEngineError, "ConnectError", id="vllm-refused"),
    pytest.param(Engine.VLLM, _time_out, RetryableEngineError, "timed out", id="vllm-timeout"),
    pytest.param(
        Engine.SGLANG,
        _sglang_error(
            "LoRA adapter a with rank 64 is incompatible with the current LoRA memory pool"
            " configuration."
        ),
        PermanentEngineError,
        "incompatible",
        id="sglang-rank",
    ),
    pytest.param(
        Engine.SGLANG,
        _sglang_error("LoRA is not enabled. Please set `--enable-lora` to enable LoRA."),
        PermanentEngineError,
        "not enabled",
        id="sglang-lora-off",
    ),
    pytest.param(
        Engine.SGLANG,
        _answer(500, "Internal Server Error"),
        PermanentEngineError,
        "restart the pod with --dp-size 1",
        id="sglang-dp-size-assertion",
    ),
    pytest.param(
        Engine.SGLANG, _answer(502, "bad gateway"), RetryableEngineError, "502", id="sglang-502"
    ),
    pytest.param(
        Engine.SGLANG,
        _answer(500, "Internal Server Error (injected)"),
        RetryableEngineError,
        "500",
        id="sglang-other-500",
    ),
    pytest.param(Engine.SGLANG, _refuse, RetryableEngineError, "ConnectError", id="sglang-refused"),
]


@pytest.mark.parametrize(("engine", "handler", "kind", "text"), LOAD_FAILURES)
async def test_load_failures_map_onto_the_tree(
    engine: Engine, handler: Handler, kind: type[Exception], text: str
) -> None:
    client = _client(engine, handler)
    with pytest.raises(kind) as caught:
        await client.load(AdapterId("a"), lora_path="/p")
    assert text in str(caught.value)
    assert "pod-3" in str(caught.value)


UNLOADS = [
    pytest.param(
        Engine.VLLM,
        _answer(200, "Success: LoRA adapter 'a' removed successfully."),
        True,
        id="vllm-removed",
    ),
    pytest.param(
        Engine.VLLM,
        _vllm_error(404, "The lora adapter 'a' cannot be found.", "NotFoundError"),
        False,
        id="vllm-absent",
    ),
    pytest.param(
        Engine.SGLANG,
        _answer(200, {"success": True, "error_message": "", "loaded_adapters": {}}),
        True,
        id="sglang-removed",
    ),
    pytest.param(
        Engine.SGLANG,
        _sglang_error("LoRA with name a does not exist. Loaded LoRAs: dict_keys([])"),
        False,
        id="sglang-absent",
    ),
]


@pytest.mark.parametrize(("engine", "handler", "changed"), UNLOADS)
async def test_unload_is_idempotent(engine: Engine, handler: Handler, changed: bool) -> None:
    assert await _client(engine, handler).unload(AdapterId("a")) is changed


async def test_unload_failure_is_retryable() -> None:
    handler = _vllm_error(
        500, "Failed to remove lora adapter 'a' from the engine.", "InternalServerError"
    )
    with pytest.raises(RetryableEngineError):
        await _client(Engine.VLLM, handler).unload(AdapterId("a"))


async def test_unload_with_runtime_updating_off_says_so() -> None:
    with pytest.raises(PermanentEngineError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        await _client(Engine.VLLM, _answer(404, {"detail": "Not Found"})).unload(AdapterId("a"))


async def test_registered_lists_adapter_cards_with_paths() -> None:
    body = {
        "object": "list",
        "data": [
            {"id": "base", "object": "model", "root": "/models/base", "parent": None},
            {"id": "a", "object": "model", "root": "s3://x/a", "parent": "base"},
        ],
    }
    listed = await _client(Engine.VLLM, _answer(200, body)).registered()
    assert dict(listed.adapters) == {"a": "s3://x/a"}
    assert listed.base_model == "base"


@pytest.mark.parametrize("body", [b"\xff\xfe not UTF-8", b"{}", b"[1, 2]", b"not json"])
async def test_a_listing_that_is_not_a_model_list_is_permanent(body: bytes) -> None:
    client = _client(Engine.VLLM, lambda request: httpx.Response(200, content=body))
    with pytest.raises(PermanentEngineError, match="not a model list"):
        await client.registered()


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
async def test_warmup_sends_one_token_request_naming_the_adapter(engine: Engine) -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, **json.loads(request.content)})
        return httpx.Response(200, json={"choices": []})

    await _client(engine, handler).warmup(AdapterId("a"))
    expected = (
        ("/v1/completions", "a") if engine is Engine.VLLM else ("/v1/chat/completions", "base:a")
    )
    assert (seen[0]["path"], seen[0]["model"]) == expected
    assert seen[0]["max_tokens"] == 1
    # Older SGLang ignores ``model`` and would run the base model: it reads lora_path.
    assert seen[0].get("lora_path") == (None if engine is Engine.VLLM else "a")


async def test_health_is_false_when_the_pod_is_gone() -> None:
    assert await _client(Engine.VLLM, _refuse).health() is False
    assert await _client(Engine.VLLM, _answer(200, "")).health() is True


VLLM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="base"} 3.0
vllm:num_requests_running{engine="1",model_name="base"} 2.0
vllm:num_requests_waiting{engine="0",model_name="base"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="base"} 0.42
"""
INFO = (
    'vllm:lora_requests_info{{max_lora="4",'
    'waiting_lora_adapters="{}",running_lora_adapters="{}"}} {}'
)
VLLM_METRICS += (
    "\n".join(
        INFO.format(waiting, running, value)
        for waiting, running, value in [
            ("", "old", "1.7563e+09"),
            ("b", "a,b", "1.7564e+09"),
            ("x", "y", "1.7562e+09"),
        ]
    )
    + "\n"
)


def test_vllm_metrics_take_the_latest_lora_series() -> None:
    metrics = parse_vllm_metrics(VLLM_METRICS)
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (5, 1, 0.42)
    assert metrics.running_adapters == {"a", "b"}
    assert metrics.waiting_adapters == {"b"}
    assert metrics.max_loras == 4


def test_sglang_metrics_read_the_pool_gauges() -> None:
    text = (
        'sglang:num_running_reqs{model_name="base"} 2\n'
        'sglang:num_queue_reqs{model_name="base"} 7\n'
        'sglang:token_usage{model_name="base"} 0.25\n'
        'sglang:lora_pool_slots_used{model_name="base"} 3\n'
        'sglang:lora_pool_slots_total{model_name="base"} 4\n'
    )
    metrics = parse_sglang_metrics(text)
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (2, 7, 0.25)
    assert (metrics.lora_slots_used, metrics.lora_slots_total) == (3, 4)
    assert metrics.running_adapters == frozenset()


def test_unreadable_metrics_are_a_permanent_error() -> None:
    with pytest.raises(PermanentEngineError, match="unreadable"):
        parse_vllm_metrics('vllm:num_requests_running{engine="0" 3\n')


async def test_a_bad_pod_url_is_permanent() -> None:
    bad = replace(_pod(Engine.VLLM), url="ftp://127.0.0.1:1")
    client = engine_client(bad, http=httpx.AsyncClient())
    with pytest.raises(PermanentEngineError, match="bad pod url"):
        await client.load(AdapterId("a"), lora_path="/p")
    await client.aclose()


class _Recorder:
    """A pod at the wire that answers each path as told and keeps what it was sent."""

    def __init__(self, answers: dict[str, Handler]) -> None:
        self.answers = answers
        self.seen: list[tuple[str, dict[str, object]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.seen.append((request.url.path, body))
        return self.answers[request.url.path](request)


async def test_a_changed_source_is_loaded_in_place_on_vllm() -> None:
    pod = _Recorder(
        {"/v1/load_lora_adapter": _answer(200, "Success: LoRA adapter 'a' added successfully.")}
    )
    assert await _client(Engine.VLLM, pod).load(AdapterId("a"), lora_path="/v2", inplace=True)
    assert pod.seen == [
        ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/v2", "load_inplace": True})
    ]


async def test_an_in_place_load_on_sglang_unloads_then_loads() -> None:
    # SGLang has no load_inplace: the name goes, then comes back with the new weights.
    done = {"success": True, "error_message": "", "loaded_adapters": {"a": "/v2"}}
    pod = _Recorder(
        {"/unload_lora_adapter": _answer(200, done), "/load_lora_adapter": _answer(200, done)}
    )
    assert await _client(Engine.SGLANG, pod).load(AdapterId("a"), lora_path="/v2", inplace=True)
    assert [path for path, _ in pod.seen] == ["/unload_lora_adapter", "/load_lora_adapter"]


KV_NAMES = [
    pytest.param('vllm:kv_cache_usage_perc{engine="0",model_name="base"} 0.42\n', id="current"),
    pytest.param('vllm:gpu_cache_usage_perc{engine="0",model_name="base"} 0.42\n', id="older"),
    pytest.param(
        'vllm:kv_cache_usage_perc{engine="0",model_name="base"} 0.42\n'
        'vllm:gpu_cache_usage_perc{engine="0",model_name="base"} 0.9\n',
        id="both-current-wins",
    ),
]


@pytest.mark.parametrize("text", KV_NAMES)
def test_vllm_kv_use_is_read_under_either_name(text: str) -> None:
    # Before vllm-project/vllm#18354 the gauge was gpu_cache_usage_perc: read as 0.0, the
    # router's pressure rules would never fire on those pods.
    assert parse_vllm_metrics(text).kv_usage == 0.42


@pytest.mark.parametrize("healthy", [True, False], ids=["health-200", "health-503"])
async def test_sglang_without_enable_metrics_is_judged_by_health(
    healthy: bool, caplog: pytest.LogCaptureFixture
) -> None:
    pod = _Recorder(
        {
            "/metrics": _answer(404, {"detail": "Not Found"}),
            "/health": _answer(200 if healthy else 503, ""),
        }
    )
    client = _client(Engine.SGLANG, pod)
    first = await client.metrics()
    second = await client.metrics()
    assert first.healthy is second.healthy is healthy
    assert (first.running, first.waiting, first.kv_usage) == (0, 0, 0.0)
    warnings = [r.getMessage() for r in caplog.records if "--enable-metrics" in r.getMessage()]
    assert len(warnings) == 1 and "pod-3" in warnings[0]  # once, naming the pod and the flag


def test_sglang_pool_slots_in_use_are_batch_activity_not_residency() -> None:
    # lora_pool_slots_used counts adapters in the running batch: an idle pod reads 0 with
    # adapters resident. It lands in lora_slots_used only, never in the adapter sets.
    metrics = parse_sglang_metrics(
        'sglang:lora_pool_slots_used{model_name="base"} 0\n'
        'sglang:lora_pool_slots_total{model_name="base"} 4\n'
    )
    assert (metrics.lora_slots_used, metrics.lora_slots_total) == (0, 4)
    assert metrics.running_adapters == metrics.waiting_adapters == frozenset()


async def test_an_sglang_unload_with_dp_size_above_one_is_permanent() -> None:
    handler = _answer(500, "Internal Server Error")
    with pytest.raises(PermanentEngineError, match="--dp-size 1"):
        await _client(Engine.SGLANG, handler).unload(AdapterId("a"))


#: What vLLM's and SGLang's API servers keep an idle connection: uvicorn's
#: ``timeout_keep_alive`` (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s by default).
ENGINES_KEEP_ALIVE_S = 5.0


def _keepalive_expiry(http: httpx.AsyncClient) -> float | None:
    pool = http._transport._pool  # type: ignore[attr-defined]  # httpcore's pool
    expiry: float | None = pool._keepalive_expiry
    return expiry


@pytest.mark.anyio
async def test_engine_calls_drop_an_idle_connection_before_the_pod_does() -> None:
    """httpx keeps an idle connection 5 s, as long as the engines do: a call could be
    written on a connection the pod was closing. Every engine client lorafleet builds
    (the controller's, apply's, one an engine client makes for itself) drops it first."""
    assert ENGINE_KEEPALIVE_S < ENGINES_KEEP_ALIVE_S
    async with engine_http_client(max_connections=8) as http:
        assert _keepalive_expiry(http) == ENGINE_KEEPALIVE_S
    own = engine_client(pod("pod-0", engine=Engine.VLLM))
    try:
        assert _keepalive_expiry(own._http) == ENGINE_KEEPALIVE_S  # type: ignore[attr-defined]
    finally:
        await own.aclose()
