"""The endpoint picker's gRPC health service, probed over a real ``grpc.aio`` channel as
a gateway or the kubelet probes it: ``grpc.health.v1.Health`` on the picker's port,
SERVING once the picker has a plan (where one is expected) and a healthy pod."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc  # type: ignore[import-untyped]  # grpcio-health-checking ships no types
from prometheus_client import CollectorRegistry

from placement.plan import plan_to_json
from placement.router import MemoryRequestLog, build_router
from placement.router.core import Router
from placement.router.wiring import RouterWithPicker, ServedApp

from .conftest import MANUAL, catalog_of, emulated, plan_of
from .test_endpoint_picker import transport, with_transport

__all__ = ["transport"]  # the fixture: every test here runs on each transport
pytestmark = pytest.mark.usefixtures("transport")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
#: The names a probe may ask whose answer is the picker's readiness.
READY_NAMES = ("", "readiness", EXT_PROC)


async def _check(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return int(reply.status)


async def _first_watched(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=service), timeout=10
        )
        reply = await call.read()
        call.cancel()
        return int(reply.status)


class Probe:
    """The picker's port, probed the way a gateway does; the router's rounds by hand."""

    def __init__(self, served: ServedApp, router: Router, port: int) -> None:
        self.served, self.router, self.port = served, router, port

    def check(self, service: str) -> int:
        return asyncio.run(_check(self.port, service))

    def statuses(self) -> dict[str, int]:
        return {name: self.check(name) for name in (*READY_NAMES, "liveness")}

    def watch(self, service: str) -> int:
        return asyncio.run(_first_watched(self.port, service))

    def scrape(self) -> None:
        self.served.call(self.router.scrape_all())

    def refresh_plan(self) -> None:
        self.served.call(self.router.refresh_plan())


@contextlib.contextmanager
def probing(fleet: Any, *, plan: Any = None) -> Iterator[Probe]:
    app = build_router(
        fleet=fleet,
        plan=plan,
        catalog=catalog_of(["alpha"]),
        settings=MANUAL,
        registry=CollectorRegistry(),
        request_log=MemoryRequestLog(),
    )
    with_picker = with_transport(RouterWithPicker(app, host="127.0.0.1", port=0))
    with ServedApp(with_picker) as served:
        assert with_picker.picker.port
        yield Probe(served, app.router, with_picker.picker.port)


def _all(status: int) -> dict[str, int]:
    return {name: status for name in (*READY_NAMES, "liveness")}


def test_the_picker_is_serving_with_a_plan_and_a_healthy_pod() -> None:
    with emulated(2) as pods, probing(pods.domain, plan=plan_of({"alpha": ["pod-0"]})) as probe:
        assert probe.statuses() == _all(SERVING)
        assert probe.watch(EXT_PROC) == SERVING


def test_without_its_plan_yet_the_picker_is_live_but_not_serving(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    with emulated(1) as pods, probing(pods.domain, plan=path) as probe:
        assert probe.statuses() == {**_all(NOT_SERVING), "liveness": SERVING}
        assert probe.watch("") == NOT_SERVING
        path.write_text(plan_to_json(plan_of({"alpha": ["pod-0"]})))
        probe.refresh_plan()
        assert probe.statuses() == _all(SERVING)


def test_with_no_healthy_pod_the_picker_is_not_serving_until_one_comes_back() -> None:
    with emulated(1) as pods, probing(pods.domain) as probe:
        assert probe.check(EXT_PROC) == SERVING
        pods.fleet.pod("pod-0").kill(3600.0)
        probe.scrape()
        assert probe.statuses() == {**_all(NOT_SERVING), "liveness": SERVING}
        pods.fleet.pod("pod-0").down_until = 0.0  # back (empty) before the hour is up
        probe.scrape()
        assert probe.check("readiness") == SERVING


@pytest.mark.parametrize("service", ["lorafleet", "grpc.health.v1.Health"])
def test_a_service_the_picker_does_not_serve_is_not_found(service: str) -> None:
    with emulated(1) as pods, probing(pods.domain) as probe:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            probe.check(service)
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        assert service in str(failed.value.details())
        assert probe.watch(service) == SERVICE_UNKNOWN
