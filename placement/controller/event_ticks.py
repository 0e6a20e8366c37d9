"""The controller's event tick: a webhook event's preloads, decided now, sent in the
background; and the landings every tick notes.

``EventTicks`` adds to ``placement.controller.runtime.ControllerRuntime`` what an event
needs: ``on_event`` (the pure ``event_preloads`` over each pod's view), the background
run of its actions, the pods' views from the ledger's engine model with their idle
times, and ``_note_landings`` (when this process's loads and warm-ups landed), which
the plan, preload and watchdog ticks of ``placement.controller.ticks.Controller`` call
too. The rules every tick keeps are in ``placement.controller.ticks``'s docstring; that
module imports this one, never the other way. No decisions here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from placement.actuation.executor import ApplyReport, Status
from placement.controller.ports import idle_times
from placement.controller.runtime import ControllerRuntime
from placement.domain import Action, ActionKind, AdapterId, PodId
from placement.errors import LorafleetError
from placement.forecast.event_preloads import Event, EventDecision, PodView, event_preloads
from placement.residency import EngineModel, engine_model

logger = logging.getLogger(__name__)

#: The actions after which an adapter has just been on its pod's GPU.
_LANDS = frozenset({ActionKind.LOAD, ActionKind.WARMUP})


class EventTicks(ControllerRuntime):
    """The event tick and the landings; ``placement.controller.ticks.Controller`` adds
    the other ticks."""

    async def on_event(self, event: Event) -> EventDecision:
        """A webhook event's preloads, decided now and sent in the background."""
        views = await self._views(used_s=await self._recent_use())
        busy = {name: d.mean_rps for name, d in (self.state.demand or {}).items()}
        decision = event_preloads(
            event,
            (self.state.predictor or self.ports.predictor)(event),
            catalog=self.ports.catalog,
            fleet=self.fleet,
            plan=self.state.plan,
            views=views,
            busy_rps=busy,
            max_loads=self.settings.controller.max_loads_per_event,
        )
        if decision.actions:
            task = asyncio.get_running_loop().create_task(self._run_event(decision.actions))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return decision

    async def _run_event(self, actions: tuple[Action, ...]) -> None:
        """An event's preloads, in the background: whatever fails is logged (with the
        pods it concerns) and counted; nothing escapes the task."""
        pods = ", ".join(sorted({str(a.pod) for a in actions}))
        try:
            async with self._actuation:
                self._fence()
                self.state.ledger.track_pods(self.fleet.pods)  # each action reaches its model
                report = await self.ports.actuator.run(
                    actions, fleet=self.fleet, ledger=self.state.ledger
                )
            self._note_landings(report)
            self.metrics.applied(report)
            await self.persist()
        except asyncio.CancelledError:
            logger.warning("event preloads on %s stopped: this replica lost the lease", pods)
        except Exception as exc:
            self.metrics.error("event", exc)
            expected = isinstance(exc, LorafleetError | OSError)
            logger.warning(
                "event preloads on %s failed: %s: %s",
                pods,
                type(exc).__name__,
                exc,
                exc_info=not expected,
            )

    def _note_landings(self, report: ApplyReport) -> None:
        """Remember when this process's loads and warm-ups landed (the idle times'
        other half: the controller's own warm-ups go to the pods, not the router)."""
        now_s, pods = self.clock(), {pod.name for pod in self.fleet.pods}
        landed = self.state.landed_s
        for gone in set(landed) - pods:
            del landed[gone]
        for result in report.results:
            action = result.action
            if result.status is Status.DONE and action.pod in pods and action.kind in _LANDS:
                landed.setdefault(action.pod, {})[action.adapter] = now_s

    async def _recent_use(self) -> Mapping[PodId, Mapping[AdapterId, float]] | None:
        """When each pod last served each adapter, read now; None without a source, or
        when it fails (logged and counted: the event is decided without idle times)."""
        source = self.ports.recent_use
        if source is None:
            return None
        try:
            return await asyncio.to_thread(source)
        except Exception as exc:
            self.metrics.error("recent_use", exc)
            logger.warning("event decided without idle times: %s", exc, exc_info=True)
            return None

    async def _views(
        self, *, used_s: Mapping[PodId, Mapping[AdapterId, float]] | None = None
    ) -> dict[PodId, PodView]:
        """Each pod as the ledger's engine model has it, for the event preloads: the
        names it lists, its GPU slots least recently used first (a slot an unloaded
        name's entry holds on vLLM included, as ``?unloaded-N``: not free, and the
        cheapest victim) and the pins the engine keeps on the GPU (SGLang's; vLLM has
        none over HTTP, so its victim is always the least recently used slot). A pod the
        ledger has not seen yet shows what the plan put there.

        With ``used_s`` (the request log's last use per pod and adapter) each view has
        the idle times of its slots, since their last request or this process's last
        landing (``ports.idle_times``). Without it, none: a landing alone would call an
        adapter idle that traffic nobody logged keeps busy."""
        catalog_pins = frozenset(a.name for a in self.ports.catalog.adapters if a.pinned)
        ledger = self.state.ledger
        views = {}
        for pod in self.fleet.pods:
            model = ledger.pods.get(pod.name)
            slots = ledger.gpu_order(pod.name)
            if model is not None and slots is not None:
                registered = frozenset(AdapterId(a) for a in model.listed)
                hot, pinned = slots, frozenset(AdapterId(a) for a in model.pinned)
            else:
                planned = self.state.plan.pods.get(pod.name) if self.state.plan else None
                registered = frozenset(planned.registered) if planned else frozenset()
                hot = tuple(planned.hot[-pod.max_loras :]) if planned and pod.max_loras else ()
                vllm = engine_model(pod.engine) is EngineModel.VLLM
                pinned = frozenset() if vllm else catalog_pins | ledger.pins(pod.name)
            idle_s = (
                {}
                if used_s is None
                else idle_times(
                    hot,
                    used_s=used_s.get(pod.name, {}),
                    landed_s=self.state.landed_s.get(pod.name, {}),
                    now_s=self.clock(),
                )
            )
            views[pod.name] = PodView(
                pod=pod, registered=registered, hot=hot, pinned=pinned, idle_s=idle_s
            )
        return views
