"""The bundled router: an OpenAI-compatible proxy that follows the plan (issue 8).

Start one programmatically::

    router = Router(plan_source=FilePlanSource("plan.json"), pod_source=FleetPodSource(fleet))
    app = RouterApp(router)          # an ASGI app; its lifespan starts the loops
    uvicorn.run(app, host="127.0.0.1", port=8080)

or with ``build_router(...)`` below, which wires the usual sources from files.
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
from placement.router.wiring import adapter_info_from_catalog, build_router

__all__ = [
    "AdapterInfo",
    "FilePlanSource",
    "FleetPodSource",
    "JsonLinesRequestLog",
    "MemoryRequestLog",
    "ParquetRequestLog",
    "Router",
    "RouterApp",
    "StaticPlanSource",
    "adapter_info_from_catalog",
    "build_router",
    "create_router_app",
    "open_request_log",
]
