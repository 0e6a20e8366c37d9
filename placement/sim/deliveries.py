"""The replay engine's deliveries from outside the fleet: events (a login, a pipeline
step) handed to the router, and pod faults (a restart, an outage) applied to the pods.

``EngineDeliveries`` is a part of ``FleetReplay`` (``placement.sim.engine``), whose
loop pops an ``EVENT`` or a ``FAULT`` off its heap and calls ``_event`` or ``_fault``
here; what they start (a preload, a request sent elsewhere, a pod wiped) runs through
the engine's own queue (``_pump``) and routing (``_route``). Owns no IO and no wall
clock.
"""

from __future__ import annotations

from heapq import heappush
from typing import TYPE_CHECKING, cast

from placement.domain import ActionKind
from placement.sim.events import SimEvent
from placement.sim.faults import DOWN, RESTART
from placement.sim.loads import EngineLoads
from placement.sim.pods import SimPod
from placement.sim.sim_log import FAULT, REJECTED

if TYPE_CHECKING:
    from placement.sim.engine import FleetReplay, SimRouter


class EngineDeliveries(EngineLoads):
    """Event and fault delivery for ``FleetReplay``; the attributes are the replay's."""

    events: list[SimEvent]
    pods: list[SimPod]
    index: dict[str, int]

    def _event(self, router: SimRouter, k: int, now_s: float) -> None:
        """An event, delivered: each Warmup it sends queues a preload on its pod (its
        Load is the same fetch: the engine model loads where the pod does not list it)."""
        event = self.events[k].event
        self.log.events.append(event.id)
        replay = cast("FleetReplay", self)  # this class is only ever a part of one
        for action in router.on_event(event, now_s, replay):
            p = self.index.get(str(action.pod))
            if action.kind is not ActionKind.WARMUP or p is None:
                continue
            pod = self.pods[p]
            adapter = str(action.adapter)
            pod.event_wanted.add(adapter)
            pod.queue.append(-1 - self._code(adapter))
            self._pump(p, now_s)

    def _fault(self, router: SimRouter, p: int, k: int, now_s: float) -> None:
        """A restart (or an outage's end) wipes the pod once its load in flight lands;
        an outage's start takes it out of routing and sends its queue elsewhere. The
        requests it runs finish either way."""
        pod = self.pods[p]
        kind = self.faults.steps[k].kind
        if kind != DOWN and pod.load_adapter is not None:
            heappush(self.heap, (self.load_end_s[p], FAULT, p, k))
            return
        if kind == DOWN:
            pod.healthy = False
            queued = [r for r in pod.queue if r >= 0]
            pod.queue.clear()
            pod.queue_depth = 0
            pod.waiting_adapters.clear()
            pod.event_wanted.clear()
            pod.warmups.clear()
            for r in queued:
                self.log.outcome[r] = REJECTED
                self.log.pod[r] = -1
                self._route(router, r, now_s)
            return
        pod.restart(now_s)
        if kind != RESTART:
            pod.healthy = True
        self._pump(p, now_s)

    # the engine's own (``FleetReplay``) --------------------------------------------

    def _route(self, router: SimRouter, r: int, now_s: float) -> None:
        raise NotImplementedError

    def _pump(self, p: int, now_s: float) -> None:
        raise NotImplementedError

    def _code(self, adapter: str) -> int:
        raise NotImplementedError
