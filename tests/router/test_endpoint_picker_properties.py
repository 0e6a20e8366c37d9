"""Invariants of the endpoint picker's decisions, over any body and any subset hint.

In process, without gRPC: ``GatewayRequest`` over a ``Router`` whose topology is set by
hand (its loops not started), as ``router.picker_grpc`` drives it per stream.
"""

from __future__ import annotations

import asyncio
import json

from hypothesis import given
from hypothesis import strategies as st

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.plan import Plan
from placement.ports import PodMetrics
from placement.router.core import Router
from placement.router.endpoint_picking import GatewayRequest, Picked, Refused
from placement.router.gateway_answer import endpoint_of
from placement.router.reqlog import MemoryRequestLog
from placement.router.sources import StaticPlanSource
from placement.router.state import Upstream, build_topology

from .conftest import MANUAL, plan_of

PODS = 4
ENDPOINTS = [f"10.0.0.{i}:8000" for i in range(PODS)]
ADAPTERS = ["alpha", "beta", "gamma"]


class _Pods:
    description = "test"

    async def upstreams(self) -> tuple[Upstream, ...]:
        return ()


def make_router(plan: Plan, *, healthy: list[bool], kv: list[float]) -> Router:
    upstreams = tuple(
        Upstream(
            pod=PodId(f"pod-{i}"),
            pool=PoolId("pool"),
            url=f"http://{ENDPOINTS[i]}",
            engine=Engine.VLLM,
            served_model="base-model",
            max_loras=2,
            max_cpu_loras=4,
        )
        for i in range(PODS)
    )
    router = Router(
        plan_source=StaticPlanSource(plan),
        pod_source=_Pods(),
        settings=MANUAL.router,
        request_log=MemoryRequestLog(),
    )
    router.topology = build_topology(upstreams, plan)
    for i, state in enumerate(router.topology.pods.values()):
        state.healthy = healthy[i]
        state.observe(PodMetrics(kv_usage=kv[i]))
        name = AdapterId(ADAPTERS[i % len(ADAPTERS)])
        state.ledger.reconcile_listing({name: f"s3://adapters/{name}"})
        state.sync()
    return router


models = st.sampled_from([*ADAPTERS, "base-model", "unknown-one", "Not A Name", ""])
json_bodies = st.builds(
    lambda model, extra: json.dumps({"model": model, "prompt": "p", **extra}).encode(),
    models,
    st.dictionaries(st.sampled_from(["user", "stream", "max_tokens"]), st.integers(0, 3)),
)
bodies = st.one_of(json_bodies, st.binary(max_size=64))


@given(
    body=bodies,
    subset=st.none() | st.sets(st.sampled_from(ENDPOINTS)).map(frozenset),
    healthy=st.lists(st.booleans(), min_size=PODS, max_size=PODS),
    kv=st.lists(st.sampled_from([0.1, 0.9, 0.97]), min_size=PODS, max_size=PODS),
)
def test_a_decision_is_an_allowed_endpoint_or_a_refusal_and_leaves_no_request_behind(
    body: bytes, subset: frozenset[str] | None, healthy: list[bool], kv: list[float]
) -> None:
    plan = plan_of({"alpha": ["pod-0", "pod-1"], "beta": ["pod-2"]})
    router = make_router(plan, healthy=healthy, kv=kv)
    request = GatewayRequest(router, [(b":path", b"/v1/completions")], path="/v1/completions")
    request.subset = subset
    decision = asyncio.run(request.decide(body))
    by_endpoint = {endpoint_of(s.upstream): s for s in router.topology.pods.values()}
    if isinstance(decision, Picked):
        assert 1 <= len(decision.endpoints) <= 2
        assert len(set(decision.endpoints)) == len(decision.endpoints)
        for endpoint in decision.endpoints:
            assert subset is None or endpoint in subset
            assert by_endpoint[endpoint].healthy
        assert sum(s.inflight for s in router.topology.pods.values()) == 1
    else:
        assert isinstance(decision, Refused)
        assert decision.status in {400, 404, 413, 502, 503}
        assert decision.message and decision.kind.endswith("Error")
        assert (decision.retry_after_s is not None) == (decision.status == 503)
    if isinstance(decision, Picked):  # the gateway reports the pod's answer
        request.response_status(200)
        usage = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
        request.response_bytes(usage, end=True)
    request.finish()
    assert all(s.inflight == 0 and not s.busy for s in router.topology.pods.values())
    asyncio.run(router.request_log.flush())
    sink = router.request_log.sink
    assert isinstance(sink, MemoryRequestLog)
    # A row for every request that got a name, with the status it was answered with.
    if not request.named:
        assert sink.rows == []
    else:
        [row] = sink.rows
        assert row.status == (200 if isinstance(decision, Picked) else decision.status)
