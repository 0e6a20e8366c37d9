"""The endpoint picker as ``lorafleet router --endpoint-picker`` starts it, in the other
body mode a gateway may use, and in front of SGLang pods (whose bodies it rewrites)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import Engine

from .conftest import catalog_of, emulated, plan_of
from .processes import start_router
from .test_endpoint_picker import (
    DESTINATION,
    Gateway,
    body_chunks,
    completion,
    endpoint,
    picker_for,
    request_headers,
    transport,
)

__all__ = ["transport"]  # the fixture: the tests through picker_for run on each transport


@pytest.mark.parametrize("chosen", [None, "h2", "grpc.aio"], ids=["default", "h2", "grpc.aio"])
def test_the_router_process_serves_the_picker_on_the_port_it_writes(
    tmp_path: Path, chosen: str | None
) -> None:
    picker_file = tmp_path / "picker.port"
    with emulated(2) as pods:
        args = ["--endpoint-picker", "0", "--picker-port-file", str(picker_file)]
        args += ["--picker-transport", chosen] if chosen is not None else []
        router = start_router(tmp_path, urls=pods.urls, args=args)
        try:
            # Written before the router's own port file, which start_router waited for.
            port = int(picker_file.read_text())
            outcome = asyncio.run(Gateway(port).send(completion("base-model")))
            assert router.metric("lorafleet_requests_total", adapter="base-model", outcome="base")
            # uvicorn stops gracefully (the picker first), then re-raises the signal.
            assert router.terminate() in (0, -signal.SIGTERM)
        finally:
            router.stop()
    assert outcome.endpoints[0] in {endpoint(pods, "pod-0"), endpoint(pods, "pod-1")}
    assert outcome.status == 200
    served = chosen or "h2"
    assert f"endpoint picker (Envoy ext_proc over {served}) on 127.0.0.1:" in router.log()
    assert f"endpoint picker (Envoy ext_proc over {served}) listening on port" in router.log()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--endpoint-picker", "nine"], "expected [HOST]:PORT or PORT"),
        (["--endpoint-picker", ":70000"], "expected [HOST]:PORT or PORT"),
        (["--picker-port-file", "p.port"], "--picker-port-file needs --endpoint-picker"),
        (["--picker-transport", "h2"], "--picker-transport needs --endpoint-picker"),
        (
            ["--endpoint-picker", "0", "--picker-transport", "quic"],
            "unknown picker transport 'quic'; one of h2, grpc.aio",
        ),
    ],
    ids=["not-a-port", "port-too-large", "port-file-alone", "transport-alone", "transport"],
)
def test_the_command_refuses_a_bad_picker_address(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["router", "--fleet", "fleet.yaml", *args])
    assert result.exit_code == 2
    assert message in result.output


async def _buffered(port: int, body: bytes) -> list[Any]:
    """A gateway whose body mode is BUFFERED: each message waits for its answer."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = ext_proc_grpc.ExternalProcessorStub(channel).Process()
        headers = request_headers(body)
        headers.protocol_config.request_body_mode = processing_mode_pb2.ProcessingMode.BUFFERED
        answers = []
        for message in [headers, *body_chunks(body, 1)]:
            await call.write(message)
            answers.append(await call.read())
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
    return answers


@pytest.mark.usefixtures("transport")
def test_in_buffered_mode_the_headers_continue_and_the_endpoint_rides_on_the_body() -> None:
    with emulated(2) as pods:
        plan = plan_of({"alpha": ["pod-1"]})
        with picker_for(pods.domain, plan=plan, catalog=catalog_of(["alpha"])) as picking:
            port = picking.gateway.target.rpartition(":")[2]
            headers, body = asyncio.run(_buffered(int(port), completion("alpha")))
    assert headers == ext_proc.ProcessingResponse(request_headers=ext_proc.HeadersResponse())
    common = body.request_body.response
    [header] = common.header_mutation.set_headers
    assert (header.header.key, header.header.raw_value) == (
        DESTINATION,
        endpoint(pods, "pod-1").encode(),
    )
    assert common.clear_route_cache and not common.HasField("body_mutation")
    lb = body.dynamic_metadata.fields["envoy.lb"].struct_value
    assert lb.fields[DESTINATION].string_value == endpoint(pods, "pod-1")


@pytest.mark.usefixtures("transport")
def test_an_sglang_pod_gets_the_body_it_reads_and_its_length() -> None:
    with emulated(1, engine=Engine.SGLANG) as pods:
        catalog = catalog_of(["alpha"])
        with picker_for(pods.domain, catalog=catalog) as picking:
            outcome = picking.send(completion("alpha"))
    forwarded = json.loads(outcome.forwarded)
    assert forwarded["model"] == "base-model:alpha"  # SGLang's <base>:<adapter>
    assert outcome.headers["content-length"] == str(len(outcome.forwarded)).encode()
    assert outcome.status == 200
    assert [row.outcome for row in picking.log.rows] == ["cold_load"]


async def _out_of_order(port: int, messages: list[Any]) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = ext_proc_grpc.ExternalProcessorStub(channel).Process()
        for message in messages:
            await call.write(message)
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            for _ in range(4):  # the answers sent before the wrong message, then the error
                assert await call.read() != grpc.aio.EOF
    return failed.value


@pytest.mark.usefixtures("transport")
@pytest.mark.parametrize(
    ("messages", "words"),
    [
        (body_chunks(completion("alpha"), 1), "a request body before its headers"),
        (
            [request_headers(completion("alpha")), request_headers(completion("alpha"))],
            "request headers twice",
        ),
        (
            [request_headers(completion("alpha")), *body_chunks(completion("alpha"), 1) * 2],
            "a request body after its end",
        ),
    ],
    ids=["body-first", "headers-twice", "body-after-its-end"],
)
def test_messages_out_of_the_protocols_order_end_the_stream_naming_why(
    messages: list[Any], words: str
) -> None:
    with emulated(1) as pods, picker_for(pods.domain) as picking:
        port = int(picking.gateway.target.rpartition(":")[2])
        error = asyncio.run(_out_of_order(port, messages))
    # Once the server stopped (its handlers ended): nothing left in flight.
    assert all(state.inflight == 0 for state in picking.router.topology.pods.values())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in (error.details() or "")
