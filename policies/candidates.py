"""The candidate pre-filter: the few pods a routing decision needs to look at.

A decision over a whole pool costs time in proportion to the pool (every scorer in
``policies.routing`` reads every pod). Most pods cannot win it: for an adapter, the
pods that can are the ones the plan (or the hash ring) names, the ones holding the
adapter (on a GPU slot or in host RAM) or loading it, and the least-queued of the rest
(the cheapest place to pay a load). This module picks that set from indexes the caller
keeps current (which pods hold which adapter, the least-queued pods, the pod with the
least KV use), so that picking costs the size of the set, not of the pool.

What makes a decision over the candidates equal to the decision over the pool:

- the least-KV healthy pod is always a candidate, so ``routing.gate`` sees the same
  least KV use (the same reject and pressure tiers) and a healthy pod whenever there is
  one;
- every holder and every pod loading the adapter is a candidate, so coalescing, the
  pressure tier's holders and a warm pick are the same;
- every pod the caller names (the plan's pods, the ring's owners) is a candidate;
- candidates keep the pool's order, so ties break as they do over the whole pool.

So a decision that picks the minimum of a cost over pods picks the same pod whenever
that pod is a candidate; only a pick of a non-holder outside the least-queued few can
differ: where a victim's forecast worth, a rank made stale since the last refresh, or
a load under way decides the full scan's pick. The rank puts the queue before a load
under way, while the full scan adds them (a queued request's share of the batch plus
half a load): an idle pod that is loading can outrank a pod with one request queued
that the full scan would pick.

Pure: no IO, no clock, no state; the indexes arrive as values. Must not import
``placement``.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TypeVar

from policies.routing import PodLike

P = TypeVar("P", bound=PodLike)

#: How many least-queued pods join the candidates besides the holders and named pods.
DEFAULT_LEAST_QUEUED = 4


def least_queued(pods: Sequence[PodLike], *, count: int = DEFAULT_LEAST_QUEUED) -> tuple[int, ...]:
    """Positions of the ``count`` healthy pods where a load costs least, in nearly
    bounded affinity's order (``routing._bounded_best``; the module's docstring says
    where it differs): the shortest queue, then no load under way, then a free slot,
    then (on a full pod) the next victim idle longest, then the fewest running, then
    pool order. Refreshed by the caller when queues change.

    The ties matter most when the fleet is quiet: with every queue empty a rank by queue
    and pool order alone named the first ``count`` pods for every load, so the tail's
    loads could reach only those pods' slots. (Live on m-mid, 2026-12-02, fixing it
    moved the figures no more than the spread between runs.)"""
    ranked = heapq.nsmallest(
        count,
        (
            (
                pod.queue_depth,
                bool(pod.loading),
                pod.free_slots <= 0,
                pod.victim_last_used_s if pod.free_slots <= 0 else 0.0,
                pod.running,
                i,
            )
            for i, pod in enumerate(pods)
            if pod.healthy
        ),
    )
    return tuple(key[-1] for key in ranked)


def least_kv(pods: Sequence[PodLike]) -> int | None:
    """Position of the first healthy pod with the least KV use; None when none is
    healthy."""
    best, best_kv = None, 2.0
    for i, pod in enumerate(pods):
        if pod.healthy and pod.kv_usage < best_kv:
            best, best_kv = i, pod.kv_usage
    return best


def holder_positions(pods: Sequence[PodLike], adapter: str) -> set[int]:
    """Positions of the pods that hold ``adapter`` (GPU or host RAM) or are loading it:
    what the caller's index must return; a full scan, for building and checking it."""
    return {
        i
        for i, pod in enumerate(pods)
        if adapter in pod.registered or adapter in pod.gpu_adapters or adapter in pod.loading
    }


def candidates(
    pods: Sequence[P],
    *,
    holders: Collection[int],
    least_queued: Iterable[int],
    least_kv: int | None,
    named: Collection[str] = (),
    positions: Mapping[str, int],
) -> list[P]:
    """The candidate pods, in pool order.

    ``holders``: positions of the pods holding or loading the adapter; ``least_queued``
    and ``least_kv``: positions from the functions above (kept by the caller);
    ``named``: pod ids the decision must see (the plan's pods, the ring's owners), with
    ``positions`` mapping a pod id to its position (ids outside the pool are ignored).
    """
    chosen = set(holders)
    chosen.update(least_queued)
    if least_kv is not None:
        chosen.add(least_kv)
    for pod_id in named:
        at = positions.get(pod_id)
        if at is not None:
            chosen.add(at)
    return [pods[i] for i in sorted(chosen)]
