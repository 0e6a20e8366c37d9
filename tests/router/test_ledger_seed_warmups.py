"""A plan seeded into the router's ledger warms its hot set up only when the controller's
apply would (``placement.actuation.reconcile_replay.FleetReplay.hot_phase``).

The controller activates a pod's hot set again only when its own ledger (fed only its
own actions, not the router's traffic) lacks one of them on the GPU, or when it loads
onto the pod. A plan whose hot set on a pod is the last plan's, every name listed, makes
it do nothing there. The router had applied a warm-up of every hot name at every new
plan: a hot name the traffic had pushed off the GPU read as back on it, the router sent
it half the adapter's traffic as GPU hits, and each of those was an activation on the
pod that evicted another adapter (live on ServeGen m-mid, the busiest adapters moved
between their two planned pods after every plan tick).
"""

from __future__ import annotations

from placement.domain import AdapterId
from placement.residency import EngineModel
from placement.router.ledger import PodLedger

A, B, C, D = (AdapterId(name) for name in "abcd")


def serving() -> PodLedger:
    """Two GPU slots; a, b, c loaded in that order, so b and c are on the GPU; the first
    plan (hot b and c) seeded; then a request for a pushes b off."""
    ledger = PodLedger(EngineModel.VLLM, max_loras=2, max_cpu_loras=4)
    for name in (A, B, C):
        ledger.loaded(name, f"s3://{name}", changed=True)
    ledger.seed(hot=(B, C), warm=(A,), plan_id="plan-1")
    ledger.activate(A)
    assert ledger.active() == (C, A)
    return ledger


def test_the_same_hot_set_again_warms_nothing_up() -> None:
    ledger = serving()
    ledger.seed(hot=(B, C), warm=(A,), plan_id="plan-2")
    assert ledger.active() == (C, A)


def test_a_new_hot_name_warms_the_hot_set_up() -> None:
    ledger = serving()
    ledger.seed(hot=(B, A), warm=(C,), plan_id="plan-2")
    assert ledger.active() == (B, A)


def test_a_load_due_warms_the_hot_set_up_after_it() -> None:
    """vLLM activates every load, so the controller's own model loses its hot set to the
    warm load and activates the hot set last."""
    ledger = serving()
    ledger.seed(hot=(B, C), warm=(A, D), plan_id="plan-2")
    assert ledger.active() == (B, C)


def test_the_first_plan_seeded_warms_its_hot_set_up() -> None:
    """A router that starts meets pods the controller has just brought to the plan."""
    ledger = PodLedger(EngineModel.VLLM, max_loras=2, max_cpu_loras=4)
    for name in (A, B, C):
        ledger.loaded(name, f"s3://{name}", changed=True)
    ledger.seed(hot=(A, B), warm=(C,), plan_id="plan-1")
    assert ledger.active() == (A, B)
