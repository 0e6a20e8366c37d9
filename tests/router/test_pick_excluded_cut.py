"""A pick that leaves pods out (``exclude=``: pods held by a cold-load hold, pods a
request already failed on, pods outside an endpoint subset) still sees the rest of the
pool: the candidate pre-filter's cut (the adapter's holders, the least-queued few, the
least KV use, the pods the plan or the ring names) is made over the whole pool, and held
pods, which get few requests, are often the least queued. With them left out, the cut
alone could hold no pod and the request was answered 503 while other pods could load the
adapter; the picker now chooses among the whole pool less the excluded pods.
"""

from __future__ import annotations

import pytest

from placement.domain import Engine, PodId, PoolId
from placement.ports import PodMetrics
from placement.router.picking import Picker, Reject
from placement.router.state import Upstream, build_topology
from placement.settings import LoadCostSettings, RouterSettings
from tests import factories

PODS = 8
QUIET = frozenset(PodId(f"pod-{i}") for i in range(4))


def _upstreams() -> tuple[Upstream, ...]:
    return tuple(
        Upstream(
            pod=PodId(f"pod-{i}"),
            pool=PoolId("pool"),
            url=f"http://pod-{i}.invalid",
            engine=Engine.VLLM,
            served_model="base-model",
            max_loras=4,
            max_cpu_loras=8,
        )
        for i in range(PODS)
    )


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("a0", id="planned-on-an-excluded-pod"),
        pytest.param("tail", id="kept-cold-by-the-plan"),
    ],
)
def test_excluding_the_least_queued_pods_leaves_the_others_to_pick(model: str) -> None:
    # a0 is hot on pod-0 only; pods 0-3 are the least queued and the least KV-used, so
    # the pre-filter's cut for a0 is pods 0-3 alone.
    plan = factories.make_plan({"pod-0": ["a0"]}, warm={"pod-1": ["tail"]})
    topology = build_topology(_upstreams(), plan)
    for i, state in enumerate(topology.pods.values()):
        busy = i >= len(QUIET)
        state.observe(
            PodMetrics(waiting=5 if busy else 0, running=1, kv_usage=0.4 if busy else 0.1)
        )
    for view in topology.pools.values():
        view.index.refresh()
    picker = Picker(settings=RouterSettings(), load_cost=LoadCostSettings())
    full = Picker(settings=RouterSettings(), load_cost=LoadCostSettings(), prefilter=False)

    choice = picker.pick(topology, model, exclude=QUIET)

    assert choice.reject is not Reject.NO_POD
    assert choice.pod is not None
    assert choice.pod.pod_id not in QUIET
    assert choice == full.pick(topology, model, exclude=QUIET)
