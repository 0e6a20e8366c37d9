"""Composition of a router from files and domain values, and serving it with uvicorn.

``build_router`` is the one place that turns a fleet, a plan source, a catalog and
settings into a ``RouterApp``; the CLI, the demo and the tests call it.
``ServedApp`` runs any ASGI app under uvicorn in a thread on 127.0.0.1 (port 0 picks a
free port), for tests, benchmarks and the demo.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from placement.clock import Clock
from placement.domain import AdapterId, Catalog, Fleet, PoolId
from placement.plan import Plan
from placement.router.asgi import RouterApp
from placement.router.core import AdapterInfo, Router
from placement.router.reqlog import RequestLogSink, open_request_log
from placement.router.sources import (
    FilePlanSource,
    FleetPodSource,
    PlanSource,
    PodSource,
    StaticPlanSource,
)
from placement.settings import Settings


def adapter_info_from_catalog(catalog: Catalog, fleet: Fleet | None = None) -> AdapterInfo:
    """Load paths, sizes and (given the fleet) the pool of each adapter's base model."""
    pools: dict[AdapterId, PoolId] = {}
    if fleet is not None:
        for adapter in catalog.adapters:
            pool = fleet.pool_for_base(adapter.base_model)
            if pool is not None:
                pools[adapter.name] = pool.name
    return AdapterInfo(
        sources={a.name: a.source for a in catalog.adapters},
        size_bytes={a.name: a.size_bytes for a in catalog.adapters},
        pools=pools,
    )


def build_router(
    *,
    fleet: Fleet | None = None,
    pod_source: PodSource | None = None,
    plan: str | os.PathLike[str] | Plan | PlanSource | None = None,
    catalog: Catalog | None = None,
    settings: Settings | None = None,
    registry: CollectorRegistry | None = None,
    request_log: str | os.PathLike[str] | RequestLogSink | None = None,
    wall_clock: Clock = time.time,
) -> RouterApp:
    """A ready ASGI app. ``plan`` is a path (watched), a Plan, a PlanSource, or None
    (consistent hashing only). Give ``fleet`` or a ``pod_source``. ``wall_clock``
    stamps the request log (a warped clock in demos)."""
    settings = settings or Settings()
    if pod_source is None:
        if fleet is None:
            raise ValueError("build_router needs a fleet or a pod_source")
        pod_source = FleetPodSource(fleet)
    router = Router(
        plan_source=_plan_source(plan),
        pod_source=pod_source,
        settings=settings.router,
        load_cost=settings.load_cost,
        registry=registry,
        request_log=_sink(request_log),
        adapters=adapter_info_from_catalog(catalog, fleet) if catalog is not None else None,
        wall_clock=wall_clock,
    )
    return RouterApp(router)


def _plan_source(plan: str | os.PathLike[str] | Plan | PlanSource | None) -> PlanSource:
    if plan is None or isinstance(plan, Plan):
        return StaticPlanSource(plan)
    if isinstance(plan, str | os.PathLike):
        return FilePlanSource(plan)
    return plan


def _sink(target: str | os.PathLike[str] | RequestLogSink | None) -> RequestLogSink | None:
    if target is None:
        return None
    if isinstance(target, str | os.PathLike):
        return open_request_log(Path(target))
    return target


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServedApp:
    """An ASGI app served by uvicorn in a daemon thread; a context manager.

    ``with ServedApp(app) as served: served.url`` gives ``http://127.0.0.1:<port>``;
    leaving the block shuts uvicorn down (the app's lifespan shutdown runs).
    """

    def __init__(self, app: Any, *, port: int = 0, fast: bool = True) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="auto",
            http="httptools" if fast else "h11",
            loop="uvloop" if fast else "asyncio",
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, *, timeout_s: float = 10.0) -> ServedApp:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10.0)

    def __enter__(self) -> ServedApp:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def served(app: Any, *, port: int = 0) -> Iterator[ServedApp]:
    with ServedApp(app, port=port) as running:
        yield running


def run_router(app: RouterApp, *, host: str, port: int) -> None:
    """Serve in the foreground until interrupted (the CLI's ``lorafleet router``)."""
    config = uvicorn.Config(
        app, host=host, port=port, access_log=False, http="httptools", loop="uvloop"
    )
    uvicorn.Server(config).run()  # run(), not serve(): it installs the uvloop event loop
