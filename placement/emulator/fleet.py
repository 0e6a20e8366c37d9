"""Many emulated pods in one process: in-process for tests, or on real sockets.

- ``build_pod(config)`` is the app factory: one ``EmulatedPod`` and its FastAPI app.
- ``EmulatedFleet.start(n, engine=..., base_port=...)`` builds ``n`` pods named
  ``pod-0..`` at ``http://127.0.0.1:<base_port + i>`` (or at ``ports=``, those of
  sockets ``listening_sockets`` bound); ``fleet.http()`` is an
  ``httpx.AsyncClient`` whose transport dispatches by host and port to the apps
  in-process (no socket), answering a dead pod with a refused connection;
  ``fleet.domain()`` is the matching ``placement.domain.Fleet`` for planners and
  executors.
- ``serve_fleet`` runs the apps on real sockets with uvicorn (``lorafleet emulate``),
  and ``serving_in_thread`` does so from a background thread for tests and benches
  that need real HTTP. Both take the sockets ``listening_sockets(n)`` bound on port 0,
  so no pod ever binds a port that a scan found free and another process took since.

Only 127.0.0.1 is ever bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from placement.domain import Engine, Fleet, Pod, PodId, Pool, PoolId
from placement.emulator.config import PodConfig
from placement.emulator.pod import EmulatedPod, Sleep
from placement.emulator.sglang_app import create_sglang_app
from placement.emulator.vllm_app import create_vllm_app
from placement.sizing import BUILTIN_MODELS

HOST = "127.0.0.1"
DEFAULT_BASE_PORT = 18000

#: Dimensions that only name the base model (emulated pods do not size adapters):
#: Llama-3.1-8B's, under the name the emulated pods serve.
EMULATED_DIMS = replace(BUILTIN_MODELS["llama-3.1-8b"], name="base-model")


@dataclass(frozen=True, kw_only=True)
class PodHandle:
    """One emulated pod: its state (for assertions) and its ASGI app."""

    pod: EmulatedPod
    app: FastAPI
    url: str

    @property
    def name(self) -> PodId:
        return PodId(self.pod.config.name)


def listening_sockets(count: int, *, base_port: int = 0) -> list[socket.socket]:
    """``count`` listening sockets on 127.0.0.1, bound here so that the ports are ours
    before any pod is built: base port 0 lets the kernel give each its own free port;
    another base binds ``base_port + i`` (an OSError if one is taken). On any failure
    the sockets bound so far are closed."""
    sockets: list[socket.socket] = []
    try:
        for i in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, base_port + i if base_port else 0))
            sock.listen(2048)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def ports_of(sockets: Sequence[socket.socket]) -> list[int]:
    """The port each socket is bound to, for ``EmulatedFleet.start(ports=...)``."""
    return [int(sock.getsockname()[1]) for sock in sockets]


def build_pod(
    config: PodConfig,
    *,
    url: str = f"http://{HOST}:{DEFAULT_BASE_PORT}",
    clock: Callable[[], float] = time.monotonic,
    sleep: Sleep = asyncio.sleep,
) -> PodHandle:
    """The app factory: an emulated pod speaking ``config.engine``'s dialect; ``clock`` and
    ``sleep`` are the pod's time (tests pass a manual clock and a sleep that moves it)."""
    problems = config.problems()
    if problems:
        raise ValueError(f"{config.name}: " + "; ".join(problems))
    pod = EmulatedPod(config, clock=clock, sleep=sleep)
    factory = create_sglang_app if config.engine is Engine.SGLANG else create_vllm_app
    return PodHandle(pod=pod, app=factory(pod), url=url)


class FleetTransport(httpx.AsyncBaseTransport):
    """Dispatches each request to the emulated pod at its host and port, in-process."""

    def __init__(self, handles: Sequence[PodHandle]) -> None:
        self._by_address = {
            httpx.URL(handle.url).netloc.decode(): (handle, httpx.ASGITransport(app=handle.app))
            for handle in handles
        }

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        entry = self._by_address.get(request.url.netloc.decode())
        if entry is None or entry[0].pod.is_down():
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return await entry[1].handle_async_request(request)


@dataclass(frozen=True, kw_only=True)
class EmulatedFleet:
    """N emulated pods of one engine, as handles, a transport and a domain ``Fleet``."""

    handles: tuple[PodHandle, ...]
    engine: Engine
    served_model_name: str

    @classmethod
    def start(
        cls,
        n: int,
        *,
        engine: Engine = Engine.VLLM,
        base_port: int = DEFAULT_BASE_PORT,
        ports: Sequence[int] | None = None,
        config: PodConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> EmulatedFleet:
        """``n`` pods at ``base_port + i``, or at ``ports[i]`` when given (the ports of
        sockets bound beforehand, to serve them on)."""
        if ports is not None and len(ports) != n:
            raise ValueError(f"{n} pods need {n} ports, got {len(ports)}")
        chosen = list(ports) if ports is not None else [base_port + i for i in range(n)]
        template = replace(config or PodConfig(), engine=engine)
        handles = tuple(
            build_pod(
                replace(template, name=f"pod-{i}", seed=template.seed + i),
                url=f"http://{HOST}:{port}",
                clock=clock,
                sleep=sleep,
            )
            for i, port in enumerate(chosen)
        )
        return cls(handles=handles, engine=engine, served_model_name=template.served_model_name)

    def transport(self) -> FleetTransport:
        return FleetTransport(self.handles)

    def http(self, **kwargs: Any) -> httpx.AsyncClient:
        """An AsyncClient reaching every pod in-process (close it when done)."""
        return httpx.AsyncClient(transport=self.transport(), **kwargs)

    def pod(self, name: str) -> EmulatedPod:
        return next(handle.pod for handle in self.handles if handle.name == name)

    def domain(self, *, pool: str = "emulated", hbm_adapter_bytes: int = 2**31) -> Fleet:
        """The ``Fleet`` these pods form: one pool, limits taken from each pod's config, and
        the storage of the first."""
        pods = tuple(
            Pod(
                name=handle.name,
                pool=PoolId(pool),
                url=handle.url,
                engine=self.engine,
                max_loras=handle.pod.config.max_loras,
                max_cpu_loras=handle.pod.config.cpu_slots,
                max_lora_rank=handle.pod.config.max_lora_rank,
                hbm_adapter_bytes=hbm_adapter_bytes,
                host_adapter_bytes=hbm_adapter_bytes * 8,
                capacity_rps=10.0,
            )
            for handle in self.handles
        )
        first = self.handles[0].pod.config if self.handles else PodConfig()
        return Fleet(
            pools=(
                Pool(
                    name=PoolId(pool),
                    base_model=self.served_model_name,
                    served_model_name=self.served_model_name,
                    engine=self.engine,
                    max_lora_rank=first.max_lora_rank,
                    dims=EMULATED_DIMS,
                    pods=pods,
                    storage=first.storage,
                ),
            )
        )


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the caller (many run in one process)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _servers(handles: Sequence[PodHandle]) -> list[_Server]:
    return [
        _Server(
            uvicorn.Config(
                handle.app,
                host=HOST,
                port=httpx.URL(handle.url).port or DEFAULT_BASE_PORT,
                log_level="warning",
                lifespan="off",
            )
        )
        for handle in handles
    ]


_WATCH_S = 0.05


def _checked_sockets(
    handles: Sequence[PodHandle], sockets: Sequence[socket.socket] | None
) -> list[socket.socket | None]:
    if sockets is None:
        return [None] * len(handles)
    ports = ports_of(sockets)
    wanted = [httpx.URL(handle.url).port for handle in handles]
    if ports != wanted:
        raise ValueError(f"the pods' ports {wanted} are not the sockets' {ports}")
    return list(sockets)


def _serving(server: _Server, sock: socket.socket | None) -> asyncio.Task[None]:
    return asyncio.create_task(server.serve(sockets=[sock] if sock is not None else None))


async def serve_fleet(
    handles: Sequence[PodHandle],
    *,
    stop: asyncio.Event | None = None,
    sockets: Sequence[socket.socket] | None = None,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve every pod on its own port until ``stop`` is set (or forever).

    ``sockets`` (from ``listening_sockets``, in the order of ``handles``) are served
    as they are; without them each pod binds the port of its URL. ``on_listening``
    runs once, when every pod accepts connections. A pod killed through
    ``/admin/fault`` (``down_s``) closes its port until it comes back empty, on the
    same port, so callers see refused connections as with a dead process.
    """
    stop = stop or asyncio.Event()
    given = _checked_sockets(handles, sockets)
    servers = _servers(handles)
    tasks: list[asyncio.Task[None] | None] = [
        _serving(server, sock) for server, sock in zip(servers, given, strict=True)
    ]
    while not stop.is_set():
        if on_listening is not None and all(server.started for server in servers):
            on_listening()
            on_listening = None
        for i, handle in enumerate(handles):
            task, down = tasks[i], handle.pod.is_down()
            if down and task is not None:
                servers[i].should_exit = True
                await task
                tasks[i] = None
            elif not down and task is None:
                # The socket closed with the server; the pod comes back on its own port.
                servers[i] = _servers([handle])[0]
                tasks[i] = _serving(servers[i], None)
        await asyncio.sleep(_WATCH_S)
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*(task for task in tasks if task is not None), return_exceptions=True)


@contextlib.contextmanager
def serving_in_thread(
    handles: Sequence[PodHandle],
    *,
    sockets: Sequence[socket.socket] | None = None,
    start_timeout_s: float = 10.0,
) -> Iterator[None]:
    """Serve the pods on real sockets from a background thread while the block runs;
    ``sockets`` as for ``serve_fleet`` (they are closed when the block ends)."""
    given = _checked_sockets(handles, sockets)
    servers = _servers(handles)
    loop = asyncio.new_event_loop()

    async def main() -> None:
        await asyncio.gather(
            *(
                server.serve(sockets=[sock] if sock is not None else None)
                for server, sock in zip(servers, given, strict=True)
            )
        )

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not all(server.started for server in servers):
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("emulated pods did not start (is a port in use?)")
            time.sleep(0.01)
        yield
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(timeout=start_timeout_s)
        if not thread.is_alive():
            loop.close()
        for sock in sockets or ():
            sock.close()
