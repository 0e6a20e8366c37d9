"""The gateway's side of ``bench.picker_latency``: the ext_proc streams a gateway sends.

One request's two messages (headers, then the body) as an Envoy gateway in
FULL_DUPLEX_STREAMED mode sends them, and the streams of a run: from Python's
``grpc.aio`` client (``grpc_streams``, in this process or another) or from
``bench.ext_proc_client``'s lean HTTP/2 frames (``lean_streams``), each stream timed
from the first write to the endpoint read and to the stream's end. The client process
is ``bench.picker_latency --client PORT`` (``client_main``). This module starts no
server and prints no report.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc

from bench.ext_proc_client import LeanExtProcClient, grpc_message

DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
WARM_UP = 200


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
