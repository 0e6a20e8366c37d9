"""Fixtures of the controller tests: a fake Kubernetes API server, plans, a fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from placement.adapters.kube import KubeTarget, connect
from tests.controller.controller_kubefake import FakeApiServer
from tests.factories import FakeClock


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.stop()


@pytest.fixture
def kube_api(fake_api: FakeApiServer) -> Iterator[client.ApiClient]:
    api = connect(host=fake_api.url)
    yield api
    api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated


@pytest.fixture
def target() -> KubeTarget:
    return KubeTarget(namespace="lf", request_timeout_s=5.0)
