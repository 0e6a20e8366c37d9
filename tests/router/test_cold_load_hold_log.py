"""While a pod's Retry-After holds its loads back, the cold requests sent elsewhere say
so once: the hold's first refused load is logged at WARNING, the rest at DEBUG (before,
every cold request for the held pod logged "loading ... failed" at WARNING).

Through the proxy and through the endpoint picker, two emulated pods, the planned one
refusing every load with a Retry-After of an hour: since the picker leaves a held pod
out for a request that needs a load there (tests/router/test_cold_load_hold_pick.py),
the hold refuses no load at all and only the pod's own 503 is warned of. At
``Router.load`` (a hold begun between a pick and its load still refuses), with the
router's timer moved by the test, a new hold after one is over warned of again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from placement.domain import AdapterId
from placement.errors import RetryableEngineError
from placement.router import Router
from placement.router.cold_loads import LoadHeldError, load_failure_level
from placement.router.state import LivePod
from tests.pods.wire_server import WireServer, text

from .conftest import catalog_of, emulated, plan_of, router_for
from .test_cold_load_retry_after import (
    ALPHA,
    BETA,
    LOAD,
    Timer,
    _RefuseLoads,
    _router,
    refused,
)
from .test_endpoint_picker import completion, picker_for

MODELS = ("alpha", "beta", "gamma", "delta")


def _load_failures(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "lorafleet.router" and r.getMessage().startswith("loading ")
    ]


def _said_of_the_hold(failures: list[tuple[int, str]]) -> list[int]:
    """The levels of the failed loads the hold refused (not sent to the pod)."""
    return [level for level, message in failures if "not sent" in message]


def test_the_proxy_warns_of_a_hold_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="lorafleet.router")
    with emulated(2) as pods:
        held = next(h for h in pods.fleet.handles if h.name == "pod-0")
        held.app.add_middleware(_RefuseLoads, refusals=[])
        plan = plan_of({model: ["pod-0"] for model in MODELS})
        with router_for(pods.domain, plan=plan, catalog=catalog_of(MODELS)) as router:
            client = router.client()
            for model in MODELS:
                assert client.completions.create(model=model, prompt="p", max_tokens=1).choices
    failures = _load_failures(caplog)
    assert [level for level, m in failures if "answered 503" in m] == [logging.WARNING]
    assert _said_of_the_hold(failures) == []  # the held pod was not picked again


def test_the_endpoint_picker_warns_of_a_hold_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="lorafleet.router")
    with emulated(2) as pods:
        held = next(h for h in pods.fleet.handles if h.name == "pod-0")
        held.app.add_middleware(_RefuseLoads, refusals=[])
        plan = plan_of({model: ["pod-0"] for model in MODELS})
        with picker_for(pods.domain, plan=plan, catalog=catalog_of(MODELS)) as picking:
            for model in MODELS:
                assert picking.send(completion(model)).status == 200
    failures = _load_failures(caplog)
    assert [level for level, m in failures if "answered 503" in m] == [logging.WARNING]
    assert _said_of_the_hold(failures) == []  # the held pod was not picked again


@pytest.fixture
def server() -> Iterator[WireServer]:
    wire = WireServer().start()
    yield wire
    wire.stop()


async def _held(router: Router, state: LivePod, adapter: AdapterId) -> LoadHeldError:
    with pytest.raises(LoadHeldError) as failed:
        await router.load(state, adapter)
    return failed.value


@pytest.mark.anyio
async def test_a_new_hold_after_one_is_over_is_warned_of_again(server: WireServer) -> None:
    timer = Timer()
    router, state = await _router(server, timer)
    assert router.engine_http is not None
    try:
        server.answers[LOAD] = refused("5")
        with pytest.raises(RetryableEngineError) as answered:
            await router.load(state, ALPHA)
        assert load_failure_level(answered.value) == logging.WARNING  # the pod's own 503
        first, again = await _held(router, state, BETA), await _held(router, state, ALPHA)
        assert (first.first, again.first) == (True, False)
        assert [load_failure_level(e) for e in (first, again)] == [logging.WARNING, logging.DEBUG]
        timer.now_s += 5.0  # over: the next load is sent, and refused with a new wait
        with pytest.raises(RetryableEngineError):
            await router.load(state, ALPHA)
        assert (await _held(router, state, BETA)).first
        assert not (await _held(router, state, BETA)).first
        timer.now_s += 5.0
        server.answers[LOAD] = text(200, "Success")
        await router.load(state, ALPHA)
        assert server.seen.count(LOAD) == 3
    finally:
        await router.engine_http.aclose()
