"""The events the webhook accepts: their strict schema, their parsing, their OpenAPI parts.

Owns the two bodies (``PipelineEventBody``, ``LoginEventBody``: no unknown field, no
coercion, ids and names by pattern), the message a sender gets for a body that is
not one of them, the translation to ``forecast.event_preloads.Event``, and the parts
of the OpenAPI document the route declares (its headers and its inlined body schema).
It must not check a signature or a rate (``webhook_gate``) nor answer a request
(``webhook``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from placement.controller.webhook_gate import SIGNATURE_HEADER, TIMESTAMP_HEADER
from placement.domain import TenantId
from placement.forecast.event_preloads import Event, EventKind

_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
_TRIGGER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"


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
EVENT_BODY: TypeAdapter[PipelineEventBody | LoginEventBody] = TypeAdapter(EventBody)


def schema_message(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in error["loc"]) or "body"
        lines.append(f"{where}: {error['msg']}")
    return "invalid event: " + "; ".join(lines)


def to_event(body: PipelineEventBody | LoginEventBody) -> Event:
    if isinstance(body, PipelineEventBody):
        return Event(
            kind=EventKind.PIPELINE, id=body.id, tenant=TenantId(body.tenant), trigger=body.trigger
        )
    return Event(kind=EventKind.LOGIN, id=body.id, tenant=TenantId(body.tenant))


def openapi_extra() -> dict[str, Any]:
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
            "content": {"application/json": {"schema": _inline(EVENT_BODY.json_schema())}},
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
