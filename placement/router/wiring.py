"""Composition of a router from files and domain values, and serving it with uvicorn.

``build_router`` is the one place that turns a fleet, a plan source, a catalog and
settings into a ``RouterApp``; the CLI, the demo and the tests call it.
``ServedApp`` runs any ASGI app under uvicorn in a thread on 127.0.0.1 (port 0 picks a
free port), for tests, benchmarks and the demo; ``ServedApp.call`` runs a coroutine on
its event loop, so a test can drive the router's rounds (``scrape_all``) itself.
``run_router`` serves in the foreground (``lorafleet router``); on port 0 the kernel
picks the port and ``on_listening`` hears which (``write_port_file`` puts it in a file).
``RouterWithPicker`` adds the endpoint picker (``router.picker_grpc``, Envoy's
external processing over gRPC) to a ``RouterApp``: it serves on the same event loop and
the same ``Router``, started after the router's loops and stopped before them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, MutableMapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
import uvicorn
from prometheus_client import CollectorRegistry

from placement.clock import Clock
from placement.domain import AdapterId, Catalog, Fleet, PoolId
from placement.inputs.catalog import CatalogFile
from placement.inputs.files import write_atomically
from placement.plan import Plan
from placement.router.asgi import RouterApp
from placement.router.core import AdapterInfo, Router
from placement.router.http_protocol import RouterHttpProtocol
from placement.router.reqlog import RequestLogSink, open_request_log
from placement.router.sources import (
    CatalogWatchingPlanSource,
    FilePlanSource,
    FleetPodSource,
    PlanSource,
    PodSource,
    StaticPlanSource,
    TemplateSources,
)
from placement.settings import RouterSettings, Settings

T = TypeVar("T")


def adapter_info_from_catalog(
    catalog: Catalog,
    fleet: Fleet | None = None,
    *,
    resolve: Callable[[AdapterId], str | None] | None = None,
) -> AdapterInfo:
    """Load paths, sizes, class weights and (given the fleet) the pool of each adapter's
    base model;
    ``resolve`` gives the source of an adapter the catalog lacks (the template's)."""
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
        resolve=resolve,
        classes={a.name: a.adapter_class.weight for a in catalog.adapters},
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
    engine_http: httpx.AsyncClient | None = None,
    clock: Clock = time.time,
    catalog_file: CatalogFile | None = None,
) -> RouterApp:
    """A ready ASGI app. ``plan`` is a path (watched), a Plan, a PlanSource, or None
    (consistent hashing only). Give ``fleet`` or a ``pod_source``. ``clock`` stamps
    the request log and times residencies (a warped clock in demos); ``engine_http``
    is the client for scrapes and loads (the router makes one if not given). Given
    ``catalog_file`` (the one ``catalog`` was read from), the router re-reads it at
    each plan poll; with ``settings.inputs.adapter_source_template``, it loads an
    adapter the catalog lacks from the template's source."""
    settings = settings or Settings()
    if pod_source is None:
        if fleet is None:
            raise ValueError("build_router needs a fleet or a pod_source")
        pod_source = FleetPodSource(fleet)
    template = settings.inputs.adapter_source_template
    resolve = TemplateSources(template, rules=settings.inputs) if template else None
    plan_source = _plan_source(plan)
    watching = None
    if catalog_file is not None:
        plan_source = watching = CatalogWatchingPlanSource(plan_source, catalog_file)
    if catalog is not None:
        adapters: AdapterInfo | None = adapter_info_from_catalog(catalog, fleet, resolve=resolve)
    else:
        adapters = AdapterInfo(resolve=resolve) if resolve is not None else None
    router = Router(
        plan_source=plan_source,
        pod_source=pod_source,
        settings=settings.router,
        load_cost=settings.load_cost,
        registry=registry,
        request_log=_sink(request_log, rotate_bytes=settings.router.log_rotate_bytes),
        plan_expected=plan is not None and settings.router.policy == "plan",
        adapters=adapters,
        engine_http=engine_http,
        clock=clock,
    )
    if watching is not None:
        watching.on_catalog = lambda fresh: router.use_adapters(
            adapter_info_from_catalog(fresh, fleet, resolve=resolve)
        )
    return RouterApp(router)


def _plan_source(plan: str | os.PathLike[str] | Plan | PlanSource | None) -> PlanSource:
    if plan is None or isinstance(plan, Plan):
        return StaticPlanSource(plan)
    if isinstance(plan, str | os.PathLike):
        return FilePlanSource(plan)
    return plan


def _sink(
    target: str | os.PathLike[str] | RequestLogSink | None, *, rotate_bytes: int
) -> RequestLogSink | None:
    if target is None:
        return None
    if isinstance(target, str | os.PathLike):
        return open_request_log(Path(target), rotate_bytes=rotate_bytes)
    return target


def free_port() -> int:
    """A port free at this moment, for a process that must be told one (Prometheus);
    ``ServedApp`` binds its own socket instead."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServedApp:
    """An ASGI app served by uvicorn in a daemon thread; a context manager.

    ``with ServedApp(app) as served: served.url`` gives ``http://127.0.0.1:<port>``;
    leaving the block shuts uvicorn down (the app's lifespan shutdown runs). The socket
    is bound here, so port 0 takes a free port without a race, and ``start`` returns
    once the app's lifespan startup is done (the first connections wait in the
    backlog until uvicorn accepts them).
    """

    def __init__(self, app: Any, *, port: int = 0, fast: bool = True) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", port))
        self._socket.listen(2048)
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._app = app
        self._ready = threading.Event()
        self._problem: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        config = uvicorn.Config(
            self._noting_startup,
            interface="asgi3",
            log_level="warning",
            access_log=False,
            lifespan="auto",
            http=RouterHttpProtocol if fast else "h11",
            loop="uvloop" if fast else "asyncio",
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _noting_startup(self, scope: Any, receive: Any, send: Any) -> None:
        """The app, noting its event loop and the end of its lifespan startup."""
        self.loop = asyncio.get_running_loop()
        if scope["type"] != "lifespan":
            await self._app(scope, receive, send)
            return

        async def noting(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "lifespan.startup.failed":
                self._problem = str(message.get("message") or "lifespan startup failed")
            await send(message)
            if message["type"] in ("lifespan.startup.complete", "lifespan.startup.failed"):
                self._ready.set()

        try:
            await self._app(scope, receive, noting)
        finally:
            self._ready.set()  # an app without a lifespan is ready once served

    def _serve(self) -> None:
        try:
            self.server.run(sockets=[self._socket])
        finally:
            self._ready.set()

    def start(self, *, timeout_s: float = 10.0) -> ServedApp:
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._problem or not self._thread.is_alive():
            self.stop()
            raise RuntimeError(f"uvicorn did not start on {self.url}: {self._problem or '?'}")
        return self

    def call(self, work: Coroutine[Any, Any, T], *, timeout_s: float = 30.0) -> T:
        """Run ``work`` on the server's event loop and wait for its result (from any
        other thread): a test's ``served.call(router.scrape_all())``."""
        assert self.loop is not None, "call() needs a started ServedApp"
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout=timeout_s)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)
        self._socket.close()

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


def freeze_started_heap() -> None:
    """Once a router process has started (its modules imported, its first rounds run):
    what it holds by then is kept out of the collector's full passes (``gc.freeze``), so
    that those, which hold the GIL while they walk the heap, walk only what came later.
    A big ``/metrics`` page's parse allocates a million objects and sets off several of
    them: the event loop's longest stall while one is parsed fell from 170-260 ms to
    35-150 ms (``bench.router_scrapes --stall --gc-freeze``). Collected first, so no
    garbage is kept; a cycle of what is frozen that dies later is never collected."""
    gc.collect()
    gc.freeze()


class _ListeningServer(uvicorn.Server):
    """A uvicorn server that, once it accepts connections, freezes the heap
    (``freeze_started_heap``) and reports the port it listens on."""

    def __init__(
        self, config: uvicorn.Config, *, on_listening: Callable[[int], None] | None
    ) -> None:
        super().__init__(config)
        self._on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.started:
            return
        freeze_started_heap()
        if self._on_listening is not None:
            self._on_listening(int(self.servers[0].sockets[0].getsockname()[1]))


class RouterWithPicker:
    """A ``RouterApp`` whose lifespan also serves the endpoint picker on ``host:port``
    (port 0: the kernel's choice, told to ``on_picker_listening``).

    The picker starts once the router's first rounds are done (it has pods and a plan
    to pick from) and stops first, its open streams given ``shutdown_grace_s``. If it
    cannot listen, the router stops again and the startup fails naming the address.
    ``transport``: the picker's gRPC server, ``"h2"`` (its own) or ``"grpc.aio"``
    (``router.picker_grpc.TRANSPORTS``).
    """

    def __init__(
        self,
        app: RouterApp,
        *,
        host: str,
        port: int,
        on_picker_listening: Callable[[int], None] | None = None,
        transport: str = "h2",
    ) -> None:
        # Here, not at the top: grpc and Envoy's protos take a third of a second to
        # import, which a router without the picker need not pay.
        from placement.router.picker_grpc import EndpointPickerServer

        self.app = app
        self.router = app.router
        self.picker = EndpointPickerServer(app.router, host=host, port=port, transport=transport)
        self._on_listening = on_picker_listening

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def receiving() -> Any:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.picker.stop(grace_s=self.router.settings.shutdown_grace_s)
            return message

        async def sending(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    port = await self.picker.start()
                except (OSError, RuntimeError) as exc:
                    await self.router.stop()
                    problem = f"endpoint picker on {self.picker.address}: {exc}"
                    await send({"type": "lifespan.startup.failed", "message": problem})
                    return
                if self._on_listening is not None:
                    self._on_listening(port)
            await send(message)

        await self.app(scope, receiving, sending)


def server_config(app: Any, settings: RouterSettings, **where: Any) -> uvicorn.Config:
    """uvicorn's settings for the router's front door (``run_router`` and each
    ``--workers`` child): the lean protocol, no headers it does not need, the client
    keep-alive and the SIGTERM grace from ``settings``; ``where`` is host and port."""
    return uvicorn.Config(
        app,
        **where,
        access_log=False,
        http=RouterHttpProtocol,  # lean: a whole answer in one send
        server_header=False,
        proxy_headers=False,  # the router reads no client address
        date_header=False,
        loop="uvloop",
        timeout_keep_alive=settings.client_keepalive_s,
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
    )


def run_router(
    app: RouterApp | RouterWithPicker,
    *,
    host: str,
    port: int,
    on_listening: Callable[[int], None] | None = None,
) -> None:
    """Serve in the foreground until interrupted (the CLI's ``lorafleet router``).

    ``on_listening`` gets the port once the router accepts connections: the one the
    kernel chose when ``port`` is 0; by then the heap is frozen (``freeze_started_heap``).
    On SIGTERM, requests in flight get
    ``shutdown_grace_s``; then the lifespan's shutdown closes the request log."""
    config = server_config(app, app.router.settings, host=host, port=port)
    server = _ListeningServer(config, on_listening=on_listening)
    server.run()  # run(), not serve(): it installs the uvloop event loop


def write_port_file(path: Path, port: int) -> None:
    """``port`` as one decimal line, whole or not at all (a reader polls for the file)."""
    write_atomically(path, f"{port}\n")
