"""Many router processes on one port: ``lorafleet router --workers N``.

The parent binds the port (port 0: the kernel picks it) with ``SO_REUSEPORT`` and forks
N workers before it starts any thread or event loop; each worker binds a listening
socket of its own to the same port and builds its own ``Router`` (its own scrapes,
ledger and loops) under uvicorn. The kernel then spreads new connections evenly over
the workers' sockets by their addresses' hash; one socket shared by all (uvicorn's own
``--workers``, and the fallback where ``SO_REUSEPORT`` is missing) hands most
connections to whichever worker wakes first. The parent's socket never listens: it
only holds the port. The parent reports the port once every worker accepts
connections, passes SIGTERM and SIGINT on to the workers, and exits when they have
(with the first failing worker's status). A parent killed outright (SIGKILL) cannot pass
a signal on: on Linux each worker asks the kernel for SIGTERM when its parent dies.

Agreement without talking: each worker learns what the others loaded from the pods
themselves. A load of a name the pod has already loaded is answered "already loaded"
by the engine (vLLM's and SGLang's per-name lock serialises the two loads), so a cold
adapter is loaded once per pod however many workers ask; the worker that was told
"already loaded" applies the load to its ledger and reads the pod's ``/v1/models``
at its next scrape (``Router`` does both).

A worker's request log must not share a file with another's: worker 0 writes to the
path given, worker i to ``worker_log_path(path, i)``
(``placement.adapters.request_log_files``, where the controller's reader finds them).

One scrape for all: worker 0 scrapes the pods and writes what it learnt (health, parsed
metrics, listings) into a directory the parent made; the others apply it on their own
scrape rounds instead of reading the pods, and scrape themselves only when it is
missing, unreadable or stale (``router.shared_scrapes``).

Connections kept even: a worker holding more than its share of the open client
connections closes some, so that the kernel hands them to the others
(``router.connection_balance``); its main loop compares the counts every ``TICK_S``.

One ``/metrics`` for all: a Prometheus scrape reaches whichever worker the kernel picks,
so each worker writes its figures to files of its own in a directory the parent made
(``router.metrics.record_in``) and renders every worker's (``RouterMetrics.share``):
counters summed over the workers, exited ones included, gauges folded per gauge. The
parent removes an exited worker's gauges, and the directory when it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn

from placement.router.asgi import RouterApp
from placement.router.connection_balance import BalancedApp, ConnectionCounts
from placement.router.load_claims import LoadClaims, WorkerPicker
from placement.router.metrics import forget_worker, record_in
from placement.router.shared_scrapes import ScrapeFollower, ScrapePublisher, stale_after_s
from placement.router.wiring import freeze_started_heap, server_config

REUSE_PORT = hasattr(socket, "SO_REUSEPORT")


def bind(host: str, port: int, *, listen: bool) -> socket.socket:
    """A socket on ``host:port`` (port 0: the kernel picks one), in the port's
    ``SO_REUSEPORT`` group where the platform has one; listening or only holding it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if REUSE_PORT:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
    return sock


#: How often a worker's main loop wakes (uvicorn's own wakes every 0.1 s): to compare
#: its connections with the other workers'. A signal to exit wakes it at once.
TICK_S = 0.5


class _Worker(uvicorn.Server):
    """uvicorn on the inherited socket, telling the parent once it accepts connections
    (its heap frozen by then: ``wiring.freeze_started_heap``); its main loop wakes every
    ``TICK_S`` (or at a signal) and keeps the connections even (``balance``) instead of
    waking ten times a second."""

    def __init__(
        self, config: uvicorn.Config, *, ready_fd: int, balance: BalancedApp | None
    ) -> None:
        super().__init__(config)
        self._ready_fd = ready_fd
        self._balance = balance
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            freeze_started_heap()
            os.write(self._ready_fd, b"1")
            os.close(self._ready_fd)

    async def main_loop(self) -> None:
        self._wake, self._loop = asyncio.Event(), asyncio.get_running_loop()
        ticks = 0  # in uvicorn's tenths of a second: each call refreshes its headers
        should_exit = await self.on_tick(ticks)
        while not should_exit:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            ticks = (ticks + 10) % 864000
            should_exit = await self.on_tick(ticks)
            if self._balance is not None:
                self._balance.rebalance(len(self.server_state.connections))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)


def share_loads(app: RouterApp, claims_dir: Path, *, workers: int, worker: int = 0) -> None:
    """Make ``app`` worker ``worker`` of ``workers``: its cold loads follow the workers'
    claims in ``claims_dir``, its victims are weighed by the router's rates, and only
    worker 0 records the pods' residency (every worker sees the same evictions). A claim
    lasts two listing periods: by then every worker's listing shows the adapter."""
    router = app.router
    router.scraper.observes_residency = worker == 0
    settings = router.settings
    ttl_s = 2.0 * settings.scrape_interval_s * settings.listing_every_scrapes
    claims = LoadClaims(claims_dir, ttl_s=ttl_s)
    router.picker = WorkerPicker(router.picker, claims, workers=workers)


def share_scrapes(app: RouterApp, directory: Path, *, worker: int) -> None:
    """Make ``app``'s scrape rounds worker ``worker``'s: worker 0 scrapes and publishes
    into ``directory``, the others follow it (and scrape themselves when it is stale).
    A snapshot's age is read on the system's clock, not the router's, which
    ``--clock-speed`` may run faster than the scrape rounds."""
    router = app.router
    if worker == 0:
        router.scrape_share = ScrapePublisher(directory, scraper=router.scraper, clock=time.time)
        return
    settings = router.settings
    router.scrape_share = ScrapeFollower(
        directory,
        scraper=router.scraper,
        clock=time.time,
        stale_after_s=stale_after_s(
            scrape_interval_s=settings.scrape_interval_s,
            scrape_timeout_s=settings.scrape_timeout_s,
        ),
    )


def _run_worker(
    app: RouterApp, sock: socket.socket, ready_fd: int, *, balance: BalancedApp | None = None
) -> None:
    """Serve ``app`` (through ``balance`` if given) on ``sock`` until a signal ends uvicorn."""
    config = server_config(balance if balance is not None else app, app.router.settings)
    _Worker(config, ready_fd=ready_fd, balance=balance).run(sockets=[sock])


def serve_workers(
    make_app: Callable[[int], RouterApp],
    *,
    host: str,
    port: int,
    workers: int,
    on_listening: Callable[[int], None] | None = None,
) -> int:
    """Fork ``workers`` processes serving ``make_app(i)`` on one socket; wait for them.

    Returns the exit status: 0 when every worker ended cleanly. ``make_app`` runs in
    the worker, after the fork, so that no two workers share a client or a loop.
    """
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, not {workers}")
    held = bind(host, port, listen=not REUSE_PORT)
    shared = _Shared.make(workers) if workers > 1 else None
    try:
        return _fork_and_wait(
            make_app, held, host=host, workers=workers, shared=shared,
            on_listening=on_listening,
        )  # fmt: skip
    finally:
        if shared is not None:
            shared.remove()


@dataclass(frozen=True)
class _Shared:
    """What the workers share: the directories of load claims, every worker's metrics,
    and worker 0's scrapes; and every worker's count of client connections."""

    claims: Path
    metrics: Path
    scrapes: Path
    connections: ConnectionCounts

    @classmethod
    def make(cls, workers: int) -> _Shared:
        # In memory where the system has a tmpfs: worker 0 replaces its scrape snapshot
        # every round, and on ext4 a rename over a file flushes the new one to disk
        # (2.4 ms of the event loop's wall time each, against 22 us on tmpfs).
        # Named by the parent's pid: a parent killed outright cannot remove them, and
        # whoever cleans up after it (a test) can tell its directories from others'.
        memory, pid = _memory_dir(), os.getpid()
        claims = Path(tempfile.mkdtemp(prefix=f"lorafleet-claims-{pid}-", dir=memory))
        metrics = Path(tempfile.mkdtemp(prefix=f"lorafleet-metrics-{pid}-", dir=memory))
        scrapes = Path(tempfile.mkdtemp(prefix=f"lorafleet-scrapes-{pid}-", dir=memory))
        return cls(claims, metrics, scrapes, ConnectionCounts(workers))

    def remove(self) -> None:
        for directory in (self.claims, self.metrics, self.scrapes):
            shutil.rmtree(directory, ignore_errors=True)


def _memory_dir() -> str | None:
    """``/dev/shm`` where it is a directory this process may write in; None: the
    system's temporary directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _end_with(parent: int) -> None:
    """SIGTERM to this worker when ``parent`` dies, however it dies (Linux's
    ``PR_SET_PDEATHSIG``; elsewhere the parent's signals only)."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request took hold
        os.kill(os.getpid(), signal.SIGTERM)


def _fork_and_wait(
    make_app: Callable[[int], RouterApp],
    held: socket.socket,
    *,
    host: str,
    workers: int,
    shared: _Shared | None,
    on_listening: Callable[[int], None] | None,
) -> int:
    bound = int(held.getsockname()[1])
    ready_read, ready_write = os.pipe()
    children: list[int] = []
    parent = os.getpid()
    for worker in range(workers):
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            os.close(ready_read)
            status = 0
            try:
                _end_with(parent)
                sock = held
                if REUSE_PORT:  # a listening socket of this worker's own
                    sock = bind(host, bound, listen=True)
                    held.close()
                if shared is not None:
                    record_in(shared.metrics)  # before make_app creates any metric
                app = make_app(worker)
                balance = None
                if shared is not None:
                    share_loads(app, shared.claims, workers=workers, worker=worker)
                    share_scrapes(app, shared.scrapes, worker=worker)
                    app.router.metrics.share(shared.metrics)
                    balance = BalancedApp(app, shared.connections, worker)
                _run_worker(app, sock, ready_write, balance=balance)
            except BaseException:
                traceback.print_exc()
                status = 1
            finally:
                sys.stderr.flush()
                os._exit(status)
        children.append(pid)
    os.close(ready_write)
    _forward_signals(children)
    ready = 0
    while ready < workers:
        got = os.read(ready_read, workers - ready)
        if not got:  # every worker closed its end: at least one died starting
            break
        ready += len(got)
    os.close(ready_read)
    held.close()  # the workers' sockets hold the port now
    if ready == workers and on_listening is not None:
        on_listening(bound)
    return _wait_all(children, shared.metrics if shared is not None else None)


def _terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def _forward_signals(children: list[int]) -> None:
    forwarded = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal forwarded
        if forwarded:  # a second signal: the workers got one already
            return
        forwarded = True
        for pid in children:
            _terminate(pid)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)


def _wait_all(children: list[int], metrics_dir: Path | None) -> int:
    status = 0
    left = set(children)
    while left:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            break
        if pid in left:
            left.discard(pid)
            if metrics_dir is not None:
                forget_worker(metrics_dir, pid)
            exit_code = os.waitstatus_to_exitcode(code)
            if exit_code not in (0, -signal.SIGTERM, -signal.SIGINT) and status == 0:
                status = exit_code if exit_code > 0 else 1
                for other in left:  # one worker failed: end the others
                    _terminate(other)
    return status
