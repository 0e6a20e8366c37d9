"""The published OpenAPI document of the webhook stays what docs/webhook-openapi.json says.

Regenerate after an intended change with ``LORAFLEET_REGENERATE=1 pytest tests/controller``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from prometheus_client import CollectorRegistry

from placement.controller.webhook import create_webhook_app
from placement.forecast.event_preloads import Event, EventDecision
from placement.settings import ControllerSettings

GOLDEN = Path(__file__).resolve().parents[2] / "docs" / "webhook-openapi.json"


class _Idle:
    def accepting(self) -> bool:
        return True

    async def submit(self, event: Event) -> EventDecision:
        return EventDecision(actions=())


def test_the_openapi_document_matches_the_published_copy() -> None:
    app = create_webhook_app(
        _Idle(),
        secret=b"a-secret-of-at-least-thirty-two-bytes",
        settings=ControllerSettings(),
        clock=lambda: 0.0,
        registry=CollectorRegistry(),
    )
    document = json.dumps(app.openapi(), indent=2, sort_keys=True) + "\n"
    if os.environ.get("LORAFLEET_REGENERATE") == "1":
        GOLDEN.write_text(document)
    assert GOLDEN.read_text() == document
