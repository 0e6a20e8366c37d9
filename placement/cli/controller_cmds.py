"""``lorafleet controller`` and ``lorafleet rollback``: parse the command line, run.

The wiring of every port (Kubernetes or a state directory; Prometheus or a log file)
is ``placement.controller.wiring.build``'s; this module only reads the config path and
serves what that builds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from placement.adapters.http_engine import engine_http_client
from placement.adapters.kube import connect
from placement.cli.app import app, out, report_errors
from placement.controller.config import load_controller_config
from placement.controller.schedule import serve
from placement.controller.wiring import build, plan_store_for


@app.command()
@report_errors
def controller(
    config: Annotated[Path, typer.Option("--config", "-c", help="controller.yaml")],
) -> None:
    """Run the controller: scheduled forecasts, plans, preloads, the webhook, /metrics."""
    parsed = load_controller_config(config)

    async def main() -> None:
        async with engine_http_client() as http:
            schedule, webhook = build(parsed, http=http)
            await serve(schedule, webhook, host=parsed.webhook.host, port=parsed.webhook.port)

    asyncio.run(main())


@app.command()
@report_errors
def rollback(
    config: Annotated[Path, typer.Option("--config", "-c", help="controller.yaml")],
) -> None:
    """Make the previous plan current again (the plan ConfigMap, or the state directory)."""
    parsed = load_controller_config(config)
    api = connect(host=parsed.kubernetes.api_host) if parsed.kubernetes is not None else None
    try:
        restored = plan_store_for(parsed, api).rollback()
    finally:
        if api is not None:
            api.close()  # type: ignore[no-untyped-call]
    out().print(
        f"rolled back to plan {restored.id} (created {restored.created_at:%Y-%m-%d %H:%M}Z)"
    )
