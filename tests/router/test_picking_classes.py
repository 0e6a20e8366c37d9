"""The live router follows lorafleet's classes as the replay does: a load on a full pod
whose LRU victim (by the pod's ledger) is of a higher class than an adapter idle beside
it names the warm-ups to send there first (``Choice.refresh``); without classes, none.
With the router's clock a victim's forecast fades as it idles on its pod."""

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


def two_full_pods() -> Topology:
    """pod-0 holds "a" (forecast one request a second, last used at 0 s), pod-1 holds
    "b" (forecast one request in 100 s, last used at 1,000 s); "tail" is planned cold.
    The plan records the forecast, and the router's recent rates bear it out."""
    from dataclasses import replace
    from types import MappingProxyType

    from placement.domain import Tier
    from placement.plan import AdapterPlan

    from .conftest import plan_of

    plan = plan_of({"a": ["pod-0"], "b": ["pod-1"]})
    rates = {"a": 1.0, "b": 0.01, "tail": 0.01}
    adapters = {
        AdapterId(name): replace(entry, mean_rps=rates[name], q90_rps=rates[name])
        for name, entry in plan.adapters.items()
    }
    adapters[AdapterId("tail")] = AdapterPlan(tier=Tier.COLD, mean_rps=0.01, q90_rps=0.01)
    plan = replace(plan, adapters=MappingProxyType(adapters))
    upstreams = tuple(
        Upstream(
            pod=PodId(f"pod-{i}"),
            pool=PoolId("pool"),
            url=f"http://127.0.0.1:{i + 1}",
            engine=Engine.VLLM,
            served_model="base-model",
            max_loras=1,
            max_cpu_loras=8,
        )
        for i in range(2)
    )
    topology = build_topology(upstreams, plan)
    for pod_id, name, used_s in (("pod-0", "a", 0.0), ("pod-1", "b", 1000.0)):
        pod = topology.pods[PodId(pod_id)]
        pod.ledger.loaded(AdapterId(name), f"/adapters/{name}", changed=True)
        pod.note_use(AdapterId(name), used_s)
        for k in range(int(rates[name] * 1000)):
            topology.recent.add(name, used_s - k * 0.5)
    return topology


def test_with_the_router_clock_a_victim_idle_long_is_worth_less_than_its_forecast() -> None:
    # Without a clock "a" (one request a second) is the dearer victim: the load goes to
    # pod-1. With the clock at 1,000 s "a" has idled 1,000 s, "b" not at all: pod-0.
    settings, cost = RouterSettings(), LoadCostSettings()
    blind = Picker(settings=settings, load_cost=cost)
    timed = Picker(settings=settings, load_cost=cost, clock=lambda: 1000.0)
    blind_pod, timed_pod = (
        blind.pick(two_full_pods(), "tail").pod,
        timed.pick(two_full_pods(), "tail").pod,
    )
    assert blind_pod is not None and blind_pod.pod_id == "pod-1"
    assert timed_pod is not None and timed_pod.pod_id == "pod-0"
