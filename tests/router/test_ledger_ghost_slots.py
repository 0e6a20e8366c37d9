"""The router's ledger names the slot a load would free, as the engine model picks it,
when a pod holds several leftover (ghost) slots of one unloaded name.

On vLLM an unload frees nothing: the old entry keeps its GPU slot under its old id
(vllm/entrypoints/openai/models/serving.py ``unload_lora_adapter``), and loading the
name again gives a new id. Unloaded twice, a name leaves two ghosts. A request still
running on one of them keeps that slot only (the scheduler counts a batch's LoRAs by
id, vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``); the other ghost is idle
and goes first. ``PodLedger.next_victim`` must say so (None: a load here loses
nothing), and the load must then evict exactly what it named.
"""

from __future__ import annotations

from collections.abc import Collection

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import AdapterId, Engine, Outcome, PodId, PoolId
from placement.residency import EngineModel, Entry
from placement.router.ledger import PodLedger
from placement.router.live_pods import LivePod, Upstream

A, C, D = (AdapterId(name) for name in "acd")


def live_pod(*, max_loras: int, max_cpu_loras: int) -> LivePod:
    return LivePod(
        Upstream(
            pod=PodId("pod-0"),
            pool=PoolId("pool"),
            url="http://pod-0",
            engine=Engine.VLLM,
            served_model="base",
            max_loras=max_loras,
            max_cpu_loras=max_cpu_loras,
        )
    )


def test_an_idle_ghost_goes_first_though_another_ghost_of_its_name_runs() -> None:
    pod = live_pod(max_loras=3, max_cpu_loras=8)
    ledger = pod.ledger
    ledger.loaded(C, "s3://c", changed=True)
    ledger.forget(C)  # c's first entry keeps its slot: a ghost, idle
    ledger.loaded(C, "s3://c", changed=True)
    pod.note_use(C, 0.0)
    held = pod.begin(C)  # runs on c's second entry
    assert isinstance(held, Entry)
    ledger.forget(C)  # the second entry is a ghost too, and its request runs on
    ledger.loaded(A, "s3://a", changed=True, busy=pod.busy.keys())
    assert ledger.residency.gpu_entries() == (("c", False), ("c", False), ("a", True))
    assert ledger.next_victim(pod.busy.keys()) is None, "c's idle first entry goes"
    ledger.loaded(D, "s3://d", changed=True, busy=pod.busy.keys())
    assert ledger.residency.gpu_entries() == (("c", False), ("a", True), ("d", True))
    assert ledger.active() == ("a", "d"), "a stayed, as the ledger said it would"


def test_with_the_older_ghost_running_the_newer_one_goes() -> None:
    pod = live_pod(max_loras=3, max_cpu_loras=8)
    ledger = pod.ledger
    ledger.loaded(C, "s3://c", changed=True)
    pod.note_use(C, 0.0)
    pod.begin(C)  # runs on c's first entry
    ledger.forget(C)
    ledger.loaded(C, "s3://c", changed=True, busy=pod.busy.keys())
    ledger.forget(C)  # c's second entry: a ghost nobody runs on
    ledger.loaded(A, "s3://a", changed=True, busy=pod.busy.keys())
    assert ledger.next_victim(pod.busy.keys()) is None
    ledger.loaded(D, "s3://d", changed=True, busy=pod.busy.keys())
    assert ledger.active() == ("a", "d")
    assert ledger.residency.ghosts_on_gpu() == 1


# --- for any sequence: the victim named is the slot the next load frees ----------------

NAMES = [AdapterId(n) for n in "ab"]
Step = tuple[str, int]


def _gpu_slots(ledger: PodLedger) -> list[tuple[str, bool]]:
    return list(ledger.residency.gpu_entries())


def _drive(ledger: PodLedger, steps: list[Step]) -> set[Entry]:
    """Loads, unloads and requests (some kept running, by entry); returns what runs."""
    running: set[Entry] = set()
    for kind, i in steps:
        name = NAMES[i]
        if kind == "load" and not ledger.residency.serves(name):
            ledger.loaded(name, f"s3://{name}", changed=True, busy=running)
        elif kind == "unload":
            ledger.forget(name)
        elif kind == "run" and ledger.residency.serves(name):
            ledger.activate(name, busy=running)
            entry = ledger.entry(name)
            if entry is not None:
                running.add(entry)
    return running


@settings(max_examples=400, deadline=None)
@given(
    st.integers(2, 3),
    st.lists(st.tuples(st.sampled_from(["load", "unload", "run"]), st.integers(0, 1)), max_size=16),
)
def test_the_named_victim_is_the_slot_a_load_frees(max_loras: int, steps: list[Step]) -> None:
    ledger = PodLedger(EngineModel.VLLM, max_loras=max_loras, max_cpu_loras=64)
    running: Collection[Entry] = _drive(ledger, steps)
    before = _gpu_slots(ledger)
    predicted = ledger.next_victim(running)
    ledger.loaded(AdapterId("new"), "s3://new", changed=True, busy=running)
    after = _gpu_slots(ledger)
    if len(before) < max_loras:
        assert predicted is None, "a free slot: nothing goes"
        return
    gone = next(i for i, slot in enumerate(before) if i >= len(after) - 1 or after[i] != slot)
    name, listed = before[gone]
    assert predicted == (AdapterId(name) if listed else None), (before, after)


# --- a plan's guesses the pod never listed leave no ghost ------------------------------

PLANNED = [AdapterId(n) for n in ("p0", "p1", "p2", "p3")]


@given(st.sampled_from([EngineModel.VLLM, EngineModel.SGLANG]), st.integers(0, 4))
def test_a_guess_the_listing_lacks_leaves_no_slot_taken(engine: EngineModel, listed: int) -> None:
    """A router started with a plan seeds the controller's loads as guesses. When the
    pod's first listing lacks some (the controller has not reached it, or the load
    failed), the pod never gave them a slot: they are taken back, not unloaded, so on
    vLLM no ghost is left and the slots read free. Before, a fresh empty vLLM pod read
    full (``free_slots`` 0) from the plan alone."""
    ledger = PodLedger(engine, max_loras=4, max_cpu_loras=8)
    ledger.seed(hot=PLANNED, warm=(), plan_id="plan-1")
    ledger.reconcile_listing({a: f"s3://{a}" for a in PLANNED[:listed]})
    assert ledger.residency.ghosts_on_gpu() == 0
    assert sorted(ledger.registered()) == sorted(PLANNED[:listed])
    assert ledger.free_slots() == 4 - len(ledger.active())
    for adapter in PLANNED[listed:]:
        assert not ledger.residency.serves(adapter)
        assert ledger.classify(adapter) is Outcome.COLD_LOAD


def test_an_unload_of_a_confirmed_name_still_leaves_its_ghost() -> None:
    """The other side: a name the pod listed, then no longer lists, was unloaded; on
    vLLM its slot stays (vllm/entrypoints/openai/models/serving.py
    ``unload_lora_adapter`` frees nothing)."""
    ledger = PodLedger(EngineModel.VLLM, max_loras=4, max_cpu_loras=8)
    ledger.seed(hot=PLANNED[:2], warm=(), plan_id="plan-1")
    ledger.reconcile_listing({a: f"s3://{a}" for a in PLANNED[:2]})
    ledger.reconcile_listing({PLANNED[0]: "s3://p0"})
    assert ledger.residency.ghosts_on_gpu() == 1
    assert ledger.free_slots() == 2


def test_a_guess_taken_back_gives_the_slot_back_to_what_it_pushed_off() -> None:
    """A pod serving a and b gets the next plan's guesses: in the model their loads and
    warm-ups push a and b off the GPU. The listing then lacks the guesses (the
    controller has not reached the pod): on the pod a and b never left the GPU, so the
    model gives their slots back, and no slot reads free."""
    a, b = AdapterId("a"), AdapterId("b")
    ledger = PodLedger(EngineModel.VLLM, max_loras=2, max_cpu_loras=8)
    ledger.reconcile_listing({a: "s3://a", b: "s3://b"})
    ledger.activate(a)
    ledger.activate(b)
    ledger.seed(hot=PLANNED[:2], warm=(), plan_id="plan-2")
    assert set(ledger.active()) == set(PLANNED[:2])
    ledger.reconcile_listing({a: "s3://a", b: "s3://b"})
    assert ledger.active() == (a, b)
    assert ledger.free_slots() == 0
    assert ledger.classify(a) is Outcome.GPU_HIT
    assert ledger.residency.ghosts_on_gpu() == 0


@given(st.sampled_from([EngineModel.VLLM, EngineModel.SGLANG]))
def test_a_guess_the_pod_says_it_lacks_is_taken_back_too(engine: EngineModel) -> None:
    """The proxy's "not found" for a guess (``forget``) takes it back as the listing
    does: no vLLM ghost is left behind, now or after the next listing."""
    ledger = PodLedger(engine, max_loras=2, max_cpu_loras=8)
    ledger.seed(hot=PLANNED[:2], warm=(), plan_id="plan-1")
    ledger.forget(PLANNED[0])
    assert ledger.residency.ghosts_on_gpu() == 0
    assert ledger.free_slots() == 1
    ledger.reconcile_listing({})
    assert ledger.free_slots() == 2


def test_sglang_guesses_the_soft_cap_parked_are_taken_back() -> None:
    """SGLang's soft cap (``--max-loaded-loras`` 2) parks two of four guesses in the
    model; an empty listing takes all four back: none is served."""
    ledger = PodLedger(EngineModel.SGLANG, max_loras=2, max_cpu_loras=2)
    ledger.seed(hot=PLANNED, warm=(), plan_id="plan-1")
    ledger.reconcile_listing({})
    assert not any(ledger.residency.serves(a) for a in PLANNED)
    assert ledger.free_slots() == 2


def test_a_slot_goes_back_to_what_the_guess_taken_back_pushed_off() -> None:
    """Two guesses: g0 listed (the controller loaded it, pushing a off for real), g1
    not (it pushed b off in the model only). b gets g1's slot back; a stays off."""
    a, b = AdapterId("a"), AdapterId("b")
    ledger = PodLedger(EngineModel.VLLM, max_loras=2, max_cpu_loras=8)
    ledger.reconcile_listing({a: "s3://a", b: "s3://b"})
    ledger.activate(a)
    ledger.activate(b)
    ledger.seed(hot=PLANNED[:2], warm=(), plan_id="plan-2")
    ledger.reconcile_listing({a: "s3://a", b: "s3://b", PLANNED[0]: "s3://p0"})
    assert set(ledger.active()) == {PLANNED[0], b}
    assert ledger.free_slots() == 0
