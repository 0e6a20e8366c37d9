"""The engine clients against odd and malformed pod answers, over a real socket.

Each answer is raw HTTP from ``tests.pods.wire_server`` (a body cut short, a reset
mid-body, a gzip header over plain bytes, a proxy's HTML page, an answer trickled past
the timeout): whatever a pod (or a proxy in front of it) sends, a client call ends in
an ``EngineError`` that names the pod and what was wrong, retryable or permanent as
POD-API.md's tables say, and never in a raw httpx, JSON or recursion error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from placement.actuation.apply import make_clients, observe
from placement.actuation.executor import Ledger
from placement.adapters.engines import engine_client
from placement.adapters.http_engine import MAX_BODY_BYTES
from placement.domain import AdapterId, Engine, Load, PodId
from placement.errors import (
    EngineError,
    EngineTimeoutError,
    PermanentEngineError,
    RetryableEngineError,
)
from placement.ports import EngineClient
from tests.factories import fleet, pod, pool
from tests.pods.wire_server import Answer, WireServer, text

pytestmark = pytest.mark.anyio

TIMEOUT_S = 0.5
MODELS = "GET /v1/models"
VLLM_LOAD = "POST /v1/load_lora_adapter"
VLLM_UNLOAD = "POST /v1/unload_lora_adapter"
SGLANG_LOAD = "POST /load_lora_adapter"
SGLANG_UNLOAD = "POST /unload_lora_adapter"
METRICS = "GET /metrics"
NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    "</body>\r\n</html>\r\n" + "<!-- padding -->\r\n" * 6
)
LISTING = {
    "object": "list",
    "data": [
        {"id": "base", "object": "model", "root": "/models/base", "parent": None},
        {"id": "a", "object": "model", "root": "s3://x/a", "parent": "base"},
    ],
}


def answer_json(status: int, body: object, **kw: object) -> Answer:
    return Answer(status=status, body=json.dumps(body).encode(), **kw)  # type: ignore[arg-type]


def vllm_error(status: int, message: str, *, flat: bool = False) -> Answer:
    error = {"message": message, "type": "BadRequestError", "param": None, "code": status}
    return answer_json(status, {"object": "error", **error} if flat else {"error": error})


def sglang_error(message: str) -> Answer:
    return answer_json(400, {"success": False, "error_message": message})


@pytest.fixture
def server() -> Iterator[WireServer]:
    wire = WireServer().start()
    yield wire
    wire.stop()


def client_for(server: WireServer, engine: Engine = Engine.VLLM) -> EngineClient:
    target = pod("pod-7", url=server.url, engine=engine)
    return engine_client(target, served_model_name="base", timeout_s=TIMEOUT_S)


async def outcome(client: EngineClient, key: str) -> object:
    """What one call ends in: its value, or ``(error type, message)``."""
    call = {
        MODELS: client.registered,
        VLLM_LOAD: lambda: client.load(AdapterId("a"), lora_path="/p"),
        SGLANG_LOAD: lambda: client.load(AdapterId("a"), lora_path="/p"),
        VLLM_UNLOAD: lambda: client.unload(AdapterId("a")),
        SGLANG_UNLOAD: lambda: client.unload(AdapterId("a")),
        METRICS: client.metrics,
    }[key]
    try:
        return await call()
    except EngineError as exc:
        return (type(exc), str(exc))
    finally:
        await client.aclose()


# --- /v1/models: what is not a listing is a named error, never an empty one ------------

LISTINGS = [
    pytest.param(
        text(200, "hello"),
        PermanentEngineError,
        "/v1/models answered a body that is not a model list: not JSON: 'hello'",
        id="200-not-json",
    ),
    pytest.param(text(200, ""), PermanentEngineError, "not a model list", id="200-empty"),
    pytest.param(
        text(200, NGINX_502, content_type="text/html"),
        PermanentEngineError,
        "not JSON: '502 Bad Gateway (an HTML page: a proxy in front of the pod?)'",
        id="200-html-page",
    ),
    pytest.param(
        answer_json(200, {"object": "list", "data": {"a": {"id": "a"}}}),
        PermanentEngineError,
        'not a model list: "data" is a JSON object, not an array',
        id="data-an-object",
    ),
    pytest.param(
        answer_json(200, {"object": "list", "data": None}),
        PermanentEngineError,
        'not a model list: "data" is a JSON null, not an array',
        id="data-null",
    ),
    pytest.param(
        answer_json(200, {"data": [{"id": "base"}, {"root": "/a", "parent": "base"}]}),
        PermanentEngineError,
        "/v1/models answered a model list whose card 1 has no string \"id\": {'root': '/a'",
        id="card-without-id",
    ),
    pytest.param(
        answer_json(200, {"data": ["a"]}),
        PermanentEngineError,
        "whose card 0 has no string \"id\": 'a'",
        id="card-not-an-object",
    ),
    pytest.param(
        Answer(body=b"[" * 100_000 + b"]" * 100_000),
        PermanentEngineError,
        "not a model list: JSON nested too deep",
        id="200-nested-too-deep",
    ),
    pytest.param(
        text(502, NGINX_502, content_type="text/html"),
        RetryableEngineError,
        "GET /v1/models answered 502: 502 Bad Gateway (an HTML page",
        id="502-html-page",
    ),
    pytest.param(
        text(500, "Internal Server Error"),
        RetryableEngineError,
        "GET /v1/models answered 500: Internal Server Error",
        id="500-plain-text",
    ),
    pytest.param(
        Answer(status=503, body=b"busy", headers=(("Retry-After", "7"),)),
        RetryableEngineError,
        "answered 503: busy (Retry-After: 7)",
        id="503-retry-after",
    ),
    pytest.param(
        Answer(body=json.dumps(LISTING).encode(), cut_after=20),
        RetryableEngineError,
        "GET /v1/models failed: ReadError: the connection broke",
        id="reset-mid-body",
    ),
    pytest.param(
        Answer(body=b'{"data": []}', content_length=100),
        RetryableEngineError,
        "GET /v1/models failed: RemoteProtocolError",
        id="body-shorter-than-content-length",
    ),
    pytest.param(
        Answer(body=json.dumps(LISTING).encode(), headers=(("Content-Encoding", "gzip"),)),
        RetryableEngineError,
        "a body that cannot be decoded (Content-Encoding 'gzip')",
        id="gzip-header-plain-body",
    ),
    pytest.param(
        Answer(body=json.dumps(LISTING).encode(), delay_s=2 * TIMEOUT_S),
        EngineTimeoutError,
        f"GET /v1/models timed out after {TIMEOUT_S:g} s",
        id="slow-head",
    ),
    pytest.param(
        # Each byte comes well within the timeout; the whole answer does not.
        Answer(body=json.dumps(LISTING).encode(), trickle_s=TIMEOUT_S / 5),
        EngineTimeoutError,
        f"GET /v1/models timed out after {TIMEOUT_S:g} s",
        id="trickled-body",
    ),
    pytest.param(
        Answer(body=b'{"data": [' + b" " * MAX_BODY_BYTES + b"]}"),
        PermanentEngineError,
        f"GET /v1/models answered 200 with a body over {MAX_BODY_BYTES} bytes: not read",
        id="body-over-the-cap",
    ),
]


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
@pytest.mark.parametrize(("answer", "kind", "said"), LISTINGS)
async def test_a_listing_that_cannot_be_read_is_a_named_engine_error(
    server: WireServer, engine: Engine, answer: Answer, kind: type[EngineError], said: str
) -> None:
    server.answers[MODELS] = answer
    got = await outcome(client_for(server, engine), MODELS)
    assert isinstance(got, tuple), got
    assert got[0] is kind
    assert got[1].startswith("pod-7: ") and said in got[1]


async def test_a_large_listing_under_the_cap_is_read_whole(server: WireServer) -> None:
    cards = [{"id": "base", "root": "/models/base", "parent": None}]
    cards += [{"id": f"a{i}", "root": f"s3://x/a{i}", "parent": "base"} for i in range(20_000)]
    server.answers[MODELS] = answer_json(200, {"object": "list", "data": cards})
    listed = await outcome(client_for(server), MODELS)
    assert len(getattr(listed, "adapters", {})) == 20_000


async def _no_wait(_delay_s: float) -> None:
    return None


async def test_a_bad_listing_leaves_that_pod_unreachable_and_the_others_observed() -> None:
    # httpx's DecodingError used to leave the client raw and fail the whole observe.
    bad, good = WireServer().start(), WireServer().start()
    bad.answers[MODELS] = Answer(body=b"{}", headers=(("Content-Encoding", "gzip"),))
    good.answers[MODELS] = answer_json(200, LISTING)
    try:
        two = fleet(pool("p", 2, urls=[bad.url, good.url]))
        async with httpx.AsyncClient() as http:
            clients = make_clients(two, http=http, timeout_s=TIMEOUT_S)
            seen = await observe(two, clients, sleep=_no_wait)  # retried: no real wait
    finally:
        bad.stop()
        good.stop()
    assert "cannot be decoded" in seen.unreachable[PodId("p-0")]
    assert seen.states[PodId("p-1")].registered == {"a"}


async def test_a_listing_of_the_wrong_shape_keeps_the_pods_ledger(server: WireServer) -> None:
    # Read as "no adapters", it made Ledger.observe take the pod for restarted.
    one = fleet(pool("p", 1, urls=[server.url]))
    ledger = Ledger()
    ledger.track_pods(one.pods)
    load = Load(pod=PodId("p-0"), adapter=AdapterId("a"), reason="planned")
    ledger.record(load, lora_path="s3://x/a")
    server.answers[MODELS] = answer_json(200, {"object": "list", "data": None})
    async with httpx.AsyncClient() as http:
        seen = await observe(one, make_clients(one, http=http, timeout_s=TIMEOUT_S), ledger=ledger)
    assert '"data" is a JSON null' in seen.unreachable[PodId("p-0")]
    assert AdapterId("a") in ledger.pods[PodId("p-0")].listed


# --- loads and unloads: POD-API.md's answers, at the wire --------------------------------

CHANGES = [
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        text(200, "Success: LoRA adapter 'a' added successfully."),
        True,
        id="vllm-load-200",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        vllm_error(
            400,
            "The lora adapter 'a' has already been loaded. If you want to load the adapter "
            "in place, set 'load_inplace' to True.",
        ),
        False,
        id="vllm-already-loaded-nested",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        vllm_error(400, "The lora adapter 'a' has already been loaded.", flat=True),
        False,
        id="vllm-already-loaded-flat",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_UNLOAD,
        vllm_error(404, "The lora adapter 'a' cannot be found."),
        False,
        id="vllm-unload-not-found",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_UNLOAD,
        vllm_error(400, "The lora adapter 'a' cannot be found.", flat=True),
        False,
        id="vllm-unload-not-found-older-400",
    ),
    pytest.param(
        Engine.SGLANG,
        SGLANG_LOAD,
        sglang_error("Failed to load LoRA adapter a because it is already loaded"),
        False,
        id="sglang-already-loaded",
    ),
    pytest.param(
        Engine.SGLANG,
        SGLANG_UNLOAD,
        sglang_error("LoRA with name a does not exist. Loaded LoRAs: dict_keys([])"),
        False,
        id="sglang-unload-not-found",
    ),
]


@pytest.mark.parametrize(("engine", "key", "answer", "changed"), CHANGES)
async def test_idempotent_answers_are_success(
    server: WireServer, engine: Engine, key: str, answer: Answer, changed: bool
) -> None:
    server.answers[key] = answer
    assert await outcome(client_for(server, engine), key) is changed


REFUSALS = [
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        vllm_error(404, "Loading lora a failed: No adapter found for /p"),
        PermanentEngineError,
        "cannot load a from lora_path '/p': 404 Loading lora a failed: No adapter found",
        id="vllm-no-adapter-found",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        vllm_error(400, "LoRA rank 64 is greater than max_lora_rank 16.", flat=True),
        PermanentEngineError,
        "400 LoRA rank 64 is greater than max_lora_rank 16.",
        id="vllm-rank-too-big-flat",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        answer_json(404, {"detail": "Not Found"}),
        PermanentEngineError,
        "set VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 on pod-7",
        id="vllm-runtime-updating-off",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        text(400, NGINX_502, content_type="text/html"),
        PermanentEngineError,
        "400 502 Bad Gateway (an HTML page: a proxy in front of the pod?)",
        id="vllm-400-html-page",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        text(500, "Traceback (most recent call last):\n" + "  frame\n" * 2000),
        RetryableEngineError,
        "characters in all)",  # a whole traceback is cut, not carried in the message
        id="vllm-500-long-traceback",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        Answer(body=b"Success: LoRA adapter", headers=(("Content-Encoding", "gzip"),)),
        RetryableEngineError,
        "POST /v1/load_lora_adapter answered a body that cannot be decoded",
        id="vllm-200-gzip-header-plain-body",
    ),
    pytest.param(
        Engine.VLLM,
        VLLM_LOAD,
        Answer(body=b"Success: LoRA adapter 'a' added successfully.", cut_after=4),
        RetryableEngineError,
        "POST /v1/load_lora_adapter failed: ReadError",
        id="vllm-reset-mid-body",
    ),
    pytest.param(
        Engine.SGLANG,
        SGLANG_LOAD,
        sglang_error(
            "LoRA adapter a with rank 64 is incompatible with the current LoRA memory pool "
            "configuration."
        ),
        PermanentEngineError,
        "cannot load a from lora_path '/p': LoRA adapter a with rank 64 is incompatible",
        id="sglang-rank-too-big",
    ),
    pytest.param(
        Engine.SGLANG,
        SGLANG_LOAD,
        sglang_error("LoRA is not enabled. Please set `--enable-lora` to enable LoRA."),
        PermanentEngineError,
        "LoRA is not enabled",
        id="sglang-lora-off",
    ),
    pytest.param(
        Engine.SGLANG,
        SGLANG_LOAD,
        text(500, "Internal Server Error"),
        PermanentEngineError,
        "restart the pod with --dp-size 1",
        id="sglang-dp-size-500",
    ),
    pytest.param(
        Engine.SGLANG,
        SGLANG_UNLOAD,
        Answer(status=503, body=b"", headers=(("Retry-After", "3"),)),
        RetryableEngineError,
        "POST /unload_lora_adapter answered 503",
        id="sglang-unload-503",
    ),
]


@pytest.mark.parametrize(("engine", "key", "answer", "kind", "said"), REFUSALS)
async def test_refusals_are_named_and_typed(
    server: WireServer,
    engine: Engine,
    key: str,
    answer: Answer,
    kind: type[EngineError],
    said: str,
) -> None:
    server.answers[key] = answer
    got = await outcome(client_for(server, engine), key)
    assert isinstance(got, tuple), got
    assert got[0] is kind
    assert got[1].startswith("pod-7: ") and said in got[1]
    assert len(got[1]) < 1200


# --- /metrics -----------------------------------------------------------------------------

INFO = (
    'vllm:lora_requests_info{{max_lora="4",waiting_lora_adapters="{}",'
    'running_lora_adapters="{}"}} {}\n'
)


async def test_metrics_take_the_latest_lora_series_and_leave_nan_out(server: WireServer) -> None:
    body = (
        "# HELP vllm:num_requests_running Number of requests running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="base"} NaN\n'
        'vllm:num_requests_running{engine="1",model_name="base"} 2.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="base"} +Inf\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="base"} 0.25\n'
        + INFO.format("", "old", "1.7563e+09")
        + INFO.format("b", "a,b", "1.7564e+09")
        + INFO.format("x", "", "NaN")
    )
    server.answers[METRICS] = text(200, body)
    metrics = await outcome(client_for(server), METRICS)
    assert (getattr(metrics, "running", None), getattr(metrics, "waiting", None)) == (2, 0)
    assert getattr(metrics, "running_adapters", None) == {"a", "b"}
    assert getattr(metrics, "waiting_adapters", None) == {"b"}


@pytest.mark.parametrize(
    "info",
    ["", INFO.format("", "", "1.7563e+09")],
    ids=["no-lora-requests-info", "empty-adapter-lists"],
)
async def test_metrics_without_adapters_in_flight_read_empty(server: WireServer, info: str) -> None:
    server.answers[METRICS] = text(200, 'vllm:num_requests_running{engine="0"} 1\n' + info)
    metrics = await outcome(client_for(server), METRICS)
    assert getattr(metrics, "running", None) == 1
    assert getattr(metrics, "running_adapters", None) == frozenset()


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(
            'vllm:num_requests_running{engine="0"} 1\nvllm:num_requests_waiting{engine="0" 3\n',
            "unreadable /metrics text at line 2 ('vllm:num_requests_waiting{engine=\"0\" 3')",
            id="garbage-line",
        ),
        pytest.param(NGINX_502, "unreadable /metrics text at line 1 ('<html>')", id="html-page"),
    ],
)
async def test_unreadable_metrics_name_the_line(server: WireServer, body: str, said: str) -> None:
    server.answers[METRICS] = text(200, body)
    got = await outcome(client_for(server), METRICS)
    assert isinstance(got, tuple), got
    assert got[0] is PermanentEngineError
    assert got[1].startswith("pod-7: ") and said in got[1]
