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

    .venv/bin/python -m bench.picker_latency [--pods 64] [--calls 5000] [--concurrency 1]
        [--gateway lean|grpc] [--transports] [--same-process]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

from bench.ext_proc_client import LeanExtProcClient, grpc_message
from bench.ext_proc_h2_floor import H2FloorServer
from bench.loop_server import LoopServer
from bench.routing_latency import make_topology, measure
from placement.router.core import Router
from placement.router.endpoint_picking import GatewayRequest
from placement.router.picker_calls import PROCESS
from placement.router.picker_grpc import EndpointPickerServer, RoutedAnswers, _Stream
from placement.router.picker_h2 import Call, GrpcH2Server
from placement.router.sources import StaticPlanSource
from placement.router.state import Topology, Upstream
from placement.settings import RouterSettings

DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
WARM_UP = 200


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


def body_of(adapter: str) -> bytes:
    return json.dumps({"model": adapter, "prompt": "Say hello.", "max_tokens": 16}).encode()


HEADERS = [
    (b":method", b"POST"),
    (b":path", b"/v1/completions"),
    (b"content-type", b"application/json"),
]


def stream_messages(body: bytes) -> list[Any]:
    pairs = [(k.decode(), v) for k, v in HEADERS] + [("content-length", str(len(body)).encode())]
    header_map = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in pairs]
    )
    first = ext_proc.ProcessingRequest(request_headers=ext_proc.HttpHeaders(headers=header_map))
    first.protocol_config.request_body_mode = DUPLEX
    first.protocol_config.response_body_mode = DUPLEX
    last = ext_proc.ProcessingRequest(request_body=ext_proc.HttpBody(body=body, end_of_stream=True))
    return [first, last]


def percentiles(samples_ns: list[int]) -> tuple[float, float]:
    ordered = sorted(samples_ns)
    return ordered[len(ordered) // 2] / 1e3, ordered[int(len(ordered) * 0.99)] / 1e3


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


class Floor:
    """A trivial ext_proc server with the picker's message pattern and no decision:
    one fixed endpoint for every request (grpc.aio's own cost per stream)."""

    def __init__(self) -> None:
        routed = ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse())
        fields = routed.dynamic_metadata.fields["envoy.lb"].struct_value.fields
        fields["x-gateway-destination-endpoint"].string_value = "127.0.0.1:8000"
        self.routed = routed

    async def Process(self, requests: Any, context: Any) -> None:  # noqa: N802
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            if message.WhichOneof("request") == "request_body":
                # Built by field paths, as the picker builds it (nested constructors
                # copy each sub-message: several times slower).
                echoed = ext_proc.ProcessingResponse()
                streamed = echoed.request_body.response.body_mutation.streamed_response
                streamed.body = message.request_body.body
                streamed.end_of_stream = True
                await context.write(self.routed)
                await context.write(echoed)


class SyncFloor:
    """``Floor`` for grpc's thread-pool server: the handler runs in a pool thread, the
    messages come through a request iterator, the answers are yielded."""

    def __init__(self) -> None:
        self.routed = Floor().routed

    def Process(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:  # noqa: N802
        for message in requests:
            if message.WhichOneof("request") == "request_body":
                echoed = ext_proc.ProcessingResponse()
                streamed = echoed.request_body.response.body_mutation.streamed_response
                streamed.body = message.request_body.body
                streamed.end_of_stream = True
                yield self.routed
                yield echoed


class SyncServer:
    """The trivial server on ``grpc.server`` (a thread pool), for ``--transports``."""

    def __init__(self, *, threads: int = 8) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads))
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(SyncFloor(), self.server)

    def __enter__(self) -> int:
        port = int(self.server.add_insecure_port("127.0.0.1:0"))
        self.server.start()
        return port

    def cpu_ns(self) -> int:
        """The process's CPU (the handler's threads and gRPC's; the client is elsewhere)."""
        return time.process_time_ns()

    def __exit__(self, *_: object) -> None:
        self.server.stop(1.0).wait(10)


class H2FloorCall:
    """``Floor`` as a call on the picker's own HTTP/2 server (``router.picker_h2``):
    what that server costs a stream by itself."""

    def __init__(self, call: Call, routed: bytes) -> None:
        self.call, self.routed = call, routed

    def message(self, payload: bytes) -> None:
        message = ext_proc.ProcessingRequest.FromString(payload)
        if message.WhichOneof("request") == "request_body":
            echoed = ext_proc.ProcessingResponse()
            streamed = echoed.request_body.response.body_mutation.streamed_response
            streamed.body = message.request_body.body
            streamed.end_of_stream = True
            self.call.send(self.routed)
            self.call.send(echoed.SerializeToString())

    def half_closed(self) -> None:
        self.call.end()

    def cancelled(self) -> None:
        pass


class H2Server(LoopServer):
    """The trivial server on the picker's own HTTP/2 server, for ``--transports``."""

    def __init__(self) -> None:
        super().__init__()
        routed = Floor().routed.SerializeToString()
        self.server = GrpcH2Server(
            {PROCESS: lambda call: H2FloorCall(call, routed)}, max_message_bytes=1 << 22
        )

    async def _start(self) -> int:
        return await self.server.start("127.0.0.1", 0)

    async def _stop(self) -> None:
        await self.server.stop(1.0)


class ServerThread(LoopServer):
    """A gRPC server (the picker's, or the floor's) on its own event loop (uvloop, as
    the router's loop under uvicorn is; ``uvloop=False``: asyncio's), in a thread."""

    def __init__(
        self, router: Router | None, *, use_uvloop: bool = True, transport: str = "h2"
    ) -> None:
        super().__init__(use_uvloop=use_uvloop)
        self.router = router
        self.transport = transport
        self.stop: Callable[[], Coroutine[Any, Any, None]] | None = None

    async def _start(self) -> int:
        if self.router is not None:
            picker = EndpointPickerServer(
                self.router, host="127.0.0.1", port=0, transport=self.transport
            )
            self.stop = lambda: picker.stop(grace_s=1.0)
            return await picker.start()
        server = grpc.aio.server()
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(Floor(), server)
        port = int(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        self.stop = lambda: server.stop(1.0)
        return port

    async def _stop(self) -> None:
        assert self.stop is not None
        await self.stop()


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


def run_streams(
    server: ServerThread | SyncServer | H2FloorServer | H2Server,
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


async def one_stream(stub: Any, body: bytes) -> tuple[int, int, str]:
    """Wall ns to the endpoint and to the stream's end, and the endpoint."""
    began = time.perf_counter_ns()
    call = stub.Process()
    for message in stream_messages(body):
        await call.write(message)
    headers = await call.read()
    picked = time.perf_counter_ns()
    await call.read()  # the body, sent back
    await call.done_writing()
    await call.read()  # the end
    ended = time.perf_counter_ns()
    endpoint = (
        headers.dynamic_metadata.fields["envoy.lb"]
        .struct_value.fields["x-gateway-destination-endpoint"]
        .string_value
    )
    return picked - began, ended - began, endpoint


async def grpc_streams(port: int, requests: list[str], *, concurrency: int) -> list[Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ext_proc_grpc.ExternalProcessorStub(channel)
        for adapter in requests[:WARM_UP]:  # the channel, the server's caches
            await one_stream(stub, body_of(adapter))
        gate = asyncio.Semaphore(concurrency)

        async def bounded(adapter: str) -> tuple[int, int, str]:
            async with gate:
                return await one_stream(stub, body_of(adapter))

        return list(await asyncio.gather(*(bounded(a) for a in requests)))


def streams_from_a_client_process(
    port: int, requests: list[str], *, concurrency: int, gateway: str
) -> tuple[list[tuple[int, int, str]], int]:
    """The streams sent by another process (as a gateway is): its own interpreter and
    GIL, so the server's thread shares neither with the client; and the CPU that
    process spent on them (warm-up included, as the server's figure)."""
    command = [sys.executable, "-m", "bench.picker_latency", "--client", str(port)]
    command += ["--concurrency", str(concurrency), "--gateway", gateway]
    done = subprocess.run(
        command, input=json.dumps(requests), capture_output=True, text=True, check=True
    )
    sent = json.loads(done.stdout)
    streams = [(int(a), int(b), str(c)) for a, b, c in sent["streams"]]
    return streams, int(sent["cpu_ns"])


def lean_streams(port: int, requests: list[str]) -> list[tuple[int, int, str]]:
    """The streams from ``bench.ext_proc_client``: HTTP/2 frames on a socket, what a
    C++ gateway's side costs more nearly than Python's grpc client."""
    framed = {
        name: [grpc_message(m) for m in stream_messages(body_of(name))] for name in set(requests)
    }
    client = LeanExtProcClient("127.0.0.1", port)
    try:
        for adapter in requests[:WARM_UP]:
            client.stream(framed[adapter], time.perf_counter_ns)
        streams = []
        for adapter in requests:
            times = client.stream(framed[adapter], time.perf_counter_ns)
            first = ext_proc.ProcessingResponse.FromString(times.first)
            endpoint = (
                first.dynamic_metadata.fields["envoy.lb"]
                .struct_value.fields["x-gateway-destination-endpoint"]
                .string_value
            )
            streams.append((times.first_ns, times.ended_ns, endpoint))
        return streams
    finally:
        client.close()


def client_main(port: int, concurrency: int, gateway: str) -> None:
    """``--client PORT``: the adapters (a JSON list) on stdin, the streams on stdout."""
    requests = json.loads(sys.stdin.read())
    began = time.process_time_ns()
    if gateway == "lean":
        streams = lean_streams(port, requests)
    else:
        streams = asyncio.run(grpc_streams(port, requests, concurrency=concurrency))
    print(json.dumps({"streams": streams, "cpu_ns": time.process_time_ns() - began}))


def main() -> None:
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
    args = parser.parse_args()
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

    def bare(name: str) -> object:
        return router.picker.pick(topology, name)

    measure(bare, requests[:1000])
    bare_p50, bare_p99 = measure(bare, requests)

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
    gate_p50, gate_p99 = measure_async(loop, in_process, requests)
    measure_async(loop, translated, requests[:1000])
    stream_p50, stream_p99 = measure_async(loop, translated, requests)
    loop.close()

    def streams_to(server: ServerThread | SyncServer | H2FloorServer | H2Server) -> StreamFigures:
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

    print(
        f"endpoint picker, {args.pods} pods, {len(adapters):,} adapters, {args.calls:,} "
        f"requests, {args.concurrency} stream(s) at a time, {gateway} client; us"
    )
    rows = [
        ("Picker.pick (thread CPU)", (bare_p50, bare_p99)),
        ("GatewayRequest decide+finish (thread CPU)", (gate_p50, gate_p99)),
        ("the stream's messages, no gRPC (thread CPU)", (stream_p50, stream_p99)),
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
    print(
        f"added at the median, gRPC endpoint - bare decision: {picker.picked[0] - bare_p50:.1f} "
        f"(the picker's own HTTP/2 server); on grpc.aio {on_grpc_aio.picked[0] - bare_p50:.1f}"
    )
    print(
        f"  the trivial grpc.aio server alone (the {gateway} client): {floor.picked[0]:.1f}; "
        f"the picker on grpc.aio over it: {on_grpc_aio.picked[0] - floor.picked[0]:.1f}"
    )
    figures_by_name = (
        ("picker", picker),
        ("picker on grpc.aio", on_grpc_aio),
        ("trivial grpc.aio server", floor),
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
    print(f"{picker.pods} pods picked")
    if others:
        print("the trivial server on other transports (wall to the endpoint p50 / p99; CPU per")
        print("stream of the server's process, and of the client's):")
        for name, figures in (("grpc.aio on uvloop (above)", floor), *others.items()):
            client_us = figures.client_cpu_us or 0.0
            print(
                f"  {name:32s} {figures.picked[0]:7.1f} / {figures.picked[1]:7.1f}   "
                f"server {figures.process_cpu_us:6.1f}, client {client_us:6.1f}"
            )
    if bare_picker is not None:
        print(
            f"the picker's _Stream on the bare HTTP/2 protocol (bench only): to the endpoint "
            f"p50 / p99 {bare_picker.picked[0]:.1f} / {bare_picker.picked[1]:.1f}, added at "
            f"the median {bare_picker.picked[0] - bare_p50:.1f}; CPU per stream, its loop "
            f"thread {bare_picker.server_cpu_us:.1f}"
        )


if __name__ == "__main__":
    main()
