"""The router's parts on their own: the ledger, the Kubernetes sources, the command line."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import MappingProxyType

import httpx
import openai._constants
import pytest
import uvicorn
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from placement.adapters.kube_memory import MemoryPlanStore, MemoryPods
from placement.cli.app import app
from placement.cli.router_setup import router_settings
from placement.domain import AdapterId, Engine, Outcome, PodId, PoolId, Tier
from placement.errors import KubeError, PlanError
from placement.plan import Plan
from placement.ports import DiscoveredPod
from placement.residency import EngineModel
from placement.router.kube_sources import DiscoveryPodSource, StorePlanSource
from placement.router.ledger import PodLedger
from placement.router.picking import Picker
from placement.router.state import Topology, Upstream, build_topology
from placement.router.wiring import server_config
from placement.settings import LoadCostSettings, RouterSettings

from .conftest import plan_of

NAMES = st.sampled_from([AdapterId(f"a{i}") for i in range(12)])
CALLS = st.sampled_from(["activate", "busy", "load", "already", "forget", "listing"])
STEPS = st.lists(st.tuples(CALLS, NAMES), max_size=60)
VLLM, SGLANG = EngineModel.VLLM, EngineModel.SGLANG


def _apply(ledger: PodLedger, call: str, adapter: AdapterId) -> None:
    if call == "activate":
        ledger.activate(adapter)
    elif call == "busy":  # requests in flight on the two least recently used
        ledger.activate(adapter, busy=set(ledger.active()[:2]))
    elif call in ("load", "already"):
        ledger.loaded(adapter, f"s3://x/{adapter}", changed=call == "load")
    elif call == "forget":
        ledger.forget(adapter)
    else:  # the pod lists what the ledger lists, less this adapter (unloaded behind us)
        listed = {AdapterId(a): "" for a in ledger.residency.listed if a != adapter}
        ledger.reconcile_listing(listed)


def _steps(*calls: str) -> list[tuple[str, AdapterId]]:
    return [(call, AdapterId(name)) for call, name in (c.split() for c in calls)]


@given(
    steps=STEPS,
    max_loras=st.integers(1, 4),
    extra=st.integers(0, 4),
    engine=st.sampled_from([VLLM, SGLANG]),
)
@settings(max_examples=150, deadline=None)
# A host-cache hit takes the GPU slot of the least recently used (the mirrors follow
# without a rebuild) ...
@example(steps=_steps("load a0", "load a1", "activate a0"), max_loras=1, extra=2, engine=VLLM)
# ... and on vLLM that slot may be an unloaded name's entry while the name, loaded
# again, holds another slot: it stays on the GPU.
@example(
    steps=_steps("load a1", "load a2", "load a0", "forget a0", "load a0", "activate a1"),
    max_loras=2,
    extra=2,
    engine=VLLM,
)
def test_the_ledger_never_holds_more_than_the_engine_does(
    steps: list[tuple[str, AdapterId]], max_loras: int, extra: int, engine: EngineModel
) -> None:
    ledger = PodLedger(engine, max_loras=max_loras, max_cpu_loras=max_loras + extra)
    for call, adapter in steps:
        version, held = ledger.version, {*ledger.active(), *ledger.registered()}
        _apply(ledger, call, adapter)
        residency = ledger.residency
        assert ledger.active() == residency.on_gpu()  # the views mirror the engine model
        assert ledger.registered() == residency.in_host()
        if ledger.version == version:  # what indexes of the held names rely on
            assert {*ledger.active(), *ledger.registered()} == held
        assert len(ledger.active()) + residency.ghosts_on_gpu() <= max_loras
        assert ledger.free_slots() >= 0
        if call in ("activate", "busy"):
            assert ledger.classify(adapter) is Outcome.GPU_HIT
            assert ledger.active()[-1] == adapter  # the most recently used
        if call == "forget":
            assert ledger.classify(adapter) is Outcome.COLD_LOAD
            assert not ledger.is_listed(adapter)


def _names(ledger_view: Iterable[AdapterId]) -> list[str]:
    return [str(a) for a in ledger_view]


def test_on_vllm_a_load_takes_a_gpu_slot_and_an_unload_frees_none() -> None:
    ledger = PodLedger(VLLM, max_loras=2, max_cpu_loras=4)
    a, b, c = (AdapterId(n) for n in "abc")
    ledger.activate(a)
    ledger.activate(b)
    ledger.loaded(c, "s3://x/c", changed=True)  # a warm preload on vLLM: c activates...
    assert _names(ledger.active_view) == ["b", "c"]  # ...and pushes a, the LRU, off the GPU
    assert ledger.classify(a) is Outcome.CPU_HIT
    ledger.forget(b)  # unloaded: the name goes, its GPU slot stays taken
    assert _names(ledger.active_view) == ["c"]
    assert ledger.free_slots() == 0 and not ledger.is_listed(b)
    ledger.activate(a)  # a comes back by evicting the slot b's weights still hold
    assert _names(ledger.active_view) == ["c", "a"] and ledger.free_slots() == 0


def test_on_sglang_a_load_stays_in_host_memory_and_the_soft_cap_parks_the_lru() -> None:
    ledger = PodLedger(SGLANG, max_loras=2, max_cpu_loras=2)
    a, b, c = (AdapterId(n) for n in "abc")
    ledger.loaded(a, "s3://x/a", changed=True)
    assert ledger.classify(a) is Outcome.CPU_HIT and ledger.free_slots() == 2
    ledger.activate(a)
    ledger.loaded(b, "s3://x/b", changed=True)
    ledger.activate(b)
    ledger.loaded(c, "s3://x/c", changed=True)  # past --max-loaded-loras: a is unloaded...
    assert "a" in ledger.residency.parked
    assert ledger.is_listed(a)  # ...and reloaded by the engine on its next request
    assert ledger.classify(a) is Outcome.COLD_LOAD
    ledger.reconcile_listing({b: "s3://x/b", c: "s3://x/c"})  # a left /v1/models, as expected
    assert ledger.is_listed(a)


def test_the_ledger_evicts_the_least_recently_used_and_trusts_the_listing() -> None:
    ledger = PodLedger(VLLM, max_loras=2, max_cpu_loras=3)
    a, b, c, d = (AdapterId(n) for n in "abcd")
    ledger.activate(a)
    ledger.activate(b)
    ledger.activate(a)
    ledger.activate(c)  # b was used least recently
    assert [ledger.classify(x) for x in (a, b, c)] == [
        Outcome.GPU_HIT,
        Outcome.CPU_HIT,
        Outcome.GPU_HIT,
    ]
    ledger.reconcile_listing({a: "", d: "s3://x/d"})  # b, c unloaded; d loaded by someone else
    assert ledger.classify(c) is Outcome.COLD_LOAD
    assert ledger.is_listed(d) and not ledger.is_listed(b)
    assert ledger.classify(d) is Outcome.GPU_HIT  # a vLLM load activates
    ledger.reconcile_listing({})  # nothing the pod had is left: it restarted
    assert ledger.active() == () and ledger.residency.ghosts_on_gpu() == 0


@pytest.mark.parametrize("engine", [VLLM, SGLANG], ids=["vllm", "sglang"])
def test_a_plan_is_seeded_as_its_apply_runs_warm_first_hot_last(engine: EngineModel) -> None:
    ledger = PodLedger(engine, max_loras=2, max_cpu_loras=6)
    hot = (AdapterId("h1"), AdapterId("h2"))
    warm = (AdapterId("w1"), AdapterId("w2"), AdapterId("w3"))
    ledger.seed(hot=hot, warm=warm, plan_id="p1")
    assert ledger.active() == hot  # on vLLM the warm loads took slots first, then lost them
    assert set(ledger.registered()) == set(hot + warm)
    assert not ledger.is_listed(AdapterId("w1"))  # until /v1/models shows it
    ledger.activate(AdapterId("w1"))
    ledger.seed(hot=hot, warm=warm, plan_id="p1")  # the same plan again changes nothing
    assert "w1" in ledger.active()


@pytest.mark.anyio
async def test_the_configmap_source_swaps_only_on_change_and_keeps_errors_apart() -> None:
    store = MemoryPlanStore()
    source = StorePlanSource(store)
    with pytest.raises(PlanError, match="no plan"):
        await source.poll()
    store.publish(plan_of({"alpha": ["pod-0"]}, plan_id="one"))
    first = await source.poll()
    assert first is not None and first.id == "one"
    assert await source.poll() is None
    store.faults.queued.append(KubeError("503 from the API server"))
    with pytest.raises(PlanError, match="503"):
        await source.poll()
    store.publish(plan_of({"alpha": ["pod-1"]}, plan_id="two"))
    second = await source.poll()
    assert second is not None and second.id == "two"


def _discovered(name: str, **labels: str) -> DiscoveredPod:
    return DiscoveredPod(
        name=PodId(name),
        pool=PoolId("llama"),
        ip="10.0.0.7",
        port=8000,
        ready=True,
        labels=MappingProxyType(labels),
    )


@pytest.mark.anyio
async def test_the_selector_source_describes_pods_by_their_labels() -> None:
    pods = MemoryPods(
        (
            _discovered("p0"),
            _discovered(
                "p1",
                **{
                    "lorafleet.io/engine": "sglang",
                    "lorafleet.io/served-model": "llama-3.1-8b",
                    "lorafleet.io/max-loras": "4",
                },
            ),
        )
    )
    upstreams = await DiscoveryPodSource(pods).upstreams()
    assert [(u.pod, u.engine, u.served_model, u.max_loras, u.max_cpu_loras) for u in upstreams] == [
        ("p0", Engine.VLLM, "llama", 1, 1),
        ("p1", Engine.SGLANG, "llama-3.1-8b", 4, 4),
    ]
    assert upstreams[0].url == "http://10.0.0.7:8000"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["router"], "exactly one of --fleet or --selector"),
        (["router", "--fleet", "f.yaml", "--selector", "app=x"], "exactly one of"),
    ],
    ids=["no-pods", "both-pod-sources"],
)
def test_the_command_refuses_unclear_pod_sources(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output


def test_the_command_names_a_missing_fleet_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["router", "--fleet", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "nope.yaml" in result.output


def _topology(n: int, plan: Plan | None = None) -> Topology:
    upstreams = tuple(
        Upstream(
            pod=PodId(f"pod-{i}"),
            pool=PoolId("pool"),
            url=f"http://127.0.0.1:{30000 + i}",
            engine=Engine.VLLM,
            served_model="base-model",
            max_loras=2,
            max_cpu_loras=8,
        )
        for i in range(n)
    )
    return build_topology(upstreams, plan)


def _picker() -> Picker:
    return Picker(settings=RouterSettings(), load_cost=LoadCostSettings())


@pytest.mark.parametrize(
    ("waiting", "expected", "reason"),
    [(0, "pod-0", "plan"), (2, "pod-0", "plan"), (40, "pod-1", "spill")],
    ids=["idle", "short-queue-stays", "long-queue-spills"],
)
def test_bounded_affinity_leaves_the_planned_pod_only_for_a_long_queue(
    waiting: int, expected: str, reason: str
) -> None:
    from placement.ports import PodMetrics

    topology = _topology(2, plan_of({"alpha": ["pod-0"]}))
    topology.pods[PodId("pod-0")].observe(PodMetrics(waiting=waiting))
    choice = _picker().pick(topology, "alpha")
    assert choice.pod is not None
    assert (choice.pod.pod_id, choice.reason) == (expected, reason)


def test_unplanned_adapters_stay_on_their_two_ring_owners() -> None:
    topology = _topology(6)
    picker = _picker()
    pool = next(iter(topology.pools.values()))
    for name in [f"tail-{i}" for i in range(30)]:
        owners = set(pool.ring.replicas(name, 2))
        seen = set()
        for _ in range(6):
            choice = picker.pick(topology, name)
            assert choice.pod is not None and choice.unplanned
            seen.add(choice.pod.pod_id)
            choice.pod.begin()  # keep it busy so the next pick may take the other owner
        assert seen <= owners


def test_adapters_the_plan_keeps_cold_take_a_free_slot_not_a_hot_one() -> None:
    from dataclasses import replace

    from placement.plan import AdapterPlan

    # pod-0 and pod-1 are full of hot adapters; pod-2 has free slots. A cold adapter
    # of the plan goes where it evicts nothing, whatever its ring owners are.
    plan = plan_of({"a": ["pod-0"], "b": ["pod-0"], "c": ["pod-1"], "d": ["pod-1"]})
    cold = {AdapterId(f"tail-{i}"): AdapterPlan(tier=Tier.COLD) for i in range(20)}
    plan = replace(plan, adapters=MappingProxyType({**plan.adapters, **cold}))
    topology = _topology(3, plan)
    picker = _picker()
    for name in cold:
        choice = picker.pick(topology, name)
        assert choice.pod is not None and not choice.unplanned
        assert choice.pod.pod_id == "pod-2", name


def test_the_front_door_keeps_an_idle_client_longer_than_clients_keep_theirs() -> None:
    """The router must outlast its clients' keep-alive: at equal timeouts a client can
    send on a connection the router is closing, and that request fails unseen."""
    default = RouterSettings()
    sdks = (httpx.Limits(), openai._constants.DEFAULT_CONNECTION_LIMITS)
    longest_s = max(60.0, *(limits.keepalive_expiry or 0.0 for limits in sdks))  # nginx: 60 s
    assert default.client_keepalive_s > longest_s
    flags = dict.fromkeys(
        ("policy", "log_flush_s", "log_rotate_bytes", "max_body_bytes", "class_priority")
    )
    chosen = router_settings(
        **flags, price_slot_wait=None, adapter_source_template=None, client_keepalive_s=90
    )
    config = server_config(object(), chosen.router, port=0)
    assert isinstance(config, uvicorn.Config)
    assert config.timeout_keep_alive == 90
    assert config.timeout_graceful_shutdown == round(default.shutdown_grace_s)


@pytest.mark.parametrize("seconds", [0, -5])
def test_a_client_keep_alive_under_a_second_is_refused(seconds: int) -> None:
    with pytest.raises(ValueError, match="client_keepalive_s must be at least 1"):
        RouterSettings(client_keepalive_s=seconds)
    args = ["router", "--fleet", "fleet.yaml", "--client-keepalive-s", str(seconds)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--client-keepalive-s" in result.output
