"""The webhook at the wire: signatures, limits, schema, idempotency, rate limit, fuzzing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from placement.controller.webhook import EventRejected, create_webhook_app
from placement.controller.webhook_gate import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SeenIds,
    TokenBuckets,
    sign,
)
from placement.domain import TenantId
from placement.forecast.event_preloads import (
    Event,
    EventDecision,
    EventKind,
    PodView,
    event_preloads,
    pipeline_predictor,
)
from placement.settings import ControllerSettings
from tests.controller.controller_support import doc_catalog, doc_pipelines, make_fleet
from tests.factories import FakeClock

SECRET = b"s3cret-for-tests-of-at-least-32-bytes"


class RecordingSink:
    """The controller's side, in memory: decides with the real pure code, runs nothing."""

    def __init__(self) -> None:
        self.leader = True
        self.events: list[Event] = []
        self._catalog = doc_catalog()
        self._fleet = make_fleet(2)
        self._predict = pipeline_predictor(doc_pipelines(), self._catalog)

    def accepting(self) -> bool:
        return self.leader

    async def submit(self, event: Event) -> EventDecision:
        if event.kind is EventKind.PIPELINE and event.trigger == "unknown.trigger":
            raise EventRejected("unknown trigger 'unknown.trigger'")
        self.events.append(event)
        views = {pod.name: PodView(pod=pod) for pod in self._fleet.pods}
        return event_preloads(
            event,
            self._predict(event),
            catalog=self._catalog,
            fleet=self._fleet,
            plan=None,
            views=views,
            busy_rps={},
            max_loads=2,
        )


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


@pytest.fixture
def app(sink: RecordingSink, clock: FakeClock) -> FastAPI:
    return create_webhook_app(
        sink,
        secret=SECRET,
        settings=ControllerSettings(webhook_rate_per_s=5, webhook_burst=5),
        clock=clock,
        registry=CollectorRegistry(),
    )


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, client=("10.1.1.1", 4000))
    async with httpx.AsyncClient(transport=transport, base_url="http://controller") as client:
        yield client


def signed(body: bytes, clock: FakeClock, *, age_s: int = 0) -> dict[str, str]:
    timestamp = str(int(clock()) - age_s)
    return {
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(SECRET, timestamp=timestamp, body=body),
        "content-type": "application/json",
    }


UPLOAD = {"type": "pipeline", "trigger": "document.uploaded", "tenant": "acme", "id": "evt-1"}


def raw(event: object) -> bytes:
    return json.dumps(event).encode()


@pytest.mark.anyio
async def test_signed_upload_is_accepted_with_its_preloads(
    http: httpx.AsyncClient, clock: FakeClock, sink: RecordingSink
) -> None:
    body = raw(UPLOAD)
    response = await http.post("/v1/events", content=body, headers=signed(body, clock))
    assert response.status_code == 202, response.text
    assert response.json()["preloads"] == [
        {"kind": "load", "pod": "pod-0", "adapter": "doc-classifier"},
        {"kind": "warmup", "pod": "pod-0", "adapter": "doc-classifier"},
        {"kind": "load", "pod": "pod-0", "adapter": "legal-extract"},
        {"kind": "warmup", "pod": "pod-0", "adapter": "legal-extract"},
    ]
    assert sink.events == [
        Event(
            kind=EventKind.PIPELINE,
            id="evt-1",
            tenant=TenantId("acme"),
            trigger="document.uploaded",
        )
    ]


@pytest.mark.anyio
async def test_a_repeated_event_id_is_acknowledged_but_not_acted_on(
    http: httpx.AsyncClient, clock: FakeClock, sink: RecordingSink
) -> None:
    body = raw(UPLOAD)
    first = await http.post("/v1/events", content=body, headers=signed(body, clock))
    clock.advance(10)
    again = await http.post("/v1/events", content=body, headers=signed(body, clock))
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["status"] == "duplicate"
    assert [e.id for e in sink.events] == ["evt-1"]


def _bad_signature(body: bytes, clock: FakeClock) -> dict[str, str]:
    headers = signed(body, clock)
    headers[SIGNATURE_HEADER] = sign(
        b"other-secret", timestamp=headers[TIMESTAMP_HEADER], body=body
    )
    return headers


def _no_headers(body: bytes, clock: FakeClock) -> dict[str, str]:
    return {"content-type": "application/json"}


def _stale(body: bytes, clock: FakeClock) -> dict[str, str]:
    return signed(body, clock, age_s=301)


def _future(body: bytes, clock: FakeClock) -> dict[str, str]:
    return signed(body, clock, age_s=-301)


def _signed_other_body(body: bytes, clock: FakeClock) -> dict[str, str]:
    return signed(body + b" ", clock)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("headers_for", "message"),
    [
        pytest.param(_no_headers, "missing", id="unsigned"),
        pytest.param(_bad_signature, "signature does not match", id="wrong-secret"),
        pytest.param(_signed_other_body, "signature does not match", id="body-changed"),
        pytest.param(_stale, "at most 300 s", id="older-than-5-min"),
        pytest.param(_future, "at most 300 s", id="from-the-future"),
    ],
)
async def test_unauthenticated_events_are_refused(
    http: httpx.AsyncClient,
    clock: FakeClock,
    sink: RecordingSink,
    headers_for: Callable[[bytes, FakeClock], dict[str, str]],
    message: str,
) -> None:
    body = raw(UPLOAD)
    response = await http.post("/v1/events", content=body, headers=headers_for(body, clock))
    assert response.status_code == 401
    assert message in response.json()["detail"]
    assert sink.events == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("event", "message"),
    [
        pytest.param(
            {**UPLOAD, "adapter": "x"},
            "adapter: Extra inputs are not permitted",
            id="names-adapter",
        ),
        pytest.param(
            {**UPLOAD, "trigger": "../../etc/passwd"}, "trigger: String should match", id="path"
        ),
        pytest.param(
            {**UPLOAD, "type": "deploy"}, "does not match any of the expected tags", id="type"
        ),
        pytest.param({"type": "login", "tenant": "acme"}, "login.id: Field required", id="no-id"),
        pytest.param(
            {**UPLOAD, "tenant": 7}, "tenant: Input should be a valid string", id="tenant-int"
        ),
        pytest.param([UPLOAD], "Input should be an object", id="list"),
        pytest.param(
            {**UPLOAD, "trigger": "unknown.trigger"}, "unknown trigger", id="unknown-trigger"
        ),
    ],
)
async def test_invalid_events_get_422_with_a_clear_message(
    http: httpx.AsyncClient, clock: FakeClock, event: object, message: str
) -> None:
    body = raw(event)
    response = await http.post("/v1/events", content=body, headers=signed(body, clock))
    assert response.status_code == 422
    assert message in response.json()["detail"]


@pytest.mark.anyio
async def test_not_json_is_422(http: httpx.AsyncClient, clock: FakeClock) -> None:
    body = b"{not json"
    response = await http.post("/v1/events", content=body, headers=signed(body, clock))
    assert response.status_code == 422
    assert "Invalid JSON" in response.json()["detail"]


@pytest.mark.anyio
async def test_bodies_over_64_kib_are_refused_declared_or_streamed(
    http: httpx.AsyncClient, clock: FakeClock
) -> None:
    body = raw({**UPLOAD, "pad": "x" * 70_000})
    declared = await http.post("/v1/events", content=body, headers=signed(body, clock))

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 8192):
            yield body[start : start + 8192]

    streamed = await http.post("/v1/events", content=chunks(), headers=signed(body, clock))
    assert (declared.status_code, streamed.status_code) == (413, 413)


@pytest.mark.anyio
async def test_a_standby_answers_503_and_does_not_remember_the_id(
    http: httpx.AsyncClient, clock: FakeClock, sink: RecordingSink
) -> None:
    sink.leader = False
    body = raw(UPLOAD)
    standby = await http.post("/v1/events", content=body, headers=signed(body, clock))
    sink.leader = True
    leader = await http.post("/v1/events", content=body, headers=signed(body, clock))
    assert (standby.status_code, leader.status_code) == (503, 202)
    assert standby.headers["retry-after"] == "5"


@pytest.mark.anyio
async def test_rate_limit_per_source_holds_and_refills_with_time(
    app: FastAPI, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    statuses = []
    for i in range(8):
        body = raw({**UPLOAD, "id": f"flood-{i}"})
        statuses.append(
            (await http.post("/v1/events", content=body, headers=signed(body, clock))).status_code
        )
    other = httpx.ASGITransport(app=app, client=("10.9.9.9", 4000))
    async with httpx.AsyncClient(transport=other, base_url="http://controller") as neighbour:
        body = raw({**UPLOAD, "id": "neighbour"})
        neighbour_status = (
            await neighbour.post("/v1/events", content=body, headers=signed(body, clock))
        ).status_code
    clock.advance(1)
    body = raw({**UPLOAD, "id": "later"})
    later = (await http.post("/v1/events", content=body, headers=signed(body, clock))).status_code
    assert statuses == [202] * 5 + [429] * 3
    assert neighbour_status == 202
    assert later == 202


@pytest.mark.anyio
async def test_the_openapi_document_describes_the_endpoint(http: httpx.AsyncClient) -> None:
    document = (await http.get("/openapi.json")).json()
    operation = document["paths"]["/v1/events"]["post"]
    headers = {p["name"] for p in operation["parameters"]}
    assert headers == {TIMESTAMP_HEADER, SIGNATURE_HEADER}
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema["discriminator"]["propertyName"] == "type"


# --- bounded memory under a flood ---------------------------------------------------


@given(
    sources=st.lists(st.text(min_size=1, max_size=8), max_size=300),
    steps=st.lists(st.floats(-100, 100), max_size=300),
)
def test_token_buckets_stay_bounded_and_never_exceed_burst(
    sources: list[str], steps: list[float]
) -> None:
    buckets = TokenBuckets(rate_per_s=2, burst=3, max_sources=16)
    now_s = 0.0
    allowed: dict[str, int] = {}
    for source, step in zip(sources, steps, strict=False):
        now_s += step
        if buckets.take(source, now_s=now_s):
            allowed[source] = allowed.get(source, 0) + 1
        assert len(buckets) <= 16


def test_a_flood_from_one_source_gets_burst_then_rate() -> None:
    buckets = TokenBuckets(rate_per_s=2, burst=3, max_sources=16)
    granted = sum(buckets.take("a", now_s=0.0) for _ in range(100))
    granted_later = sum(buckets.take("a", now_s=10.0) for _ in range(100))
    jumped_back = sum(buckets.take("a", now_s=-1000.0) for _ in range(100))
    assert (granted, granted_later, jumped_back) == (3, 3, 0)


def test_seen_ids_are_bounded_in_number_and_age() -> None:
    seen = SeenIds(max_ids=100, ttl_s=600)
    for i in range(10_000):
        seen.add(f"id-{i}", now_s=float(i) / 100)
    assert len(seen) == 100
    assert "id-9999" in seen and "id-0" not in seen
    seen.add("late", now_s=10_000.0)
    assert len(seen) == 1


# --- fuzzing ------------------------------------------------------------------------


def test_schemathesis_fuzz_never_5xx(app: FastAPI, clock: FakeClock) -> None:
    import schemathesis
    from schemathesis.core import NotSet
    from starlette.testclient import TestClient

    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operation = schema["/v1/events"]["POST"]
    strategy = operation.as_strategy()
    statuses: set[int] = set()

    with TestClient(app, client=("10.2.2.2", 1)) as test_client:

        @settings(max_examples=60, deadline=None, database=None)
        @given(case=strategy, sign_it=st.booleans())
        def fuzz(case: schemathesis.Case[Any], sign_it: bool) -> None:
            clock.advance(1)  # keeps the rate limit from deciding every answer
            present = not isinstance(case.body, NotSet)
            body = json.dumps(case.body).encode() if present else b""
            headers = {str(k): str(v) for k, v in (case.headers or {}).items()}
            if sign_it:
                headers.update(signed(body, clock))
            response = test_client.post("/v1/events", content=body, headers=headers)
            assert response.status_code < 500, response.text
            statuses.add(response.status_code)
            case.validate_response(response, excluded_checks=[schemathesis.checks.ignored_auth])

        fuzz()
    assert {202, 401} <= statuses  # the fuzzer reached past the signature check


@pytest.mark.anyio
async def test_a_flood_from_many_sources_keeps_memory_bounded_and_the_limit_holding(
    sink: RecordingSink, clock: FakeClock
) -> None:
    from placement.controller.webhook_gate import WebhookGate

    settings_ = ControllerSettings(
        webhook_rate_per_s=5,
        webhook_burst=5,
        webhook_max_sources=64,
        webhook_max_ids=100,
        webhook_total_rate_per_s=1e9,
    )
    gate = WebhookGate(secret=SECRET, settings=settings_, clock=clock)
    app = create_webhook_app(
        sink,
        secret=SECRET,
        settings=settings_,
        clock=clock,
        registry=CollectorRegistry(),
        gate=gate,
    )
    statuses: dict[int, int] = {}
    for i in range(600):
        source = f"10.{i % 250}.{i // 250}.1" if i % 2 else "10.255.255.1"  # half from one source
        transport = httpx.ASGITransport(app=app, client=(source, 1000))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            body = raw({**UPLOAD, "id": f"flood-{i}"})
            status = (
                await client.post("/v1/events", content=body, headers=signed(body, clock))
            ).status_code
        statuses[status] = statuses.get(status, 0) + 1
        assert len(gate.per_source) <= 64 and len(gate.seen) <= 100
    # the single loud source got its burst of 5, every other source its first event
    assert statuses == {202: 300 + 5, 429: 300 - 5}


# --- the order of the checks, and where a source comes from ------------------------


@pytest.mark.anyio
async def test_unsigned_requests_do_not_spend_the_senders_tokens(
    http: httpx.AsyncClient, clock: FakeClock
) -> None:
    forged = [
        (await http.post("/v1/events", content=raw(UPLOAD), headers=_no_headers(b"", clock)))
        for _ in range(50)
    ]
    accepted = []
    for i in range(5):  # the fixture's burst
        body = raw({**UPLOAD, "id": f"after-forgeries-{i}"})
        accepted.append(
            (await http.post("/v1/events", content=body, headers=signed(body, clock))).status_code
        )
    assert {r.status_code for r in forged} == {401}
    assert accepted == [202] * 5


@pytest.mark.parametrize(
    ("header", "hops", "forwarded", "expected"),
    [
        pytest.param(None, 1, "1.2.3.4", "10.0.0.9", id="not-configured-ignores-the-header"),
        pytest.param("X-Forwarded-For", 1, "6.6.6.6, 1.2.3.4", "1.2.3.4", id="last-hop"),
        pytest.param("X-Forwarded-For", 2, "6.6.6.6, 1.2.3.4, 10.1.1.1", "1.2.3.4", id="2-hops"),
        pytest.param("X-Forwarded-For", 3, "1.2.3.4", "10.0.0.9", id="too-few-entries"),
        pytest.param("X-Forwarded-For", 1, "", "10.0.0.9", id="absent"),
        pytest.param("X-Forwarded-For", 1, "not an address!", "10.0.0.9", id="malformed"),
        pytest.param("X-Real-IP", 1, "2001:db8::1", "2001:db8::1", id="ipv6"),
    ],
)
def test_the_source_is_the_trusted_proxys_entry_else_the_peer(
    header: str | None, hops: int, forwarded: str, expected: str, clock: FakeClock
) -> None:
    from placement.controller.webhook_gate import WebhookGate

    gate = WebhookGate(
        secret=SECRET,
        settings=ControllerSettings(webhook_source_header=header, webhook_trusted_hops=hops),
        clock=clock,
    )
    headers = {"x-forwarded-for": forwarded, "x-real-ip": forwarded} if forwarded else {}
    assert gate.source_of("10.0.0.9", httpx.Headers(headers)) == expected


@pytest.mark.anyio
@pytest.mark.parametrize(
    "timestamp", ["²", "1700000000\n", " 1700000000", "17e8", "1" * 13], ids=repr
)
async def test_a_timestamp_is_parsed_as_ascii_digits_only(
    app: FastAPI, clock: FakeClock, timestamp: str
) -> None:
    from starlette.testclient import TestClient

    body = raw(UPLOAD)
    headers = {**signed(body, clock), TIMESTAMP_HEADER: timestamp}
    with TestClient(app) as client:
        response = client.post(
            "/v1/events",
            content=body,
            headers={k.encode(): v.encode() for k, v in headers.items()},
        )
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        pytest.param(b"", "has 0 bytes", id="empty"),
        pytest.param(b"x" * 31, "has 31 bytes", id="31-bytes"),
        pytest.param(b"replace-me-with-a-random-32-byte-value", "placeholder", id="placeholder"),
    ],
)
def test_the_gate_refuses_a_weak_secret(secret: bytes, message: str, clock: FakeClock) -> None:
    from placement.controller.webhook_gate import WebhookGate

    with pytest.raises(ValueError, match=message):
        WebhookGate(secret=secret, settings=ControllerSettings(), clock=clock)
