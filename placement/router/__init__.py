"""The bundled router: an OpenAI-compatible proxy that follows the plan.

Start one programmatically (docs/router.md has more)::

    app = build_router(fleet=fleet, plan="plan.json", catalog=catalog)  # a RouterApp
    with ServedApp(app) as served:     # uvicorn in a thread; or run_router(app, ...)
        ...                            # served.url is http://127.0.0.1:<port>

``RouterApp`` is a plain ASGI app whose lifespan starts the scrape, plan and log loops;
``app.router`` is the ``Router`` with its ``topology`` (pods, ledger, plan in use).
"""

from __future__ import annotations

from placement.router.asgi import RouterApp, create_router_app
from placement.router.core import AdapterInfo, Router
from placement.router.reqlog import (
    JsonLinesRequestLog,
    MemoryRequestLog,
    ParquetRequestLog,
    open_request_log,
)
from placement.router.sources import FilePlanSource, FleetPodSource, StaticPlanSource
from placement.router.wiring import ServedApp, adapter_info_from_catalog, build_router, run_router

__all__ = [
    "AdapterInfo",
    "FilePlanSource",
    "FleetPodSource",
    "JsonLinesRequestLog",
    "MemoryRequestLog",
    "ParquetRequestLog",
    "Router",
    "RouterApp",
    "ServedApp",
    "StaticPlanSource",
    "adapter_info_from_catalog",
    "build_router",
    "create_router_app",
    "open_request_log",
    "run_router",
]
