"""The webhook receiver: ``POST /v1/events`` turns pipeline and login events into preloads.

Owns the edge of the events: the body limit, the HMAC signature and its timestamp
window, rate limiting per source, the strict schema, idempotency by event id, and
the OpenAPI document. What an event is worth is
``placement.forecast.event_preloads``'s to decide and the controller's to run (the
``EventSink`` port); this module never names a pod or an adapter itself.

Signing (the sender's side): ``X-Lorafleet-Timestamp`` is the Unix time in seconds,
``X-Lorafleet-Signature`` is ``sha256=`` and the hex HMAC-SHA256, keyed with the
shared secret, of the timestamp, a ``.``, and the raw body.

The checks run in this order: the declared length (413 before reading), the body
read up to the limit, the signature (401), then the rate limit (429). An unsigned
sender is refused before it can spend a token, so no flood of forged requests starves
a signed sender. The rate limit is per source: the client address, or, when
``webhook_source_header`` names the header a trusted proxy sets (X-Forwarded-For),
the address that proxy saw (``webhook_trusted_hops`` from the right: entries further
left are the sender's to forge). Every header value is parsed strictly, as ASCII.

Every structure here is bounded: the token buckets (``max_sources``), the remembered
event ids (``max_ids``, and only for twice the timestamp window). A flood costs CPU,
not memory.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from placement.controller.config import secret_problem
from placement.domain import TenantId
from placement.forecast.event_preloads import Event, EventDecision, EventKind
from placement.settings import ControllerSettings

TIMESTAMP_HEADER = "X-Lorafleet-Timestamp"
SIGNATURE_HEADER = "X-Lorafleet-Signature"
_SIGNATURE = re.compile(r"^sha256=([0-9a-f]{64})$")
_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_TRIGGER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_DIGITS = re.compile(r"[0-9]{1,12}", re.ASCII)
#: A source key taken from a header: an address, or at worst an opaque short token.
_SOURCE_KEY = re.compile(r"[0-9A-Za-z.:\[\]_-]{1,64}", re.ASCII)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PipelineEventBody(_Strict):
    """A pipeline step happened: ``trigger`` names a pipeline of pipelines.yaml."""

    type: Literal["pipeline"]
    trigger: str = Field(pattern=_TRIGGER_PATTERN, examples=["document.uploaded"])
    tenant: str = Field(pattern=_TENANT_PATTERN, examples=["acme"])
    id: str = Field(pattern=_ID_PATTERN, description="unique per event; repeats are ignored")


class LoginEventBody(_Strict):
    """A user of ``tenant`` logged in."""

    type: Literal["login"]
    tenant: str = Field(pattern=_TENANT_PATTERN, examples=["acme"])
    id: str = Field(pattern=_ID_PATTERN, description="unique per event; repeats are ignored")


EventBody = Annotated[PipelineEventBody | LoginEventBody, Field(discriminator="type")]
_EVENT_BODY: TypeAdapter[PipelineEventBody | LoginEventBody] = TypeAdapter(EventBody)


class EventRejected(Exception):  # noqa: N818  (a refusal with a message for the sender)
    """The sink refuses a well-formed event (an unknown trigger): the sender gets a 422."""


class EventSink(Protocol):
    """The controller's side: whether it acts now (it holds the lease), and the event."""

    def accepting(self) -> bool: ...

    async def submit(self, event: Event) -> EventDecision: ...


class TokenBuckets:
    """Per-source token buckets, the least recently seen source forgotten past ``max_sources``.

    A clock that jumps back refills nothing; one that jumps forward refills at most a
    full bucket.
    """

    def __init__(self, *, rate_per_s: float, burst: float, max_sources: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_sources = max_sources
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, source: str, *, now_s: float) -> bool:
        tokens, last_s = self._buckets.pop(source, (self.burst, now_s))
        tokens = min(self.burst, tokens + max(0.0, now_s - last_s) * self.rate_per_s)
        allowed = tokens >= 1.0
        self._buckets[source] = (tokens - 1.0 if allowed else tokens, max(last_s, now_s))
        while len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return allowed


class SeenIds:
    """Event ids accepted recently: at most ``max_ids``, each kept ``ttl_s``."""

    def __init__(self, *, max_ids: int, ttl_s: float) -> None:
        self.max_ids = max_ids
        self.ttl_s = ttl_s
        self._seen: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._seen

    def add(self, event_id: str, *, now_s: float) -> None:
        self._seen[event_id] = now_s
        self._seen.move_to_end(event_id)
        while self._seen and (
            len(self._seen) > self.max_ids or now_s - next(iter(self._seen.values())) > self.ttl_s
        ):
            self._seen.popitem(last=False)


def sign(secret: bytes, *, timestamp: str, body: bytes) -> str:
    """The signature header's value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter(
            "lorafleet_webhook_events",
            "Webhook requests by outcome (accepted, duplicate, rate_limited, too_large, "
            "unauthorized, invalid, rejected, not_leader).",
            ["outcome"],
            registry=registry,
        )
        self.preloads = Counter(
            "lorafleet_webhook_preload_actions",
            "Load and warm-up actions decided for webhook events.",
            registry=registry,
        )


@dataclass(frozen=True, kw_only=True)
class _Refusal:
    status: int
    outcome: str
    message: str
    retry_after_s: int | None = None

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else None
        return JSONResponse({"detail": self.message}, status_code=self.status, headers=headers)


def _schema_message(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in error["loc"]) or "body"
        lines.append(f"{where}: {error['msg']}")
    return "invalid event: " + "; ".join(lines)


def _to_event(body: PipelineEventBody | LoginEventBody) -> Event:
    if isinstance(body, PipelineEventBody):
        return Event(
            kind=EventKind.PIPELINE, id=body.id, tenant=TenantId(body.tenant), trigger=body.trigger
        )
    return Event(kind=EventKind.LOGIN, id=body.id, tenant=TenantId(body.tenant))


class WebhookGate:
    """The checks in order, each cheaper than the next; keeps the bounded state."""

    def __init__(
        self, *, secret: bytes, settings: ControllerSettings, clock: Callable[[], float]
    ) -> None:
        problem = secret_problem(secret)
        if problem is not None:
            raise ValueError(problem)
        self._secret = secret
        self._settings = settings
        self._clock = clock
        self.per_source = TokenBuckets(
            rate_per_s=settings.webhook_rate_per_s,
            burst=settings.webhook_burst,
            max_sources=settings.webhook_max_sources,
        )
        self.overall = TokenBuckets(
            rate_per_s=settings.webhook_total_rate_per_s,
            burst=settings.webhook_total_rate_per_s,
            max_sources=1,
        )
        self.seen = SeenIds(max_ids=settings.webhook_max_ids, ttl_s=2 * settings.webhook_max_skew_s)

    def source_of(self, peer: str | None, headers: Mapping[str, str]) -> str:
        """The key of the sender's token bucket: the address the trusted proxy put in
        ``webhook_source_header`` (``webhook_trusted_hops`` from the right), else the
        client address. A header that is absent or malformed falls back to the peer."""
        fallback = peer or "unknown"
        name = self._settings.webhook_source_header
        if name is None:
            return fallback
        entries = [part.strip() for part in headers.get(name, "").split(",")]
        hops = self._settings.webhook_trusted_hops
        if len(entries) < hops:
            return fallback
        candidate = entries[-hops]
        return candidate if _SOURCE_KEY.fullmatch(candidate) else fallback

    def too_large_declared(self, declared_length: str | None) -> _Refusal | None:
        """413 before reading a byte, when Content-Length says so (or is not a number)."""
        if declared_length is not None and (
            not _DIGITS.fullmatch(declared_length) or int(declared_length) > self.max_body_bytes
        ):
            return self.too_large()
        return None

    def rate_limited(self, source: str) -> _Refusal | None:
        """429 when this source, or every source together, is over its rate."""
        now_s = self._clock()
        if not self.per_source.take(source, now_s=now_s) or not self.overall.take("*", now_s=now_s):
            return _Refusal(
                status=429, outcome="rate_limited", message="rate limit exceeded", retry_after_s=1
            )
        return None

    @property
    def max_body_bytes(self) -> int:
        return self._settings.webhook_max_body_bytes

    def too_large(self) -> _Refusal:
        return _Refusal(
            status=413,
            outcome="too_large",
            message=f"body larger than {self.max_body_bytes} bytes",
        )

    def authenticate(
        self, timestamp: str | None, signature: str | None, body: bytes
    ) -> _Refusal | None:
        def refuse(message: str) -> _Refusal:
            return _Refusal(status=401, outcome="unauthorized", message=message)

        if not timestamp or not signature:
            return refuse(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
        if not _DIGITS.fullmatch(timestamp):
            return refuse(f"{TIMESTAMP_HEADER} must be Unix seconds (ASCII digits)")
        skew_s = abs(self._clock() - int(timestamp))
        if skew_s > self._settings.webhook_max_skew_s:
            return refuse(
                f"timestamp is {skew_s:.0f} s away from now "
                f"(at most {self._settings.webhook_max_skew_s} s allowed)"
            )
        match = _SIGNATURE.match(signature)
        expected = sign(self._secret, timestamp=timestamp, body=body)
        if match is None or not hmac.compare_digest(expected.encode(), signature.encode()):
            return refuse("signature does not match")
        return None

    def remember(self, event_id: str) -> None:
        self.seen.add(event_id, now_s=self._clock())


async def _read_capped(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it passes ``limit`` bytes (chunked senders too)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _openapi_extra() -> dict[str, Any]:
    header = {"required": True, "schema": {"type": "string"}}
    return {
        "parameters": [
            {
                "name": TIMESTAMP_HEADER,
                "in": "header",
                **header,
                "description": "Unix time in seconds; at most 5 minutes old",
            },
            {
                "name": SIGNATURE_HEADER,
                "in": "header",
                **header,
                "description": "sha256=<hex HMAC-SHA256 of timestamp '.' body>",
            },
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline(_EVENT_BODY.json_schema())}},
        },
    }


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with its ``$defs`` substituted, so that it stands alone in the document."""
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(definitions[ref.removeprefix("#/$defs/")])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    inlined: dict[str, Any] = resolve(schema)
    # The discriminator's mapping points at $defs; the tags alone are enough to read it.
    inlined.get("discriminator", {}).pop("mapping", None)
    return inlined


def create_webhook_app(
    sink: EventSink,
    *,
    secret: bytes,
    settings: ControllerSettings,
    clock: Callable[[], float],
    registry: CollectorRegistry,
    gate: WebhookGate | None = None,
) -> FastAPI:
    """The ASGI app with ``POST /v1/events``; the controller adds its own routes to it.

    ``gate`` (built from the other arguments when absent) holds the bounded state; a
    test passes its own to look at it.
    """
    gate = gate or WebhookGate(secret=secret, settings=settings, clock=clock)
    metrics = WebhookMetrics(registry)
    app = FastAPI(
        title="lorafleet controller",
        version="1",
        description="Pipeline and login events that trigger adapter preloads.",
    )

    def refused(refusal: _Refusal) -> JSONResponse:
        metrics.events.labels(outcome=refusal.outcome).inc()
        return refusal.response()

    @app.post(
        "/v1/events",
        status_code=202,
        openapi_extra=_openapi_extra(),
        responses={
            200: {"description": "a repeat of an event already accepted"},
            401: {"description": "missing, stale or wrong signature"},
            413: {"description": "body over 64 KiB"},
            422: {"description": "not a valid event"},
            429: {"description": "rate limit exceeded"},
            503: {"description": "this replica is a standby; retry"},
        },
    )
    async def receive_event(request: Request) -> JSONResponse:
        refusal = gate.too_large_declared(request.headers.get("content-length"))
        if refusal is not None:
            return refused(refusal)
        body = await _read_capped(request, gate.max_body_bytes)
        if body is None:
            return refused(gate.too_large())
        refusal = gate.authenticate(
            request.headers.get(TIMESTAMP_HEADER), request.headers.get(SIGNATURE_HEADER), body
        )
        if refusal is not None:
            return refused(refusal)
        peer = request.client.host if request.client is not None else None
        refusal = gate.rate_limited(gate.source_of(peer, request.headers))
        if refusal is not None:
            return refused(refusal)
        try:
            parsed = _EVENT_BODY.validate_json(body)
        except ValidationError as exc:
            return refused(_Refusal(status=422, outcome="invalid", message=_schema_message(exc)))
        if parsed.id in gate.seen:
            metrics.events.labels(outcome="duplicate").inc()
            return JSONResponse({"id": parsed.id, "status": "duplicate"}, status_code=200)
        if not sink.accepting():
            return refused(
                _Refusal(
                    status=503,
                    outcome="not_leader",
                    message="this controller is a standby",
                    retry_after_s=5,
                )
            )
        try:
            decision = await sink.submit(_to_event(parsed))
        except EventRejected as exc:
            return refused(_Refusal(status=422, outcome="rejected", message=str(exc)))
        gate.remember(parsed.id)
        metrics.events.labels(outcome="accepted").inc()
        metrics.preloads.inc(len(decision.actions))
        return JSONResponse(
            {
                "id": parsed.id,
                "status": "accepted",
                "preloads": [
                    {"kind": a.kind.value, "pod": a.pod, "adapter": a.adapter}
                    for a in decision.actions
                ],
                "skipped": dict(decision.skipped),
            },
            status_code=202,
        )

    return app
