"""A guess taken back puts back the host-cache entries its load pushed out in the model.

The router's ledger applies a plan's loads as guesses until the pod lists them. On vLLM
a load reads the weights into the host cache (``--max-cpu-loras``), dropping its oldest
entry (vllm/lora/worker_manager.py ``LRUCacheWorkerLoRAManager.add_adapter``); SGLang's
soft cap (``--max-loaded-loras``) unloads its least recently used adapter instead. When
the listing lacks the guess, or the pod answers "not found" for it, the load never
happened on the pod, so the confirmed names it pushed out never left: the ledger puts
them back, as it gives their GPU slots back (tests/router/test_ledger_ghost_slots.py),
unless the listing says since they are gone or a real load since pushed them out.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.ledger_fuzz import ReferencePod
from placement.domain import AdapterId, Outcome
from placement.residency import EngineModel
from placement.router.ledger import PodLedger

A, B, C, F, R = (AdapterId(name) for name in "abcfr")
G0, G1 = AdapterId("g0"), AdapterId("g1")


def listing(*names: AdapterId) -> dict[AdapterId, str]:
    return {name: f"s3://{name}" for name in names}


def serving(*names: AdapterId, max_loras: int = 1, max_cpu_loras: int = 2) -> PodLedger:
    """A vLLM pod that lists ``names`` and has run them in that order (oldest first)."""
    ledger = PodLedger(EngineModel.VLLM, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    ledger.reconcile_listing(listing(*names))
    for name in names:
        ledger.activate(name)
    return ledger


def _listing_lacks_it(ledger: PodLedger) -> None:
    ledger.reconcile_listing(listing(A, B))


def _pod_says_not_found(ledger: PodLedger) -> None:
    ledger.forget(G0)


@pytest.mark.parametrize(
    "take_back",
    [_listing_lacks_it, _pod_says_not_found],
    ids=["the listing lacks it", "the pod says not found"],
)
def test_a_guess_taken_back_leaves_what_it_pushed_out_in_the_host_cache(
    take_back: Callable[[PodLedger], None],
) -> None:
    """Host [a, b], b on the one GPU slot. The plan's g0 pushes a out of the host cache
    (the oldest) and b off the GPU in the model. Taken back, both are where they were:
    b on the GPU, a in host memory (a CPU hit, not a cold load). Before, only the GPU
    slot was given back and a read cold."""
    ledger = serving(A, B)
    ledger.seed(hot=(G0,), warm=(), plan_id="plan-1")
    assert ledger.classify(A) is Outcome.COLD_LOAD  # in the model, g0 pushed it out
    take_back(ledger)
    assert ledger.registered() == (A, B)
    assert ledger.classify(A) is Outcome.CPU_HIT
    assert ledger.classify(B) is Outcome.GPU_HIT


def test_a_confirmed_guess_leaves_what_it_pushed_out_gone() -> None:
    """The listing names g0: the controller loaded it, and a left the host cache for
    real. A later listing (the same names) puts nothing back."""
    ledger = serving(A, B)
    ledger.seed(hot=(G0,), warm=(), plan_id="plan-1")
    ledger.reconcile_listing(listing(A, B, G0))
    assert ledger.classify(A) is Outcome.COLD_LOAD
    ledger.reconcile_listing(listing(A, B, G0))
    assert ledger.classify(A) is Outcome.COLD_LOAD


def test_only_the_guess_taken_back_puts_back_what_it_pushed_out() -> None:
    """g0 pushed a out, g1 pushed b out. The listing names g0, not g1: b goes back, as
    the oldest entry; a stays out."""
    ledger = serving(A, B, C, max_cpu_loras=3)
    ledger.seed(hot=(), warm=(G0, G1), plan_id="plan-1")
    assert ledger.registered() == (C, G0, G1)
    ledger.reconcile_listing(listing(A, B, C, G0))
    assert ledger.registered() == (B, C, G0)
    assert ledger.classify(A) is Outcome.COLD_LOAD


def test_what_the_listing_says_is_gone_is_not_put_back() -> None:
    ledger = serving(A, B)
    ledger.seed(hot=(G0,), warm=(), plan_id="plan-1")
    ledger.reconcile_listing(listing(B))  # a was unloaded; g0 never loaded
    assert ledger.registered() == (B,)
    assert ledger.classify(A) is Outcome.COLD_LOAD


def test_a_real_load_since_pushed_out_the_oldest_name_on_the_pod() -> None:
    """Host [a, b]; g0 pushes a out in the model: [b, g0]. The router then loads r: the
    model pushes b out, the pod (without g0) pushes a, its oldest. Taken back, g0 puts
    back b, which the pod kept, not a."""
    ledger = serving(A, B)
    ledger.seed(hot=(G0,), warm=(), plan_id="plan-1")
    ledger.loaded(R, "s3://r", changed=True)
    assert ledger.registered() == (G0, R)
    ledger.reconcile_listing(listing(A, B, R))
    assert ledger.registered() == (B, R)
    assert ledger.classify(A) is Outcome.COLD_LOAD


def test_a_request_since_for_what_the_guess_pushed_out_was_a_hit_on_the_pod() -> None:
    """Host [a, b, c]; g0 pushes a out in the model. A request for a then reads it again
    in the model, pushing b out; on the pod it was a hit and b stayed: b goes back."""
    ledger = serving(A, B, C, max_cpu_loras=3)
    ledger.seed(hot=(G0,), warm=(), plan_id="plan-1")
    ledger.activate(A)
    assert ledger.registered() == (C, G0, A)
    ledger.forget(G0)
    assert set(ledger.registered()) == {A, B, C}


def test_a_name_put_back_older_than_another_guess_s_note_goes_first_on_the_pod() -> None:
    """Host [a, f], one GPU slot. The plan's warm c pushes a out, its hot g pushes f out.
    c is taken back: a goes back, as the oldest, while f stays noted under g. The router
    loads b: on the pod a, older than f, goes, as in the model. g taken back puts back
    f, not a. Before, the load was taken as dropping f, a was noted under g, and the
    ledger ended with a in host memory where the pod had f."""
    ledger = serving(A, F)
    ledger.seed(hot=(G0,), warm=(G1,), plan_id="plan-1")
    ledger.forget(G1)
    assert ledger.registered() == (A, G0)
    ledger.loaded(B, "s3://b", changed=True)
    ledger.reconcile_listing(listing(A, F, B))
    assert ledger.registered() == (F, B)
    assert ledger.classify(A) is Outcome.COLD_LOAD


def test_sglang_a_guess_taken_back_lists_again_what_its_soft_cap_parked() -> None:
    """SGLang's soft cap (2 loaded): g0's load parks a in the model. The pod answers
    "not found" for g0: a is listed again, and takes its GPU slot back."""
    ledger = PodLedger(EngineModel.SGLANG, max_loras=2, max_cpu_loras=2)
    ledger.reconcile_listing(listing(A, B))
    ledger.activate(A)
    ledger.activate(B)
    ledger.seed(hot=(), warm=(G0,), plan_id="plan-1")
    assert A in ledger.residency.parked
    ledger.forget(G0)
    assert set(ledger.registered()) == {A, B}
    assert ledger.is_listed(A)
    assert ledger.classify(A) is Outcome.GPU_HIT


# --- for any sequence: the host cache keeps its size and holds no absent name ----------

NAMES = [AdapterId(n) for n in ("a", "b", "c", "d", "e", "f")]

Step = tuple[str, tuple[int, ...]]
steps = st.lists(
    st.tuples(
        st.sampled_from(["seed", "list", "forget", "load", "request"]),
        st.lists(st.integers(0, len(NAMES) - 1), min_size=1, max_size=4).map(tuple),
    ),
    max_size=14,
)


def _host_size(ledger: PodLedger) -> int:
    residency = ledger.residency
    if ledger.engine is EngineModel.VLLM:
        return len(residency.host_entries())  # a ghost's entry holds its place too
    return len(residency.listed)  # SGLang's soft cap counts the names loaded


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([EngineModel.VLLM, EngineModel.SGLANG]),
    st.integers(1, 3),
    st.integers(0, 2),
    steps,
)
def test_the_host_cache_keeps_its_size_and_the_listing_s_word(
    engine: EngineModel, max_loras: int, spare: int, plan: list[Step]
) -> None:
    """Guesses seeded, confirmed (listed, or loaded by the router), taken back (the
    listing lacks them, the pod says "not found"), and requests between: the host cache
    never holds more than ``max_cpu_loras``, never a name the last listing lacked
    (unless loaded or requested since), and after each listing no bookkeeping of the
    guesses is left."""
    ledger = PodLedger(engine, max_loras=max_loras, max_cpu_loras=max_loras + spare)
    absent: set[AdapterId] = set(NAMES)
    for number, (kind, picks) in enumerate(plan):
        names = [NAMES[i] for i in picks]
        if kind == "seed":
            ledger.seed(hot=names[:2], warm=names[2:], plan_id=f"plan-{number}")
            absent.difference_update(names)
        elif kind == "list":
            ledger.reconcile_listing(listing(*names))
            absent = set(NAMES) - set(names)
            assert not ledger._unconfirmed and not ledger._host_displaced
        elif kind == "forget":
            ledger.forget(names[0])
        elif kind == "load":
            ledger.loaded(names[0], f"s3://{names[0]}", changed=True)
            absent.discard(names[0])
        else:
            ledger.activate(names[0])  # loaded by someone else, if the model lacks it
            absent.discard(names[0])
        assert _host_size(ledger) <= ledger.max_cpu_loras
        assert len(ledger.registered()) <= ledger.max_cpu_loras
        assert not absent & set(ledger.registered()), (kind, names, ledger.registered())


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(0, 2),
    st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
    st.lists(st.integers(0, 3), max_size=6),
    st.lists(st.integers(4, 5), min_size=1, max_size=2, unique=True),
)
def test_guesses_all_taken_back_leave_the_host_cache_as_it_was(
    max_loras: int, spare: int, listed: list[int], runs: list[int], planned: list[int]
) -> None:
    """vLLM: a pod lists some names and has run some; a plan's guesses, none of which the
    pod loaded, are seeded and then taken back by the same listing. The host cache holds
    the names it held before, in the same order (the LRU's next victims), and the GPU
    too. Before, a GPU slot given back moved its name to the newest host entry."""
    ledger = PodLedger(EngineModel.VLLM, max_loras=max_loras, max_cpu_loras=max_loras + spare)
    names = listing(*(NAMES[i] for i in listed))
    ledger.reconcile_listing(names)
    for i in runs:
        if NAMES[i] in names:
            ledger.activate(NAMES[i])
    host, gpu = ledger.registered(), ledger.active()
    guesses = [NAMES[i] for i in planned]
    ledger.seed(hot=guesses[:1], warm=guesses[1:], plan_id="plan-1")
    ledger.reconcile_listing(names)
    assert ledger.registered() == host
    assert ledger.active() == gpu


# --- for any sequence: no name the pod's real LRUs dropped ------------------------------


POD_NAMES = [AdapterId(n) for n in "abcdefg"]
pod_steps = st.lists(
    st.tuples(
        st.sampled_from(["seed", "list", "load", "request"]),
        st.lists(st.integers(0, len(POD_NAMES) - 1), min_size=1, max_size=2),
    ),
    max_size=16,
)


@settings(max_examples=600, deadline=None)
@given(st.integers(1, 2), st.integers(0, 2), pod_steps)
def test_the_ledger_holds_no_name_the_pod_dropped(
    max_loras: int, spare: int, plan: list[tuple[str, list[int]]]
) -> None:
    """vLLM: plans seeded that the controller never makes; the router loads, requests
    (a guess the pod lacks answers "not found") and reads listings. The ledger may miss
    a name the pod holds, never hold one it dropped: every confirmed name in the
    ledger's host cache is in the pod's. Before, a GPU slot given back moved its name to
    the newest host entry, and notes of two guesses taken back one at a time put back a
    name the pod had dropped. (Plans the controller makes, and the GPU set, are not
    checked: the ledger still errs there.)"""
    cap = max_loras + spare
    ledger = PodLedger(EngineModel.VLLM, max_loras=max_loras, max_cpu_loras=cap)
    pod = ReferencePod(gpu_slots=max_loras, host_slots=cap)  # the pod as it runs them
    for number, (kind, picks) in enumerate(plan):
        names = list(dict.fromkeys(POD_NAMES[i] for i in picks))
        name = names[0]
        if kind == "seed":
            fresh = [n for n in names if n not in pod.listed and not ledger.residency.serves(n)]
            ledger.seed(hot=fresh[:1], warm=fresh[1:], plan_id=f"plan-{number}")
        elif kind == "list":
            ledger.reconcile_listing(listing(*pod.listed))
        elif kind == "load":
            changed = name not in pod.listed
            if changed:
                pod.load(name)
            ledger.loaded(name, f"s3://{name}", changed=changed)
        elif name in pod.listed:
            pod.request(name)
            ledger.activate(name)
        elif ledger.residency.serves(name):  # a guess the pod lacks: "not found"
            ledger.activate(name)
            ledger.forget(name)
        guesses = {n for n in ledger._unconfirmed if n not in pod.listed}
        assert set(ledger.registered()) - guesses <= set(pod.host), (kind, names, pod.host)
