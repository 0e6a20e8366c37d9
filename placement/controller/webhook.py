"""The webhook receiver: ``POST /v1/events`` turns pipeline and login events into preloads.

Owns the route: the checks in their order, idempotency by event id, the answers, the
metrics and the OpenAPI document. The checks and their bounded state are
``webhook_gate``'s (the signature, the body limit, the rate limits, the ids seen), the
schema ``webhook_schema``'s. What an event is worth is
``placement.forecast.event_preloads``'s to decide and the controller's to run (the
``EventSink`` port); this module never names a pod or an adapter itself.

The checks run in this order: the declared length (413 before reading), the body
read up to the limit, the signature (401), then the rate limit (429). An unsigned
sender is refused before it can spend a token, so no flood of forged requests starves
a signed sender. The rate limit is per source: the client address, or, when
``webhook_source_header`` names the header a trusted proxy sets (X-Forwarded-For),
the address that proxy saw (``webhook_trusted_hops`` from the right: entries further
left are the sender's to forge). Then the schema (422), a repeated id (200), a
standby replica (503), and the sink (422 when it refuses the event).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from placement.controller.webhook_gate import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Refusal,
    WebhookGate,
)
from placement.controller.webhook_schema import (
    EVENT_BODY,
    openapi_extra,
    schema_message,
    to_event,
)
from placement.forecast.event_preloads import Event, EventDecision
from placement.settings import ControllerSettings


class EventRejected(Exception):  # noqa: N818  (a refusal with a message for the sender)
    """The sink refuses a well-formed event (an unknown trigger): the sender gets a 422."""


class EventSink(Protocol):
    """The controller's side: whether it acts now (it holds the lease), and the event."""

    def accepting(self) -> bool: ...

    async def submit(self, event: Event) -> EventDecision: ...


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


_NOT_LEADER = Refusal(
    status=503, outcome="not_leader", message="this controller is a standby", retry_after_s=5
)

#: The answers besides 202, for the OpenAPI document.
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "a repeat of an event already accepted"},
    401: {"description": "missing, stale or wrong signature"},
    413: {"description": "body over 64 KiB"},
    422: {"description": "not a valid event"},
    429: {"description": "rate limit exceeded"},
    503: {"description": "this replica is a standby; retry"},
}


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


async def _admit(request: Request, gate: WebhookGate) -> bytes | Refusal:
    """The body once the edge checks pass (the declared length, the length read, the
    signature, the rate, in that order), else the first check's refusal."""
    refusal = gate.too_large_declared(request.headers.get("content-length"))
    if refusal is not None:
        return refusal
    body = await _read_capped(request, gate.max_body_bytes)
    if body is None:
        return gate.too_large()
    refusal = gate.authenticate(
        request.headers.get(TIMESTAMP_HEADER), request.headers.get(SIGNATURE_HEADER), body
    )
    if refusal is not None:
        return refusal
    peer = request.client.host if request.client is not None else None
    refusal = gate.rate_limited(gate.source_of(peer, request.headers))
    return body if refusal is None else refusal


def _accepted(event_id: str, decision: EventDecision) -> JSONResponse:
    return JSONResponse(
        {
            "id": event_id,
            "status": "accepted",
            "preloads": [
                {"kind": a.kind.value, "pod": a.pod, "adapter": a.adapter} for a in decision.actions
            ],
            "skipped": dict(decision.skipped),
        },
        status_code=202,
    )


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

    def refused(refusal: Refusal) -> JSONResponse:
        metrics.events.labels(outcome=refusal.outcome).inc()
        return refusal.response()

    @app.post("/v1/events", status_code=202, openapi_extra=openapi_extra(), responses=_RESPONSES)
    async def receive_event(request: Request) -> JSONResponse:
        admitted = await _admit(request, gate)
        if isinstance(admitted, Refusal):
            return refused(admitted)
        try:
            parsed = EVENT_BODY.validate_json(admitted)
        except ValidationError as exc:
            return refused(Refusal(status=422, outcome="invalid", message=schema_message(exc)))
        if parsed.id in gate.seen:
            metrics.events.labels(outcome="duplicate").inc()
            return JSONResponse({"id": parsed.id, "status": "duplicate"}, status_code=200)
        if not sink.accepting():
            return refused(_NOT_LEADER)
        try:
            decision = await sink.submit(to_event(parsed))
        except EventRejected as exc:
            return refused(Refusal(status=422, outcome="rejected", message=str(exc)))
        gate.remember(parsed.id)
        metrics.events.labels(outcome="accepted").inc()
        metrics.preloads.inc(len(decision.actions))
        return _accepted(parsed.id, decision)

    return app
