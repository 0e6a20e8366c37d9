"""The ledger's per-request shortcuts change nothing a decision reads.

Every proxied request calls ``LivePod.note_use``, ``begin`` and ``end``. They now
skip work that cannot change the result: a GPU hit refreshes both LRUs without the
engine model's full ``request`` (``PodResidency.touch``), ``begin`` recomputes the
victim only when a key becomes busy, and ``end`` only when one stops being busy or the
request's last step moved the LRU order. Here random runs of every call the router
makes compare each shortcut with the work it skips: the fields a decision reads
(``free_slots``, ``victim_last_used_s``) with a from-scratch recomputation, ``touch``
with ``request`` on a copy of the same engine state, and ``gpu_victim`` with the plain
least-recently-used rule.
"""

from __future__ import annotations

import copy
from collections.abc import Collection

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.domain import AdapterId, Engine, PodId, PoolId
from placement.residency import EngineModel, Entry, PodResidency
from placement.router.live_pods import LivePod, Upstream

NAMES = tuple(AdapterId(name) for name in "abcdef")

_OPS = st.lists(
    st.tuples(
        st.sampled_from(("request", "end", "end_ran", "load", "reload", "forget", "listing")),
        st.sampled_from(NAMES),
    ),
    max_size=60,
)


def _pod(engine: Engine) -> LivePod:
    return LivePod(
        Upstream(
            pod=PodId("pod-0"),
            pool=PoolId("pool"),
            url="http://pod-0",
            engine=engine,
            served_model="base",
            max_loras=3,
            max_cpu_loras=4,
        )
    )


def _reference_victim_s(pod: LivePod) -> float:
    """``victim_last_used_s`` as ``LivePod._note_victim`` computes it from scratch."""
    victim = pod.ledger.next_victim(pod.busy.keys())
    return 0.0 if victim is None else pod.last_used_s.get(victim, 0.0)


@settings(max_examples=300, deadline=None)
@given(engine=st.sampled_from((Engine.VLLM, Engine.SGLANG)), ops=_OPS)
def test_the_fields_a_decision_reads_match_a_recomputation(
    engine: Engine, ops: list[tuple[str, AdapterId]]
) -> None:
    pod = _pod(engine)
    in_flight: list[tuple[AdapterId, Entry | AdapterId | None]] = []
    for step, (op, name) in enumerate(ops):
        now_s = float(step)
        if op == "request":
            if pod.ledger.is_listed(name):
                pod.note_use(name, now_s)
            in_flight.append((name, pod.begin(name)))
        elif op in ("end", "end_ran") and in_flight:
            adapter, held = in_flight.pop(step % len(in_flight))
            pod.end(adapter, held=held, ran=op == "end_ran")
        elif op in ("load", "reload"):
            pod.ledger.loaded(name, f"s3://{name}", changed=op == "reload", busy=pod.busy.keys())
            pod.sync()
        elif op == "forget":
            pod.ledger.forget(name)
            pod.sync()
        elif op == "listing":
            listed = {a: f"s3://{a}" for a in pod.ledger.registered() if a != name}
            pod.ledger.reconcile_listing(listed)
            pod.sync()
        assert pod.free_slots == pod.ledger.free_slots()
        assert pod.victim_last_used_s == _reference_victim_s(pod), (op, name)


def test_begin_and_end_move_the_victim_when_the_busy_keys_change() -> None:
    """A full pod: with every other slot busy, the adapter just sent is the victim until
    its request begins (then all are busy: the least recently used goes), and the victim
    moves again when a request that did not run (refused, failed over) leaves a slot."""
    pod = _pod(Engine.VLLM)
    a, b, c = NAMES[:3]
    for name in (a, b, c):
        pod.ledger.loaded(name, f"s3://{name}", changed=True)
    pod.sync()
    held = {}
    for now_s, name in ((1.0, a), (2.0, b), (3.0, c)):
        pod.note_use(name, now_s)
        held[name] = pod.begin(name)
    assert pod.victim_last_used_s == 1.0, "all busy: a, the least recently used"
    pod.end(b, held=held[b], ran=False)
    assert pod.victim_last_used_s == 2.0, "b's slot is idle now: b goes first"
    pod.end(a, held=held[a], ran=False)
    assert pod.victim_last_used_s == 1.0, "a's slot is idle and older than b's"
    pod.note_use(c, 4.0)
    held_again = pod.begin(c)  # c's second request: no key newly busy
    assert pod.victim_last_used_s == 1.0
    pod.end(c, held=held_again, ran=True)  # its last step: c stays the newest
    assert pod.victim_last_used_s == _reference_victim_s(pod) == 1.0


def _state(residency: PodResidency) -> tuple[object, ...]:
    return (
        residency.gpu_entries(),
        residency.host_entries(),
        dict(residency.listed),
        dict(residency.parked),
    )


@settings(max_examples=300, deadline=None)
@given(
    engine=st.sampled_from(tuple(EngineModel)),
    loads=st.lists(st.sampled_from(NAMES), max_size=12),
    unloads=st.lists(st.sampled_from(NAMES), max_size=3),
    asked=st.sampled_from(NAMES),
)
def test_touch_is_request_on_a_gpu_hit_and_changes_nothing_otherwise(
    engine: EngineModel, loads: list[AdapterId], unloads: list[AdapterId], asked: AdapterId
) -> None:
    residency = PodResidency(engine, max_loras=3, max_cpu_loras=4)
    for name in loads:
        if not residency.serves(name):
            try:
                residency.load(name, f"s3://{name}")
            except Exception:  # the cap refused it: nothing changed
                continue
        residency.request(name)
    for name in unloads:
        if name in residency.listed:
            residency.unload(name)
    before = _state(residency)
    other = copy.deepcopy(residency)
    if residency.touch(asked):
        effects = other.request(asked)
        assert effects.cold is effects.activated is False
        assert effects.gpu_evicted == effects.host_evicted == effects.unlisted == ()
        assert _state(residency) == _state(other)
    else:
        assert _state(residency) == before, "a refused touch changes nothing"
        assert not other.is_on_gpu(asked) or asked in other.parked


def _lru_victim(residency: PodResidency, busy: Collection[str | Entry]) -> str | None:
    """The least recently used unpinned slot not busy, else the least recently used
    unpinned one (the engine model's rule), by name and currency."""
    entries = list(residency._gpu)  # the entries themselves, for ``busy`` by entry
    if len(entries) < residency.max_loras:
        return None
    unpinned = [e for e in entries if e.name not in residency.pinned]
    free = [e for e in unpinned if e not in busy and e.name not in busy]
    chosen = free or unpinned
    return f"{chosen[0].name}:{chosen[0].entry_id}" if chosen else None


@settings(max_examples=300, deadline=None)
@given(
    loads=st.lists(st.sampled_from(NAMES), max_size=12),
    unloads=st.lists(st.sampled_from(NAMES), max_size=3),
    busy_names=st.sets(st.sampled_from(NAMES), max_size=3),
)
def test_gpu_victim_is_the_least_recently_used_slot_not_busy(
    loads: list[AdapterId], unloads: list[AdapterId], busy_names: set[AdapterId]
) -> None:
    residency = PodResidency(EngineModel.VLLM, max_loras=3, max_cpu_loras=4)
    for name in loads:
        if not residency.serves(name):
            residency.load(name, f"s3://{name}")
        residency.request(name)
    for name in unloads:
        if name in residency.listed:
            residency.unload(name)
            residency.load(name, f"s3://{name}")  # the old entry stays: a ghost
    for busy in (busy_names, {e for e in residency._gpu if e.name in busy_names}):
        victim = residency.gpu_victim(busy=busy)
        got = None if victim is None else f"{victim.name}:{victim.entry_id}"
        assert got == _lru_victim(residency, busy)
