"""Webhook throughput: signed events through the full gate versus a bare JSON endpoint.

Runs both ASGI apps in-process (httpx.ASGITransport, no sockets) and prints events per
second and the gate's cost as a ratio to the baseline measured in the same run.

    .venv/bin/python bench/webhook_gate.py [--events 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from placement.controller.webhook import create_webhook_app
from placement.controller.webhook_gate import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from placement.forecast.event_preloads import Event, EventDecision
from placement.settings import ControllerSettings

SECRET = b"bench-secret-bench-secret-bench-secret"


class _Sink:
    def accepting(self) -> bool:
        return True

    async def submit(self, event: Event) -> EventDecision:
        return EventDecision(actions=())


def _baseline() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/events")
    async def receive(request: Request) -> JSONResponse:
        return JSONResponse(json.loads(await request.body()), status_code=202)

    return app


async def _rate(app: FastAPI, bodies: list[bytes], *, signed: bool) -> float:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        start = time.perf_counter()
        for body in bodies:
            ts = str(int(time.time()))
            headers = {"content-type": "application/json"}
            if signed:
                headers[TIMESTAMP_HEADER] = ts
                headers[SIGNATURE_HEADER] = sign(SECRET, timestamp=ts, body=body)
            response = await client.post("/v1/events", content=body, headers=headers)
            assert response.status_code == 202, response.text
        return len(bodies) / (time.perf_counter() - start)


async def main(events: int) -> None:
    bodies = [
        json.dumps(
            {"type": "pipeline", "trigger": "document.uploaded", "tenant": "acme", "id": f"e{i}"}
        ).encode()
        for i in range(events)
    ]
    generous = ControllerSettings(
        webhook_rate_per_s=1e9, webhook_burst=1e9, webhook_total_rate_per_s=1e9
    )
    gate = create_webhook_app(
        _Sink(), secret=SECRET, settings=generous, clock=time.time, registry=CollectorRegistry()
    )
    base_rate = await _rate(_baseline(), bodies, signed=False)
    gate_rate = await _rate(gate, bodies, signed=True)
    print(f"baseline (bare JSON endpoint): {base_rate:8.0f} events/s")
    print(f"webhook gate (full checks):    {gate_rate:8.0f} events/s")
    print(f"gate / baseline:               {gate_rate / base_rate:8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3000)
    asyncio.run(main(parser.parse_args().events))
