"""The wait for a slot (``RoutingContext.slot_wait_s``): under vLLM's admission a load
drains nothing, and waits for a slot on a pod where it can take none (every slot's
adapter has requests running or queued: ``waits_for_slot``)."""

from __future__ import annotations

from policies.route_context import load_penalty_s, slot_wait_s, waits_for_slot
from policies.routing import PodSnapshot, RouteReason, route_bounded, victim_worth_s
from tests.policies.test_routing_ahead import WANTED, context, worth

WAIT_S = 0.25
#: Both pods full, the wanted adapter in both host caches. ``taken``'s slots both run
#: requests; ``open`` has one adapter idle (a slot a load can take now) and a request
#: more queued.
TAKEN = PodSnapshot(
    pod_id="taken",
    queue_depth=1,
    running=8,
    gpu_adapters=("a", "b"),
    registered=frozenset({WANTED, "a", "b"}),
    running_adapters=frozenset({"a"}),
    waiting_adapters=frozenset({"b"}),
    max_loras=2,
)
OPEN = PodSnapshot(
    pod_id="open",
    queue_depth=2,
    running=8,
    gpu_adapters=("c", "d"),
    registered=frozenset({WANTED, "c", "d"}),
    running_adapters=frozenset({"d"}),
    max_loras=2,
)
FREE = PodSnapshot(pod_id="free", free_slots=1, max_loras=2, gpu_adapters=("a",))


def test_a_load_waits_only_where_every_slot_is_taken() -> None:
    assert waits_for_slot(TAKEN)
    assert not waits_for_slot(OPEN)
    assert not waits_for_slot(FREE)


def test_the_wait_is_added_only_where_a_load_waits_and_only_when_asked() -> None:
    ctx = context((TAKEN, OPEN), slot_wait_s=WAIT_S)
    assert slot_wait_s(TAKEN, ctx) == WAIT_S
    assert slot_wait_s(OPEN, ctx) == 0.0
    assert slot_wait_s(TAKEN, context((TAKEN, OPEN))) == 0.0
    gap = load_penalty_s(TAKEN, ctx) - load_penalty_s(OPEN, ctx)
    assert abs(gap - WAIT_S * ctx.load_penalty_factor) < 1e-9


def test_without_a_slot_wait_every_pod_pays_the_same_load() -> None:
    ctx = context((TAKEN, OPEN))
    assert load_penalty_s(TAKEN, ctx) == load_penalty_s(OPEN, ctx)


def test_a_load_goes_where_it_can_take_a_slot_though_the_queue_is_longer() -> None:
    # Without the wait bounded affinity takes the shorter queue; with it, the pod whose
    # idle adapter gives the load a slot now.
    assert route_bounded(context((TAKEN, OPEN))).pod_id == "taken"
    decision = route_bounded(context((TAKEN, OPEN), slot_wait_s=WAIT_S))
    assert decision == type(decision)("open", RouteReason.LOAD)


def test_a_victims_reload_is_weighed_with_the_wait() -> None:
    victims = worth({"c": 1.0})
    plain = context((OPEN,), victims=victims)
    waited = context((OPEN,), victims=victims, slot_wait_s=WAIT_S)
    ratio = victim_worth_s(OPEN, waited) / victim_worth_s(OPEN, plain)
    assert abs(ratio - (plain.warm_load_s + WAIT_S) / plain.warm_load_s) < 1e-9


def test_the_callers_reading_of_a_slot_decides() -> None:
    # RoutingContext.slot_taken: the live router counts its own requests in flight (and
    # idle ghost slots), which the scrape behind waits_for_slot does not show. Read
    # with it, the open pod's idle adapter is taken and the taken pod's slot free, so
    # the load goes back to the shorter queue.
    flipped = context((TAKEN, OPEN), slot_wait_s=WAIT_S, slot_taken=lambda pod: pod is OPEN)
    assert slot_wait_s(OPEN, flipped) == WAIT_S
    assert slot_wait_s(TAKEN, flipped) == 0.0
    assert route_bounded(flipped).pod_id == "taken"
