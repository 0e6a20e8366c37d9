"""A request's end, as the proxy sees its stream end, was a step on its adapter: its
last step touched the adapter's entry in the engine's LRUs (on SGLang the GPU pool's
only), so the router's ledger moves it last as the engine does (and as the replay's
``FleetReplay._done``, on both engines). The
victim's idle time still counts from its last request's arrival, as in the replay.
Requests in flight are counted by the entry they hold, as the engines count a batch:
after an unload and a reload of a name, the old entry's request keeps the old slot and
the new entry may go."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.emulator.in_flight import RunningEntries
from placement.residency import EngineModel, Entry, PodResidency
from placement.router.live_pods import LivePod, Upstream


def live_pod(
    engine: Engine = Engine.VLLM, *, max_loras: int = 2, max_cpu_loras: int = 4
) -> LivePod:
    return LivePod(
        Upstream(
            pod=PodId("pod-0"),
            pool=PoolId("pool"),
            url="http://pod-0",
            engine=engine,
            served_model="base",
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
        )
    )


def holding(pod: LivePod, *names: str) -> LivePod:
    for name in names:
        pod.ledger.loaded(AdapterId(name), f"s3://{name}", changed=True)
    pod.sync()
    return pod


def send(pod: LivePod, name: str, now_s: float) -> None:
    pod.note_use(AdapterId(name), now_s)
    pod.begin(AdapterId(name))


A, B, C, D = (AdapterId(name) for name in "abcd")


def test_after_a_long_request_with_a_short_one_inside_it_the_short_ones_adapter_is_the_victim() -> (
    None
):
    pod = holding(live_pod(), "a", "b")
    send(pod, "a", 0.0)  # a runs from 0 s to 20 s
    send(pod, "b", 1.0)  # b from 1 s to 2 s
    pod.end(B, ran=True)
    pod.end(A, ran=True)
    assert list(pod.gpu_adapters) == ["b", "a"], "a's last step came last"
    assert pod.ledger.next_victim(pod.busy.keys()) == "b"
    assert pod.victim_last_used_s == 1.0, "b idles from its arrival, as in the replay"
    assert pod.last_used_s == {A: 0.0, B: 1.0}


def test_on_sglang_an_end_moves_the_gpu_pools_lru_place_only() -> None:
    """SGLang marks every uid of each forward batch used in its GPU pool
    (sgl-project/sglang python/sglang/srt/lora/mem_pool.py
    ``LoRAMemoryPool.prepare_lora_batch``: ``eviction_policy.mark_used``); its soft
    cap's order (lora_registry.py ``LoRARegistry``) moves as a request arrives only."""
    pod = holding(live_pod(Engine.SGLANG), "a", "b")
    send(pod, "a", 0.0)
    send(pod, "b", 1.0)
    pod.end(A, ran=True)
    assert list(pod.gpu_adapters) == ["b", "a"] == list(pod.ledger.residency.on_gpu())
    assert pod.ledger.registered() == ("a", "b") == pod.ledger.residency.in_host()


def test_a_request_the_pod_did_not_run_moves_nothing() -> None:
    pod = holding(live_pod(), "a", "b")
    send(pod, "a", 0.0)
    send(pod, "b", 1.0)
    pod.end(A)  # refused, or the gateway fell back to another pod
    assert list(pod.gpu_adapters) == ["a", "b"]
    assert not pod.busy.get(A) and pod.inflight == 1


def test_the_victim_is_the_least_recent_adapter_no_request_of_the_router_holds() -> None:
    pod = holding(live_pod(), "a", "b")
    send(pod, "a", 0.0)
    send(pod, "b", 1.0)
    pod.end(B, ran=True)
    assert pod.ledger.next_victim(pod.busy.keys()) == "b", "a runs"
    assert pod.victim_last_used_s == 1.0


def test_after_an_unload_and_a_reload_the_old_entrys_request_keeps_only_the_old_slot() -> None:
    pod = holding(live_pod(max_loras=3, max_cpu_loras=6), "a", "c")
    send(pod, "c", 0.0)  # runs on c's first entry
    pod.ledger.forget(C)  # unloaded while it runs: on vLLM its entry keeps its slot
    pod.ledger.loaded(C, "s3://c", changed=True, busy=pod.busy.keys())  # a new entry
    send(pod, "a", 1.0)
    pod.end(A, ran=True)
    # GPU: c's old entry (running), c's new entry (idle), a (idle, most recent).
    assert pod.ledger.next_victim(pod.busy.keys()) == "c", "the new, idle entry goes"
    pod.ledger.loaded(D, "s3://d", changed=True, busy=pod.busy.keys())
    assert pod.ledger.residency.gpu_entries() == (("c", False), ("a", True), ("d", True))
    pod.end(C, ran=True)  # the old entry's request ends: it touches the old entry
    assert not pod.busy


# --- the router's ledger agrees with the engine model as the emulator drives it -------


@dataclass
class Emulated:
    """The engine model driven as the emulated pod drives it (``placement.emulator.pod``):
    a request holds the entry its name points to as it arrives, runs on it, and its
    last step touches it; a load skips the running entries."""

    model: PodResidency
    running: RunningEntries = field(default_factory=RunningEntries)
    held: list[tuple[str, Entry | None]] = field(default_factory=list)

    def send(self, name: str) -> None:
        entry = self.model.entry(name)
        assert entry is not None
        self.model.request_entry(entry, busy=self.running.busy())
        self.running.start(entry)
        self.held.append((name, entry))

    def end(self, name: str) -> None:
        k = next(k for k, (held, _) in enumerate(self.held) if held == name)
        _, entry = self.held.pop(k)
        self.running.end(entry)
        self.model.last_step(entry)


OPS = st.lists(
    st.tuples(st.sampled_from(["load", "send", "end", "unload"]), st.sampled_from("abcde")),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, max_loras=st.integers(1, 3))
def test_the_ledger_keeps_the_engines_gpu_order_and_victim(
    ops: list[tuple[str, str]], max_loras: int
) -> None:
    pod = live_pod(max_loras=max_loras, max_cpu_loras=2 * max_loras)
    engine = Emulated(
        PodResidency(EngineModel.VLLM, max_loras=max_loras, max_cpu_loras=2 * max_loras)
    )
    for t, (op, name) in enumerate(ops):
        adapter = AdapterId(name)
        listed = name in engine.model.listed
        if op == "load" and not listed:
            pod.ledger.loaded(adapter, f"s3://{name}", changed=True, busy=pod.busy.keys())
            pod.sync()
            engine.model.load(name, f"s3://{name}", busy=engine.running.busy())
        elif op == "send" and listed:
            send(pod, name, float(t))
            engine.send(name)
        elif op == "end" and any(held == name for held, _ in engine.held):
            pod.end(adapter, ran=True)
            engine.end(name)
        elif op == "unload" and listed:
            pod.ledger.forget(adapter)
            pod.sync()
            engine.model.unload(name)
        assert pod.ledger.residency.gpu_entries() == engine.model.gpu_entries()
        assert pod.ledger.residency.host_entries() == engine.model.host_entries()
        assert list(pod.gpu_adapters) == list(engine.model.on_gpu())
