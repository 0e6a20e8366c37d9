"""Guesses that push out guesses, and real calls over what guesses pushed out, on vLLM.

The router's ledger applies a plan's loads as guesses until the pod lists them; a guess
taken back gives back what it pushed out, in the host cache and on the GPU
(tests/router/test_ledger_guess_host_cache.py). Two cases that went wrong: a guess that
pushed out another guess (a chain), the later one taken back first, left the earlier
one out of the model while the pod still held what the earlier one had pushed out; and
a real load that pushed a noted name off the pod's GPU (the pod's least recently used
slot) left that name noted, so a guess taken back gave the slot back to a name the pod
no longer had on its GPU.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import AdapterId
from placement.residency import EngineModel
from placement.router.ledger import PodLedger

A, B, C, D, E, F, G, H = (AdapterId(name) for name in "abcdefgh")


def vllm(*, max_loras: int, max_cpu_loras: int, loads: tuple[AdapterId, ...]) -> PodLedger:
    """A vLLM pod the router loaded ``loads`` on, in that order."""
    ledger = PodLedger(EngineModel.VLLM, max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    for name in loads:
        ledger.loaded(name, f"s3://{name}", changed=True)
    return ledger


def test_a_guess_taken_back_puts_back_the_guess_it_pushed_out() -> None:
    """One host place, f in it. The plan's e, d, h each push out the one before. h taken
    back puts d back, so the router's load of d (on the pod, pushing f out) drops the
    guess in the model, and f with it from the notes: e taken back puts nothing back.
    Before, d stayed out, the load dropped nothing in the model, and e put back f, which
    the pod had dropped."""
    ledger = vllm(max_loras=1, max_cpu_loras=1, loads=(F,))
    ledger.seed(hot=(), warm=(E, D, H), plan_id="plan-1")
    ledger.forget(H)
    assert ledger.registered() == (D,)
    ledger.loaded(D, "s3://d", changed=True)
    ledger.forget(E)
    assert ledger.registered() == (D,)
    assert ledger.active() == (D,)


def test_a_real_load_pushes_the_noted_name_off_the_pod_s_gpu() -> None:
    """One GPU slot. Host [g, c], c on the GPU. The plan's e pushes g out of the host
    cache and c off the GPU. The router loads a: on the pod it pushes g out and c off
    the GPU. A request for e (the pod answers "not found") pushes a off in the model; e
    taken back gives the slot back to a, not to c, which is in host memory only. Before,
    the slot went back to c, noted as e's since e's load."""
    ledger = vllm(max_loras=1, max_cpu_loras=2, loads=(G, C))
    ledger.seed(hot=(), warm=(E,), plan_id="plan-1")
    ledger.loaded(A, "s3://a", changed=True)
    ledger.activate(E)
    ledger.forget(E)
    assert ledger.registered() == (C, A)
    assert ledger.active() == (A,)


def test_slots_given_back_one_guess_at_a_time_keep_the_pod_s_order() -> None:
    """Two slots, h then d. The plan's c pushes h off, g pushes d off. c taken back
    gives h its slot, g then d hers: h stays the older, and the router's load of b
    pushes h off, as on the pod. Before, d went back as the oldest slot, before h."""
    ledger = vllm(max_loras=2, max_cpu_loras=4, loads=(H, D))
    ledger.seed(hot=(), warm=(C, G), plan_id="plan-1")
    ledger.forget(C)
    ledger.forget(G)
    assert ledger.active() == (H, D)
    ledger.loaded(B, "s3://b", changed=True)
    assert ledger.active() == (D, B)


def test_a_guess_pushed_out_by_a_guess_taken_back_goes_back_on_the_gpu() -> None:
    """One slot, host of two, c on the pod. The plan's g pushes c off the GPU, then a
    hot h pushes g off. h taken back gives g its slot back, so the router's load of a
    pushes g off in the model, as it pushes c off on the pod: g taken back then gives c
    nothing. Before, h's slot was left free, the load pushed nothing off in the model,
    and c took its slot back."""
    ledger = vllm(max_loras=1, max_cpu_loras=3, loads=(C,))
    ledger.seed(hot=(), warm=(G,), plan_id="plan-1")
    ledger.seed(hot=(), warm=(H,), plan_id="plan-2")
    ledger.forget(H)
    assert ledger.active() == (G,)
    ledger.loaded(A, "s3://a", changed=True)
    ledger.forget(G)
    assert ledger.active() == (A,)


# --- for any chain of guesses taken back one at a time: host and GPU as they were ------

NAMES = [AdapterId(n) for n in "abcd"]
GUESSES = [AdapterId(n) for n in "efgh"]


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 3),
    st.integers(0, 2),
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=6),
    st.lists(
        st.tuples(st.sampled_from(GUESSES), st.booleans()),
        min_size=1,
        max_size=4,
        unique_by=lambda t: t[0],
    ),
    st.permutations(range(4)),
)
def test_guesses_taken_back_one_at_a_time_leave_host_and_gpu_as_they_were(
    max_loras: int,
    spare: int,
    runs: list[AdapterId],
    plans: list[tuple[AdapterId, bool]],
    order: list[int],
) -> None:
    """The router loads and runs some names; plans seed guesses, one a plan (hot or
    warm), each free to push out the ones before; the pod says "not found" for each,
    in any order. The host cache and the GPU hold what they held before, in the same
    order. Before, a guess pushed out by a later one stayed out when the later one was
    taken back, and what it had pushed out was never put back."""
    ledger = PodLedger(EngineModel.VLLM, max_loras=max_loras, max_cpu_loras=max_loras + spare)
    for name in runs:
        if ledger.residency.serves(name):
            ledger.activate(name)
        else:
            ledger.loaded(name, f"s3://{name}", changed=True)
    host, gpu = ledger.registered(), ledger.active()
    for number, (guess, hot) in enumerate(plans):
        ledger.seed(hot=(guess,) if hot else (), warm=() if hot else (guess,), plan_id=f"p{number}")
    for index in order:
        if index < len(plans):
            ledger.forget(plans[index][0])
    assert ledger.registered() == host
    assert ledger.active() == gpu


def test_a_load_the_pod_answers_it_had_moves_no_place() -> None:
    """Host [g, a]. The plan's d pushes g out, its e pushes d and a out. d taken back
    puts g back; the router's load of g is answered "already loaded", which moves
    nothing on the pod. e taken back puts a back behind g, as on the pod. Before, the
    answer dropped g's place, and a went back as the oldest."""
    ledger = vllm(max_loras=1, max_cpu_loras=2, loads=(G, A))
    ledger.seed(hot=(D, E), warm=(), plan_id="plan-1")
    ledger.forget(D)
    ledger.loaded(G, "s3://g", changed=False)
    ledger.forget(E)
    assert ledger.registered() == (G, A)


def test_a_pinned_guess_a_full_hard_cap_refuses_is_no_guess_and_no_error() -> None:
    # SGLang with the hard cap: a pinned, one real load fill both places; the next plan
    # pins c. Its pinned load is refused for the pins, the unpinned one for the cap.
    # Before, the second refusal escaped seed, and with it the router's topology swap.
    ledger = PodLedger(EngineModel.SGLANG_HARD_CAP, max_loras=2, max_cpu_loras=2)
    ledger.seed(hot=[AdapterId("a")], warm=[], pinned=[AdapterId("a")], plan_id="p1")
    ledger.loaded(AdapterId("b"), "s3://b", changed=True)
    ledger.seed(hot=[AdapterId("c")], warm=[], pinned=[AdapterId("c")], plan_id="p2")
    assert "c" not in ledger.registered()
    assert set(ledger.registered()) == {"a", "b"}


def test_a_slot_a_later_guess_took_is_given_back_when_that_guess_is() -> None:
    """Two slots, a host cache of three; e and b on both. The plan's warm h, c, a push
    e, then b off the GPU and out of the host cache. c taken back puts e back in host
    memory and leaves b's slot waiting on a, as b's weights do; the next plan's hot f
    takes the slot the model has free, which on the pod b holds. a taken back gives h
    its slot and puts b back in host memory, with b's slot held by f. The router's load
    of h (on the pod it pushes e off, the oldest slot) and f taken back leave b and h on
    the GPU, as on the pod. Before, b's slot was dropped when a was taken back, and f
    taken back gave the slot to e."""
    ledger = vllm(max_loras=2, max_cpu_loras=3, loads=(E, B))
    ledger.seed(hot=(), warm=(H, C, A), plan_id="plan-1")
    ledger.forget(C)
    ledger.seed(hot=(F,), warm=(), plan_id="plan-2")
    ledger.forget(A)
    ledger.loaded(H, "s3://h", changed=True)
    ledger.forget(F)
    assert ledger.registered() == (E, B, H)
    assert ledger.active() == (B, H)


def test_a_real_load_into_a_slot_the_model_had_free_pushes_off_the_pod_s_oldest() -> None:
    """Three slots, a host cache of four; d, g, f on both. The plan's hot c, h, b push
    d, g, f off the GPU, and d, g out of the host cache (g's weights, and so its slot,
    wait on b). h, then c taken back give d its slot back as the oldest; the model's
    other free slot is g's on the pod. The router's load of h takes it in the model,
    and on the pod pushes off d, the oldest: the model pushes d off too. Before, d
    stayed on the ledger's GPU, and b taken back left g off it."""
    ledger = vllm(max_loras=3, max_cpu_loras=4, loads=(D, G, F))
    ledger.seed(hot=(C, H, B), warm=(), plan_id="plan-1")
    ledger.forget(H)
    ledger.forget(C)
    ledger.loaded(H, "s3://h", changed=True)
    assert ledger.active() == (B, H)
    ledger.forget(B)
    assert ledger.registered() == (D, G, F, H)
    assert ledger.active() == (G, F, H)
