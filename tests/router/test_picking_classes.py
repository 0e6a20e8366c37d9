"""The live router follows lorafleet's classes as the replay does: a load on a full pod
whose LRU victim (by the pod's ledger) is of a higher class than an adapter idle beside
it names the warm-ups to send there first (``Choice.refresh``); without classes, none."""

from __future__ import annotations

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.router.picking import Picker
from placement.router.state import Topology, Upstream, build_topology
from placement.settings import LoadCostSettings, RouterSettings


def one_full_pod() -> Topology:
    """One vLLM pod of two slots holding "prod" (its LRU victim) and then "batch"."""
    upstream = Upstream(
        pod=PodId("pod-0"),
        pool=PoolId("pool"),
        url="http://127.0.0.1:1",
        engine=Engine.VLLM,
        served_model="base-model",
        max_loras=2,
        max_cpu_loras=8,
    )
    topology = build_topology((upstream,), None)
    pod = topology.pods[PodId("pod-0")]
    for moment, name in enumerate(("prod", "batch")):
        pod.ledger.loaded(AdapterId(name), f"/adapters/{name}", changed=True)
        pod.note_use(AdapterId(name), float(moment))
    pod.sync()
    return topology


def picker(classes: dict[AdapterId, float] | None) -> Picker:
    return Picker(settings=RouterSettings(), load_cost=LoadCostSettings(), adapter_classes=classes)


def test_a_load_names_the_warm_up_that_keeps_production_over_batch() -> None:
    choice = picker({AdapterId("batch"): 0.5}).pick(one_full_pod(), "new")
    assert choice.pod is not None
    assert choice.refresh == (AdapterId("prod"),)


def test_without_classes_no_warm_up_is_named() -> None:
    assert picker(None).pick(one_full_pod(), "new").refresh == ()
    everything_production = {AdapterId("batch"): 1.0, AdapterId("prod"): 1.0}
    assert picker(everything_production).pick(one_full_pod(), "new").refresh == ()


def test_a_warm_adapter_needs_no_warm_up() -> None:
    assert picker({AdapterId("batch"): 0.5}).pick(one_full_pod(), "batch").refresh == ()
