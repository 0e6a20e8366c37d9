"""The router at its upstream connection limit: 503 with Retry-After, the pod kept.

The pool itself (waiting for a connection within the request's deadline, then
``PoolFullError``) is tested at the wire in ``test_upstream.py``; here its error meets
the proxy, which must not take a pod out of the rotation for the router's own limit."""

from __future__ import annotations

import logging
from typing import NoReturn

import httpx
import pytest

from placement.domain import PodId
from placement.router.upstream import PoolFullError

from .conftest import catalog_of, emulated, plan_of, router_for


def test_a_full_upstream_pool_is_a_503_and_the_pod_stays_in_rotation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plan = plan_of({"lora-a": ["pod-0"]})
    with (
        emulated(1) as pods,
        router_for(pods.domain, plan=plan, catalog=catalog_of(["lora-a"])) as running,
    ):
        session = running.router.session
        assert session is not None

        async def full(*_args: object, **_kwargs: object) -> NoReturn:
            raise PoolFullError("no upstream connection came free (1 open)")

        session.post = full  # type: ignore[method-assign]  # the fault is the pool's, at its call
        body = {"model": "lora-a", "prompt": "p", "max_tokens": 1}
        with caplog.at_level(logging.WARNING, logger="lorafleet"):
            answer = httpx.post(f"{running.url}/v1/completions", json=body, timeout=30.0)
        assert answer.status_code == 503
        assert int(answer.headers["retry-after"]) >= 1
        assert "upstream connection limit" in answer.json()["error"]["message"]
        assert running.router.topology.pods[PodId("pod-0")].healthy
        assert "leaves the rotation" not in caplog.text
        assert "Traceback" not in caplog.text
