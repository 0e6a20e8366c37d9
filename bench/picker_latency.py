"""The endpoint picker's decision over gRPC against the bare decision, in one run
(target: at most 200 us added at the median).

One topology (``bench.routing_latency.make_topology``: vLLM pods, 2,000 adapters, half
hot on two pods by the plan, live queues), one ``Router`` holding it (its loops not
started: nothing scrapes, every pod stays healthy), requests drawing adapters uniformly:

1. ``Picker.pick``: the bare decision, thread CPU time (as ``bench.routing_latency``);
2. ``GatewayRequest``: what the picker does per request without the transport: the
   front door (JSON, names), the pick, the fallback, the admission into the ledger and
   the log row; thread CPU time;
3. the picker's ``_Stream`` without gRPC: a stream's two messages translated, decided
   and answered, the answers serialized as gRPC would; thread CPU time;
4. gRPC: one ext_proc stream per request to the picker's server (its own thread and
   event loop): its own HTTP/2 server (``router.picker_h2``, the default), and again on
   ``grpc.aio`` (``transport="grpc.aio"``), each as a gateway in FULL_DUPLEX_STREAMED
   mode drives it: headers, body, then the headers' and the body's answers, then the
   close; wall time from the first write to the endpoint read (what the gateway waits
   before it can send), and from the first write to the stream's end. The client is another process,
   as a gateway is: by default ``bench.ext_proc_client``, HTTP/2 frames on a socket
   (about 60-130 us of CPU a stream, nearer what Envoy's C++ side costs); with
   ``--gateway grpc`` Python's grpc.aio client, which costs more CPU per stream
   (580-770 us) than the server it measures, on the same two cores. ``--same-process``:
   the grpc.aio client in a thread of this process, sharing the server's GIL, as this
   bench did first. Streams run one at a time, or ``--concurrency`` at once (grpc.aio
   client only; then per-stream wall times include queueing);
5. the same streams against a trivial ext_proc server (the same messages, one fixed
   endpoint, no decision): what the transport and the client cost by themselves;
   ``--transports`` also runs it on grpc.aio over asyncio's own loop and on
   ``grpc.server`` (a thread pool of 8, the handler reading a request iterator), on the
   picker's own HTTP/2 server (``router.picker_h2``, what it costs by itself), and
   (lean client only) as ``bench.ext_proc_h2_floor``: the same answers from a bare
   HTTP/2 protocol on uvloop, no gRPC library (not deployable: no HPACK decoding, no
   flow control), for what a stream costs without grpc's C-core; and the picker's own
   ``_Stream`` (translation, decision, answers) over that bare protocol: what the
   picker would cost on a transport that costs next to nothing.

"added" is the gRPC endpoint latency's p50 minus the bare decision's p50, for both
transports, with the trivial grpc.aio server's own beside it. CPU per stream, split by
where it is spent: the server's event-loop thread (``pthread_getcpuclockid``), the
server's whole process (gRPC's own threads too), and the client's process. Unlike CPU
time, wall time counts the preemption a shared machine adds: run it on a quiet one, or
several times. One stream at a time, the server's thread sleeps between streams and
wakes to cold caches: the same Python work costs it 1.5-3 times what the in-process
lines (1-3), run back to back, show.

The servers are ``bench.picker_servers``'s, the gateway's streams
``bench.picker_gateway``'s; this module measures and reports.

    .venv/bin/python -m bench.picker_latency [--pods 64] [--calls 5000] [--concurrency 1]
        [--gateway lean|grpc] [--transports] [--same-process]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bench.ext_proc_h2_floor import H2FloorServer
from bench.picker_gateway import (
    HEADERS,
    WARM_UP,
    body_of,
    client_main,
    grpc_streams,
    percentiles,
    stream_messages,
    streams_from_a_client_process,
)
from bench.picker_servers import Floor, H2Server, ServerThread, SyncServer
from bench.routing_latency import make_topology, measure
from placement.router.core import Router
from placement.router.endpoint_picking import GatewayRequest
from placement.router.picker_grpc import RoutedAnswers, _Stream
from placement.router.sources import StaticPlanSource
from placement.router.state import Topology, Upstream
from placement.settings import RouterSettings


class _NoPods:
    description = "bench"

    async def upstreams(self) -> tuple[Upstream, ...]:
        return ()


def make_router(topology: Topology) -> Router:
    router = Router(
        plan_source=StaticPlanSource(topology.plan),
        pod_source=_NoPods(),
        settings=RouterSettings(max_pending_log_rows=10**7),
    )
    router.topology = topology
    return router


def measure_async(
    loop: asyncio.AbstractEventLoop,
    decide: Callable[[str], Awaitable[object]],
    requests: list[str],
) -> tuple[float, float]:
    """p50 and p99 of thread CPU time around each awaited decision (none of them waits)."""
    samples: list[int] = []

    async def run() -> None:
        clock = time.thread_time_ns
        for adapter in requests:
            began = clock()
            await decide(adapter)
            samples.append(clock() - began)

    loop.run_until_complete(run())
    return percentiles(samples)


@dataclass(frozen=True)
class StreamFigures:
    picked: tuple[float, float]
    ended: tuple[float, float]
    #: CPU per stream: the server's event-loop thread, and the whole process.
    server_cpu_us: float
    process_cpu_us: float
    #: The client process's CPU per stream (None: the client ran in the server's).
    client_cpu_us: float | None
    pods: int


#: What ``run_streams`` sends to: each enters to its port and reads its CPU.
StreamServer = ServerThread | SyncServer | H2FloorServer | H2Server


def run_streams(
    server: StreamServer,
    requests: list[str],
    *,
    concurrency: int,
    client_process: bool,
    gateway: str,
) -> StreamFigures:
    with server as port:
        cpu_began, server_began = time.process_time_ns(), server.cpu_ns()
        client_ns: int | None = None
        if client_process:
            streams, client_ns = streams_from_a_client_process(
                port, requests, concurrency=concurrency, gateway=gateway
            )
        else:
            streams = asyncio.run(grpc_streams(port, requests, concurrency=concurrency))
        cpu_ns = time.process_time_ns() - cpu_began
        server_ns = server.cpu_ns() - server_began
    each = len(streams) + WARM_UP
    return StreamFigures(
        picked=percentiles([s[0] for s in streams]),
        ended=percentiles([s[1] for s in streams]),
        server_cpu_us=server_ns / each / 1e3,
        process_cpu_us=cpu_ns / each / 1e3,
        client_cpu_us=None if client_ns is None else client_ns / each / 1e3,
        pods=len({s[2].split(",")[0] for s in streams}),
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=64)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--same-process",
        action="store_true",
        help="the gRPC client in this process (a thread away from the server), as before",
    )
    parser.add_argument(
        "--gateway",
        choices=("lean", "grpc"),
        default="lean",
        help="the client process: lean HTTP/2 frames (bench.ext_proc_client; one stream "
        "at a time) or Python's grpc.aio client",
    )
    parser.add_argument(
        "--transports",
        action="store_true",
        help="also the trivial server on grpc.aio over asyncio's loop and on grpc.server "
        "(a thread pool)",
    )
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    return parser.parse_args()


Percentiles = tuple[float, float]


def _bare_pick(router: Router, topology: Topology, requests: list[str]) -> Percentiles:
    """Line 1: ``Picker.pick`` alone, thread CPU time."""

    def bare(name: str) -> object:
        return router.picker.pick(topology, name)

    measure(bare, requests[:1000])
    return measure(bare, requests)


def _without_grpc(router: Router, requests: list[str]) -> tuple[Percentiles, Percentiles]:
    """Lines 2 and 3: ``GatewayRequest`` decide and finish, and one stream's messages
    through the picker's ``_Stream``; thread CPU time, each after a warm-up."""

    async def in_process(name: str) -> object:
        request = GatewayRequest(router, HEADERS, path="/v1/completions")
        decision = await request.decide(body_of(name))
        request.response_status(200)
        request.finish()
        return decision

    routes = RoutedAnswers()
    messages = {name: stream_messages(body_of(name)) for name in set(requests)}

    async def translated(name: str) -> object:
        """One stream's messages through the picker's ``_Stream``, without gRPC: the
        translation, the decision, and the answers serialized as gRPC would."""
        stream = _Stream(router, routes)
        first, last = messages[name]
        stream.note(first)
        answers = stream.answer(first)
        stream.note(last)
        answers += await stream.body(last.request_body)
        for answer in answers:
            answer.SerializeToString()
        stream.finish()
        return answers

    loop = asyncio.new_event_loop()
    measure_async(loop, in_process, requests[:1000])
    gate = measure_async(loop, in_process, requests)
    measure_async(loop, translated, requests[:1000])
    stream = measure_async(loop, translated, requests)
    loop.close()
    return gate, stream


@dataclass(frozen=True, kw_only=True)
class _StreamRuns:
    """Lines 4 and 5: the streams to each server."""

    floor: StreamFigures
    on_grpc_aio: StreamFigures
    picker: StreamFigures
    #: ``--transports``: the trivial server on the other transports, by name.
    others: dict[str, StreamFigures]
    #: ``--transports`` with the lean client: the picker's ``_Stream`` on bare HTTP/2.
    bare_picker: StreamFigures | None


def _stream_runs(
    router: Router,
    requests: list[str],
    *,
    args: argparse.Namespace,
    client_process: bool,
    gateway: str,
) -> _StreamRuns:
    def streams_to(server: StreamServer) -> StreamFigures:
        return run_streams(
            server,
            requests,
            concurrency=args.concurrency,
            client_process=client_process,
            gateway=gateway,
        )

    floor = streams_to(ServerThread(None))
    on_grpc_aio = streams_to(ServerThread(router, transport="grpc.aio"))
    picker = streams_to(ServerThread(router))
    others = {}
    bare_picker: StreamFigures | None = None
    if args.transports:
        others["grpc.aio on asyncio's loop"] = streams_to(ServerThread(None, use_uvloop=False))
        others["grpc.server, 8 threads"] = streams_to(SyncServer())
        others["picker_h2, the picker's own"] = streams_to(H2Server())
        if gateway == "lean":
            h2_floor = H2FloorServer(Floor().routed)
            others["bare HTTP/2, no gRPC (bench only)"] = streams_to(h2_floor)
            bare_picker = streams_to(H2FloorServer(Floor().routed, router))
    return _StreamRuns(
        floor=floor,
        on_grpc_aio=on_grpc_aio,
        picker=picker,
        others=others,
        bare_picker=bare_picker,
    )


def _print_latencies(
    runs: _StreamRuns, *, bare: Percentiles, gate: Percentiles, stream: Percentiles, gateway: str
) -> None:
    picker, on_grpc_aio, floor = runs.picker, runs.on_grpc_aio, runs.floor
    rows = [
        ("Picker.pick (thread CPU)", bare),
        ("GatewayRequest decide+finish (thread CPU)", gate),
        ("the stream's messages, no gRPC (thread CPU)", stream),
        ("gRPC to the endpoint, picker (wall)", picker.picked),
        ("gRPC to the endpoint, picker on grpc.aio (wall)", on_grpc_aio.picked),
        ("gRPC to the endpoint, trivial grpc.aio server (wall)", floor.picked),
        ("gRPC to the stream's end, picker (wall)", picker.ended),
        ("gRPC to the stream's end, picker on grpc.aio (wall)", on_grpc_aio.ended),
        ("gRPC to the stream's end, trivial grpc.aio (wall)", floor.ended),
    ]
    print(f"{'':52s} {'p50':>8s} {'p99':>8s}")
    for label, (p50, p99) in rows:
        print(f"{label:52s} {p50:8.1f} {p99:8.1f}")
    bare_p50 = bare[0]
    print(
        f"added at the median, gRPC endpoint - bare decision: {picker.picked[0] - bare_p50:.1f} "
        f"(the picker's own HTTP/2 server); on grpc.aio {on_grpc_aio.picked[0] - bare_p50:.1f}"
    )
    print(
        f"  the trivial grpc.aio server alone (the {gateway} client): {floor.picked[0]:.1f}; "
        f"the picker on grpc.aio over it: {on_grpc_aio.picked[0] - floor.picked[0]:.1f}"
    )


def _print_cpu(runs: _StreamRuns) -> None:
    figures_by_name = (
        ("picker", runs.picker),
        ("picker on grpc.aio", runs.on_grpc_aio),
        ("trivial grpc.aio server", runs.floor),
    )
    for name, figures in figures_by_name:
        client = (
            " (the client's included)"
            if figures.client_cpu_us is None
            else f", the client's process {figures.client_cpu_us:.1f}"
        )
        print(
            f"CPU per stream, {name}: its event-loop thread {figures.server_cpu_us:.1f}, "
            f"the server's process {figures.process_cpu_us:.1f}{client}"
        )
    print(f"{runs.picker.pods} pods picked")


def _print_transports(runs: _StreamRuns, *, bare_p50: float) -> None:
    if runs.others:
        print("the trivial server on other transports (wall to the endpoint p50 / p99; CPU per")
        print("stream of the server's process, and of the client's):")
        for name, figures in (("grpc.aio on uvloop (above)", runs.floor), *runs.others.items()):
            client_us = figures.client_cpu_us or 0.0
            print(
                f"  {name:32s} {figures.picked[0]:7.1f} / {figures.picked[1]:7.1f}   "
                f"server {figures.process_cpu_us:6.1f}, client {client_us:6.1f}"
            )
    bare_picker = runs.bare_picker
    if bare_picker is not None:
        print(
            f"the picker's _Stream on the bare HTTP/2 protocol (bench only): to the endpoint "
            f"p50 / p99 {bare_picker.picked[0]:.1f} / {bare_picker.picked[1]:.1f}, added at "
            f"the median {bare_picker.picked[0] - bare_p50:.1f}; CPU per stream, its loop "
            f"thread {bare_picker.server_cpu_us:.1f}"
        )


def main() -> None:
    args = _arguments()
    if args.client is not None:
        client_main(args.client, args.concurrency, args.gateway)
        return
    client_process = not args.same_process
    gateway = "grpc" if args.same_process or args.concurrency > 1 else args.gateway
    rng = random.Random(0)
    adapters = [f"a{i}" for i in range(2000)]
    topology = make_topology(args.pods, adapters, rng)
    requests = [rng.choice(adapters) for _ in range(args.calls)]
    router = make_router(topology)
    bare = _bare_pick(router, topology, requests)
    gate, stream = _without_grpc(router, requests)
    runs = _stream_runs(router, requests, args=args, client_process=client_process, gateway=gateway)
    print(
        f"endpoint picker, {args.pods} pods, {len(adapters):,} adapters, {args.calls:,} "
        f"requests, {args.concurrency} stream(s) at a time, {gateway} client; us"
    )
    _print_latencies(runs, bare=bare, gate=gate, stream=stream, gateway=gateway)
    _print_cpu(runs)
    _print_transports(runs, bare_p50=bare[0])


if __name__ == "__main__":
    main()
