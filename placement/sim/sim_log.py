"""What one replay records, and the vocabulary its engine runs on.

``SimLog`` holds what happened to every request (its pod, outcome, TTFT, end) and to
every load, stay on a GPU slot, event and preload: ``placement.sim.figures`` reads it
for the metrics. The outcome codes (``GPU_HIT``, ``CPU_HIT``, ``COLD_LOAD``,
``REJECTED``) and the kinds of entry on the engine's heap live here so that the
engine (``placement.sim.engine``) and its load path (``placement.sim.loads``) share
them; ``placement.sim.engine`` re-exports them. Owns no IO.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The kinds of entry on the engine's heap of ``(time_s, kind, pod, request)``.
DONE, LOAD_DONE, RETRY, PLAN, EVENT, FAULT, WARMUP_DONE = 0, 1, 2, 3, 4, 5, 6
#: A request's outcome, ordered from the lightest: ``_charge_loads`` keeps the heavier.
GPU_HIT, CPU_HIT, COLD_LOAD, REJECTED = 0, 1, 2, -1


@dataclass
class SimLog:
    """What happened to every request and every load, for the metrics."""

    pod: list[int]
    outcome: list[int]
    ttft_ms: list[float]
    end_s: list[float]
    #: (start_s, end_s, pod index, from storage) per load.
    loads: list[tuple[float, float, int, bool]] = field(default_factory=list)
    residency_s: list[float] = field(default_factory=list)
    #: When each stay of ``residency_s`` ended (eviction, or the end of the replay).
    residency_end_s: list[float] = field(default_factory=list)
    plans: int = 0
    #: The ids of the events delivered, in order.
    events: list[str] = field(default_factory=list)
    #: Per load an event's Warmup started: whether a request for it reached its pod
    #: before it left the GPU (or the replay ended).
    preload_used: list[bool] = field(default_factory=list)
    #: When each of those loads started.
    preload_at_s: list[float] = field(default_factory=list)
    #: The requests the router refused outright (REJECT, a 503: EPP's saturation or
    #: the memory-pressure reject tier): shed, never served.
    shed: list[int] = field(default_factory=list)
    #: Class warm-ups sent (``RouteDecision.refresh``): each a short request that took
    #: a place in its pod's batch and refreshed its adapter's LRU place. One whose
    #: adapter had left the GPU by its turn is dropped (it would load: not sent).
    warmups: int = 0
