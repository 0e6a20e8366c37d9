"""The replay engine's deliveries from outside the fleet: events (a login, a pipeline
step) handed to the router, and pod faults (a restart, an outage) applied to the pods.

``EngineDeliveries`` is a part of ``FleetReplay`` (``placement.sim.engine``), whose
loop pops an ``EVENT`` or a ``FAULT`` off its heap, asks the router for an event's
actions, and calls ``_preload_for_event`` or ``_fault`` here; what they start (a
preload, a pod wiped) runs through the engine's queue (``_pump``), and the requests an
outage turns away go back to the engine's routing. Owns no IO and no wall clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from heapq import heappush

from placement.domain import Action, ActionKind
from placement.sim.events import SimEvent
from placement.sim.faults import DOWN, RESTART
from placement.sim.loads import EngineLoads
from placement.sim.sim_log import FAULT, REJECTED


class EngineDeliveries(EngineLoads):
    """Event and fault delivery for ``FleetReplay``; the attributes are the replay's."""

    events: list[SimEvent]
    index: dict[str, int]

    def _preload_for_event(self, actions: Iterable[Action], now_s: float) -> None:
        """An event's actions, delivered: each Warmup queues a preload on its pod (its
        Load is the same fetch: the engine model loads where the pod does not list it)."""
        for action in actions:
            p = self.index.get(str(action.pod))
            if action.kind is not ActionKind.WARMUP or p is None:
                continue
            pod = self.pods[p]
            adapter = str(action.adapter)
            pod.event_wanted.add(adapter)
            pod.queue.append(-1 - self._code(adapter))
            self._pump(p, now_s)

    def _fault(self, p: int, k: int, now_s: float) -> list[int]:
        """A restart (or an outage's end) wipes the pod once its load in flight lands;
        an outage's start takes it out of routing and returns the requests queued
        there, unrouted, for the engine to send elsewhere. The requests it runs finish
        either way."""
        pod = self.pods[p]
        kind = self.faults.steps[k].kind
        if kind != DOWN and pod.load_adapter is not None:
            heappush(self.heap, (self.load_end_s[p], FAULT, p, k))
            return []
        if kind == DOWN:
            pod.healthy = False
            queued = [r for waiting in pod.passed.values() for r in waiting]
            queued += [r for r in pod.queue if r >= 0]
            pod.passed.clear()
            pod.queue.clear()
            pod.queue_depth = 0
            pod.waiting_adapters.clear()
            pod.queued_since.clear()
            pod.event_wanted.clear()
            pod.warmups.clear()
            for r in queued:
                self.log.outcome[r] = REJECTED
                self.log.pod[r] = -1
            return queued
        pod.restart(now_s)
        if kind != RESTART:
            pod.healthy = True
        self._pump(p, now_s)
        return []

    # the engine's own (``FleetReplay``) --------------------------------------------

    def _code(self, adapter: str) -> int:
        raise NotImplementedError
