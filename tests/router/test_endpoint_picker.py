"""The router as a Gateway API endpoint picker, driven over gRPC as a gateway drives it.

Every test runs on each of the picker's transports (its own HTTP/2 server and
grpc.aio). A ``Gateway`` here does what Envoy does with an InferencePool's picker in
``FULL_DUPLEX_STREAMED`` mode: one ``Process`` stream per request over a real
``grpc.aio`` channel (the picker on port 0 in the router's process), request headers,
the body in chunks, then the request sent to the endpoint the picker named (the next
one in its list if that fails, as the gateway's retry does) on emulated vLLM pods, and
the pod's answer reported back on the stream (status, served endpoint, body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import httpx
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from prometheus_client import CollectorRegistry

from placement.domain import Catalog, Fleet, PodId
from placement.emulator import Latency
from placement.plan import Plan
from placement.router import MemoryRequestLog, build_router
from placement.router.core import Router
from placement.router.picker_grpc import TRANSPORTS, EndpointPickerServer
from placement.router.reqlog import LogRow
from placement.router.wiring import RouterWithPicker, ServedApp
from placement.settings import Settings

from .conftest import MANUAL, Pods, catalog_of, emulated, plan_of

DESTINATION = "x-gateway-destination-endpoint"
DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
#: The transport ``with_transport`` serves the picker on (the ``transport`` fixture's).
_SERVING = {"transport": TRANSPORTS[0]}


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test that uses it runs on each of the picker's transports."""
    _SERVING["transport"] = request.param
    yield request.param
    _SERVING["transport"] = TRANSPORTS[0]


pytestmark = pytest.mark.usefixtures("transport")


def with_transport(with_picker: RouterWithPicker) -> RouterWithPicker:
    """``with_picker`` serving on the transport of the test's ``transport``."""
    picker = with_picker.picker
    with_picker.picker = EndpointPickerServer(
        with_picker.router, host=picker.host, port=0, transport=_SERVING["transport"]
    )
    return with_picker


def _headers(pairs: Sequence[tuple[str, str]]) -> Any:
    return base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]
    )


def request_headers(
    body: bytes | None,
    *,
    path: str = "/v1/completions",
    subset: Sequence[str] | None = None,
    extra: Sequence[tuple[str, str]] = (),
) -> Any:
    """The first message of a stream: headers, the modes, the subset hint if any."""
    pairs = [(":method", "GET" if body is None else "POST"), (":path", path), *extra]
    if body is not None:
        pairs += [("content-type", "application/json"), ("content-length", str(len(body)))]
    message = ext_proc.ProcessingRequest(
        request_headers=ext_proc.HttpHeaders(headers=_headers(pairs), end_of_stream=body is None)
    )
    message.protocol_config.request_body_mode = DUPLEX
    message.protocol_config.response_body_mode = DUPLEX
    if subset is not None:
        hint = message.metadata_context.filter_metadata["envoy.lb.subset_hint"]
        hint.fields["x-gateway-destination-endpoint-subset"].list_value.SetInParent()
        for endpoint in subset:
            values = hint.fields["x-gateway-destination-endpoint-subset"].list_value.values
            values.add().string_value = endpoint
    return message


def body_chunks(body: bytes, chunks: int) -> list[Any]:
    size = max(1, -(-len(body) // chunks))
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    return [
        ext_proc.ProcessingRequest(
            request_body=ext_proc.HttpBody(body=part, end_of_stream=i == len(parts) - 1)
        )
        for i, part in enumerate(parts)
    ]


def completion(model: str, **extra: Any) -> bytes:
    return json.dumps({"model": model, "prompt": "p", "max_tokens": 2, **extra}).encode()


@dataclass
class Outcome:
    """What one request through the gateway came to."""

    #: The endpoints the picker named, in its order (header value).
    endpoints: list[str] = field(default_factory=list)
    #: The same in the dynamic metadata ``envoy.lb``.
    metadata: str = ""
    #: The picker's immediate response, when it answered the client itself.
    immediate: Any = None
    served: str = ""
    status: int = 0
    body: bytes = b""
    #: The body the picker sent on (full duplex: the gateway forwards only that).
    forwarded: bytes = b""
    #: The request headers the picker set.
    headers: dict[str, bytes] = field(default_factory=dict)


class Gateway:
    """An Envoy-like client of the picker; ``send`` runs one request end to end."""

    def __init__(self, port: int) -> None:
        self.target = f"127.0.0.1:{port}"

    async def send(
        self,
        body: bytes | None,
        *,
        chunks: int = 1,
        subset: Sequence[str] | None = None,
        path: str = "/v1/completions",
        before_sending: Any = None,
    ) -> Outcome:
        async with grpc.aio.insecure_channel(self.target) as channel:
            call = ext_proc_grpc.ExternalProcessorStub(channel).Process()
            await call.write(request_headers(body, path=path, subset=subset))
            ended = False
            for message in body_chunks(body, chunks) if body is not None else ():
                try:
                    await call.write(message)
                except grpc.aio.AioRpcError:  # the picker answered and ended the stream
                    ended = True
                    break
            outcome = await self._read_decision(call, streaming_body=body is not None)
            if outcome.immediate is None:
                if before_sending is not None:
                    before_sending(outcome)
                await self._forward(call, outcome, path=path)
            if not ended:
                await call.done_writing()
                assert await call.read() == grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK
        return outcome

    async def _read_decision(self, call: Any, *, streaming_body: bool) -> Outcome:
        outcome = Outcome()
        first = await call.read()
        if first.HasField("immediate_response"):
            outcome.immediate = first.immediate_response
            return outcome
        assert first.HasField("request_headers"), first
        common = first.request_headers.response
        assert common.clear_route_cache
        [header] = [h for h in common.header_mutation.set_headers if h.header.key == DESTINATION]
        assert header.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
        outcome.endpoints = header.header.raw_value.decode().split(",")
        outcome.headers = {
            h.header.key: h.header.raw_value for h in common.header_mutation.set_headers
        }
        lb = first.dynamic_metadata.fields["envoy.lb"].struct_value
        outcome.metadata = lb.fields[DESTINATION].string_value
        if streaming_body:
            second = await call.read()
            streamed = second.request_body.response.body_mutation.streamed_response
            assert streamed.end_of_stream
            outcome.forwarded = streamed.body
        return outcome

    async def _forward(self, call: Any, outcome: Outcome, *, path: str) -> None:
        """Send the request down the list until an endpoint answers other than 503
        or a refused connection (the gateway's retry), and report the answer."""
        async with httpx.AsyncClient(timeout=30.0) as http:
            for endpoint in outcome.endpoints:
                url = f"http://{endpoint}{path}"
                try:
                    if outcome.forwarded:
                        reply = await http.post(url, content=outcome.forwarded)
                    else:
                        reply = await http.get(url)
                except httpx.ConnectError:
                    continue
                outcome.served, outcome.status, outcome.body = (
                    endpoint,
                    reply.status_code,
                    reply.content,
                )
                if reply.status_code != 503:
                    break
        headers = [(":status", str(outcome.status)), ("content-type", "application/json")]
        message = ext_proc.ProcessingRequest(
            response_headers=ext_proc.HttpHeaders(headers=_headers(headers))
        )
        served = message.metadata_context.filter_metadata["envoy.lb"]
        served.fields["x-gateway-destination-endpoint-served"].string_value = outcome.served
        await call.write(message)
        assert (await call.read()).HasField("response_headers")
        await call.write(
            ext_proc.ProcessingRequest(
                response_body=ext_proc.HttpBody(body=outcome.body, end_of_stream=True)
            )
        )
        echoed = (await call.read()).response_body.response.body_mutation.streamed_response
        assert (echoed.body, echoed.end_of_stream) == (outcome.body, True)


@dataclass
class Picking:
    """A router with its picker in a thread, and a gateway in front of the picker."""

    served: ServedApp
    router: Router
    gateway: Gateway
    log: MemoryRequestLog
    registry: CollectorRegistry

    def send(self, body: bytes | None, **kwargs: Any) -> Outcome:
        return asyncio.run(self.gateway.send(body, **kwargs))

    def scrape(self) -> None:
        self.served.call(self.router.scrape_all())

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@contextlib.contextmanager
def picker_for(
    fleet: Fleet,
    *,
    plan: Plan | None = None,
    catalog: Catalog | None = None,
    settings: Settings = MANUAL,
) -> Iterator[Picking]:
    log, registry = MemoryRequestLog(), CollectorRegistry()
    app = build_router(
        fleet=fleet,
        plan=plan,
        catalog=catalog,
        settings=settings,
        registry=registry,
        request_log=log,
    )
    with_picker = with_transport(RouterWithPicker(app, host="127.0.0.1", port=0))
    with ServedApp(with_picker) as served:
        assert with_picker.picker.port
        yield Picking(served, app.router, Gateway(with_picker.picker.port), log, registry)


def endpoint(pods: Pods, pod: str) -> str:
    return pods.url(pod).removeprefix("http://")


def load_on(pods: Pods, pod: str, adapter: str) -> None:
    """Load ``adapter`` on the pod behind the router's back (as the controller does)."""
    body = json.dumps({"lora_name": adapter, "lora_path": f"s3://adapters/{adapter}"}).encode()
    request = urllib.request.Request(
        f"{pods.url(pod)}/v1/load_lora_adapter",
        data=body,
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


# --- picking ------------------------------------------------------------------------


@pytest.mark.parametrize("chunks", [1, 3], ids=["one-chunk", "three-chunks"])
def test_an_adapter_already_on_its_pod_is_picked_there_in_header_and_metadata(
    chunks: int,
) -> None:
    with emulated(2) as pods:
        load_on(pods, "pod-1", "alpha")
        plan = plan_of({"alpha": ["pod-1"]})
        with picker_for(pods.domain, plan=plan, catalog=catalog_of(["alpha"])) as picking:
            body = completion("alpha")
            outcome = picking.send(body, chunks=chunks)
    assert outcome.endpoints == [endpoint(pods, "pod-1")]
    assert outcome.metadata == endpoint(pods, "pod-1")
    assert outcome.forwarded == body  # vLLM takes the client's body as it is
    assert (outcome.served, outcome.status) == (endpoint(pods, "pod-1"), 200)
    assert pods.counter("loads") == 1  # the one made behind the router's back
    [row] = picking.log.rows
    assert type(row) is LogRow
    assert (row.adapter, row.pod, row.outcome, row.status) == ("alpha", "pod-1", "gpu_hit", 200)
    assert row.ttft_ms is not None and row.output_tokens == 2


def test_a_cold_adapter_is_loaded_by_the_picker_before_it_answers() -> None:
    with emulated(2) as pods:
        plan = plan_of({"alpha": ["pod-0"]})
        with picker_for(pods.domain, plan=plan, catalog=catalog_of(["alpha"])) as picking:
            outcome = picking.send(completion("alpha"))
            assert pods.fleet.pod("pod-0").counters["loads"] == 1
            assert picking.metric("lorafleet_adapter_loads_total", pod="pod-0", reason="cold") == 1
    assert outcome.endpoints == [endpoint(pods, "pod-0")]
    assert outcome.status == 200
    assert [row.outcome for row in picking.log.rows] == ["cold_load"]


def test_an_adapter_in_host_memory_is_activated_on_its_pod_and_counted() -> None:
    with emulated(1, max_loras=1) as pods:
        plan = plan_of({"alpha": ["pod-0"], "beta": ["pod-0"]})
        catalog = catalog_of(["alpha", "beta"])
        with picker_for(pods.domain, plan=plan, catalog=catalog) as picking:
            for model in ("alpha", "beta", "alpha"):  # beta takes alpha's one GPU slot
                assert picking.send(completion(model)).status == 200
            activations = picking.metric(
                "lorafleet_adapter_loads_total", pod="pod-0", reason="activation"
            )
    assert [row.outcome for row in picking.log.rows] == ["cold_load", "cold_load", "cpu_hit"]
    assert activations == 1
    assert pods.counter("loads") == 2  # alpha came back from host memory, not storage


async def _stampede(gateway: Gateway, n: int) -> list[Outcome]:
    return await asyncio.gather(*(gateway.send(completion("cold")) for _ in range(n)))


def test_a_stampede_of_streams_for_a_cold_adapter_causes_one_load_per_pod() -> None:
    slow_load = replace(Latency(), load_ms=1000.0)  # every stream arrives during the load
    with emulated(3, latency=slow_load) as pods:
        plan = plan_of({"other": ["pod-0"]})
        catalog = catalog_of(["cold", "other"])
        with picker_for(pods.domain, plan=plan, catalog=catalog) as picking:
            outcomes = asyncio.run(_stampede(picking.gateway, 40))
    assert {o.status for o in outcomes} == {200}
    picked = {o.endpoints[0] for o in outcomes}
    assert pods.counter("loads") == len(picked) == 1
    assert pods.counter("gpu_activations") == 1
    assert len(picking.log.rows) == 40


def test_a_pod_failure_then_a_retry_picks_another_pod() -> None:
    with emulated(2) as pods:
        plan = plan_of({"alpha": ["pod-0"]})
        with picker_for(pods.domain, plan=plan, catalog=catalog_of(["alpha"])) as picking:
            first = picking.send(completion("alpha"))
            pods.fleet.pod("pod-0").kill(60.0)
            picking.scrape()  # pod-0 answers its scrape as a dead pod: out of the rotation
            retry = picking.send(completion("alpha"))
    assert first.endpoints == [endpoint(pods, "pod-0")]
    assert retry.endpoints == [endpoint(pods, "pod-1")]  # loaded there first
    assert retry.status == 200
    assert [row.pod for row in picking.log.rows] == ["pod-0", "pod-1"]


def test_the_gateway_falls_back_to_the_second_endpoint_and_the_first_leaves_the_rotation() -> None:
    with emulated(2) as pods:
        for pod in ("pod-0", "pod-1"):
            load_on(pods, pod, "alpha")
        plan = plan_of({"alpha": ["pod-0", "pod-1"]})
        with picker_for(pods.domain, plan=plan, catalog=catalog_of(["alpha"])) as picking:
            killed: list[str] = []

            def kill_the_first(outcome: Outcome) -> None:
                name = "pod-0" if outcome.endpoints[0] == endpoint(pods, "pod-0") else "pod-1"
                pods.fleet.pod(name).kill(60.0)
                killed.append(name)

            first = picking.send(completion("alpha"), before_sending=kill_the_first)
            [dead] = killed
            assert not picking.router.topology.pods[PodId(dead)].healthy
            retry = picking.send(completion("alpha"))
    alive = "pod-1" if dead == "pod-0" else "pod-0"
    assert first.endpoints == [endpoint(pods, dead), endpoint(pods, alive)]
    assert (first.served, first.status) == (endpoint(pods, alive), 200)
    assert retry.endpoints == [endpoint(pods, alive)]  # no fallback left
    assert [row.pod for row in picking.log.rows] == [alive, alive]


def test_the_subset_hint_limits_the_pick_and_an_empty_one_is_a_503() -> None:
    with emulated(3) as pods, picker_for(pods.domain, catalog=catalog_of(["alpha"])) as picking:
        only = endpoint(pods, "pod-2")
        inside = [picking.send(completion("alpha"), subset=[only]) for _ in range(3)]
        outside = picking.send(completion("alpha"), subset=["10.0.0.1:8000"])
    assert {o.endpoints[0] for o in inside} == {only}
    assert outside.immediate.status.code == 503
    assert [h.header.raw_value for h in outside.immediate.headers.set_headers] == [
        b"application/json",
        b"1",
    ]


def test_a_request_without_a_body_goes_to_a_pod_and_keeps_no_log_row() -> None:
    with emulated(2) as pods, picker_for(pods.domain) as picking:
        outcome = picking.send(None, path="/v1/models")
    assert outcome.endpoints[0] in {endpoint(pods, "pod-0"), endpoint(pods, "pod-1")}
    assert outcome.status == 200
    assert picking.log.rows == []
    assert all(state.inflight == 0 for state in picking.router.topology.pods.values())


# --- refusals -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"model": "alpha", "prompt": ', 400, "not valid JSON"),
        (b'{"prompt": "p"}', 400, "'model'"),
        (json.dumps({"model": "Not A Name"}).encode(), 400, "is not an adapter name"),
        (completion("zeta"), 404, "`zeta` does not exist"),
        (completion("alpha", prompt="x" * 2_000_000), 413, "over the router's limit"),
    ],
    ids=["truncated-json", "no-model", "bad-name", "unknown-adapter", "too-large"],
)
def test_a_bad_request_is_an_immediate_response_naming_the_problem(
    body: bytes, status: int, words: str
) -> None:
    with emulated(1) as pods, picker_for(pods.domain, catalog=catalog_of(["alpha"])) as picking:
        outcome = picking.send(body, chunks=2)
        assert pods.counter("requests") == 0
    assert outcome.immediate.status.code == status
    error = json.loads(outcome.immediate.body)["error"]
    assert words in error["message"] and error["code"] == status


def test_no_healthy_pod_is_a_503_with_retry_after_and_a_log_row() -> None:
    with emulated(1) as pods, picker_for(pods.domain, catalog=catalog_of(["alpha"])) as picking:
        pods.fleet.pod("pod-0").kill(60.0)
        picking.scrape()
        outcome = picking.send(completion("alpha"))
    assert outcome.immediate.status.code == 503
    headers = {h.header.key: h.header.raw_value for h in outcome.immediate.headers.set_headers}
    assert headers["retry-after"] == b"1"
    assert [(row.status, row.outcome) for row in picking.log.rows] == [(503, None)]
