"""The controller's ticks: ingest, forecast, plan and apply, timed preloads, watchdog.

``Controller`` adds the ticks to ``placement.controller.runtime.ControllerRuntime``
(the state, the lease, the guards, the saved state), by way of
``placement.controller.event_ticks.EventTicks`` (the webhook events' preloads, and the
landings every tick notes). Each tick is a plain coroutine
over ports (``ControllerPorts``) and the controller's own state, so tests call a tick
directly with in-memory twins and a fake clock; the scheduler wiring
(``placement.controller.schedule``) only decides when ticks run.

Rules every tick keeps:

- Only the lease holder acts; a standby's ticks return ``TickOutcome.STANDBY``.
- Every write (loads sent to pods, the plan, the hot sets, the saved state) is fenced:
  ``_fence`` raises ``LeadershipLostError`` unless the lease is held with time to spare
  for the write, so a leader deposed mid-solve publishes nothing. A lease tick that
  finds the lease lost cancels every job in flight.
- A failed tick leaves the last good plan in force and backs off: ``Backoff`` per job
  doubles its wait up to a cap. A clock that jumps back never strands a job: a
  retry time further ahead than the cap is treated as due. Whatever a tick raises is
  logged, counted (``ControllerObserver.error``) and backed off from; the job goes on.
- Pod actions never run concurrently (one lock for the plan, the preloads, the
  watchdog and the webhook), so the ledger always matches what was sent.
- After every change on the pods, the last plan and the ledger are saved
  (``StateStore``); a restarted controller loads them and sends no load twice.
- The catalog may change under a running controller: each ingest re-reads the file
  when its bytes changed and resolves the adapters the traffic names but the catalog
  lacks (``placement.controller.surprises``); a bad new catalog is refused and the
  last good one kept.

The decisions themselves are the pure modules' (``solver``, ``reconcile``,
``events``); this module sequences them and does the IO through the ports.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from placement.controller.event_ticks import EventTicks
from placement.controller.ports import (
    DONE_PRELOADS_KEPT,
    TickOutcome,
    preload_key,
    tiers_moved,
)
from placement.controller.surprises import newcomer_floor
from placement.domain import Action, AdapterId, Fleet, Load, PodId, Pool, Warmup
from placement.errors import (
    ForecastError,
)
from placement.forecast.scoring import IssuedForecast, score_due
from placement.inputs.request_log import RequestLog
from placement.solver.problem import Demand

logger = logging.getLogger(__name__)


class Controller(EventTicks):
    """The ticks; built by the entry point, driven by the scheduler."""

    async def ingest(self) -> TickOutcome:
        history = await asyncio.to_thread(self.ports.history)
        self.state.history = history
        self.metrics.history_skipped(history.skipped_rows, unread_files=len(history.unread_files))
        if history.skipped_rows:
            logger.warning(
                "history %s: %d faulty rows left out: %s",
                history.source,
                history.skipped_rows,
                "; ".join(str(p) for p in history.skipped[:3]),
            )
        if history.unread_files:  # the rest of the log was read
            logger.warning(
                "history %s: %d files not read: %s",
                history.source,
                len(history.unread_files),
                "; ".join(str(p) for p in history.skipped if p.source in history.unread_files),
            )
        try:
            await self.refresh_catalog(history)
        except Exception as exc:  # the catalog in force stays; ingest stands
            self.metrics.error("catalog", exc)
            logger.warning("catalog not refreshed: %s", exc, exc_info=True)
        self.metrics.ingested(history, catalog=self.ports.catalog, fleet=self.fleet, now=self.now())
        learn = self.ports.learn_predictor
        if learn is not None:
            try:
                self.state.predictor = await asyncio.to_thread(learn, history)
            except Exception as exc:  # events keep the predictor they had; ingest stands
                self.metrics.error("learn_events", exc)
                logger.warning("event models not refreshed: %s", exc, exc_info=True)
        return TickOutcome.DONE

    async def forecast(self) -> TickOutcome:
        """Demand for the coming plan, and a look-ahead plan for the next window."""
        history = self.state.history
        if history is None:
            return TickOutcome.IDLE
        self.state.forecast_now = False
        await self.discover()
        now = self.now()
        validity_s = self.settings.planner.validity_s
        demand = await asyncio.to_thread(self._forecast, history, start=now)
        if not any(d.mean_rps > 0 for d in demand.values()):
            # An empty or stale history would plan everything cold: keep the last plan.
            raise ForecastError("the history shows no traffic for the coming window")
        self.state.demand = demand
        await self._score_forecasts(
            history, IssuedForecast(issued_at=now, duration_s=validity_s, demand=demand)
        )
        window = _next_window(now, validity_s)
        ahead = await asyncio.to_thread(self._forecast, history, start=window)
        current = self.state.plan
        self.state.lookahead = await asyncio.to_thread(
            self.ports.planner, ahead, fleet=self.fleet, valid_from=window, current=current
        )
        now_plan = await asyncio.to_thread(
            self.ports.planner, demand, fleet=self.fleet, valid_from=now, current=current
        )
        self.state.replan_now = tiers_moved(current, now_plan)
        return TickOutcome.DONE

    def _forecast(self, history: RequestLog, *, start: datetime) -> Mapping[AdapterId, Demand]:
        """The forecaster's demand for the window from ``start``, each newcomer's at
        least its traffic since it appeared (``surprises.newcomer_floor``)."""
        validity_s = self.settings.planner.validity_s
        demand = self.ports.forecaster(history, start=start, duration_s=validity_s)
        return newcomer_floor(
            demand,
            history,
            now=self.now(),
            bucket_s=self.settings.forecast.bucket_s,
            window_s=validity_s,
        )

    async def _score_forecasts(self, history: RequestLog, issued: IssuedForecast) -> None:
        """The online forecast score: the forecasts whose window the history now covers,
        against persistence and yesterday. A failure costs the score, not the tick."""
        pending = [*self._issued, issued][-_PENDING_FORECASTS:]
        bucket_s = self.settings.forecast.bucket_s
        try:
            self._issued, scores = await asyncio.to_thread(
                score_due, pending, history, bucket_s=bucket_s
            )
        except Exception as exc:
            self.metrics.error("forecast_score", exc)
            logger.warning("forecast not scored: %s", exc, exc_info=True)
            return
        for score in scores:
            self.metrics.forecast_scored(score)

    async def plan_and_apply(self) -> TickOutcome:
        demand = self.state.demand
        if demand is None:
            return TickOutcome.IDLE
        await self.discover()
        plan = await asyncio.to_thread(
            self.ports.planner,
            demand,
            fleet=self.fleet,
            valid_from=self.now(),
            current=self.state.plan,
        )
        self.state.replan_now = False
        async with self._actuation:
            self._fence()  # the solve may have outlived the lease
            report = await self.ports.actuator.apply(
                plan, fleet=self.fleet, ledger=self.state.ledger
            )
        self._note_landings(report)
        self.metrics.applied(report)
        # The plan is in force once sent, even if some pods failed: reconcile retries them.
        self.state.plan = plan
        await self.persist()
        self._fence()
        await asyncio.to_thread(self.ports.plans.publish, plan)
        self.metrics.published(plan, period_s=float(self.settings.controller.plan_interval_s))
        await self.publish_hot_sets(plan)
        return TickOutcome.DONE

    def due_preloads(self) -> tuple[datetime, ...]:
        """The times of the look-ahead plan's preloads not yet done, for timed triggers."""
        ahead = self.state.lookahead
        if ahead is None:
            return ()
        done = set(self.state.done_preloads)
        return tuple(
            sorted(
                {p.at for p in ahead.preloads if preload_key(p.at, p.pod, p.adapter) not in done}
            )
        )

    async def preload(self, at: datetime) -> TickOutcome:
        """Load and warm the look-ahead plan's adapters due at ``at``, once each."""
        ahead = self.state.lookahead
        if ahead is None:
            return TickOutcome.IDLE
        done = set(self.state.done_preloads)
        due = [
            p
            for p in ahead.preloads
            if p.at == at and preload_key(p.at, p.pod, p.adapter) not in done
        ]
        if not due:
            return TickOutcome.IDLE
        present = await self.ports.actuator.registered(self.fleet)
        actions: list[Action] = []
        for p in due:
            held = present.get(p.pod)
            if held is None:
                continue  # unreachable: the next plan tick covers it
            reason = f"time-of-day preload for {ahead.valid_from:%H:%M}: {p.reason}"
            if p.adapter not in held:
                actions.append(Load(pod=p.pod, adapter=p.adapter, reason=reason))
            actions.append(Warmup(pod=p.pod, adapter=p.adapter, reason=reason))
        async with self._actuation:
            self._fence()
            self.state.ledger.track_pods(self.fleet.pods)  # each action reaches its model
            report = await self.ports.actuator.run(
                tuple(actions), fleet=self.fleet, ledger=self.state.ledger
            )
        self._note_landings(report)
        self.metrics.applied(report)
        failed = {(r.action.pod, r.action.adapter) for r in report.failed}
        for p in due:
            if (p.pod, p.adapter) not in failed and present.get(p.pod) is not None:
                self._remember_preload(preload_key(p.at, p.pod, p.adapter))
        await self.persist()
        return TickOutcome.DONE

    def _remember_preload(self, key: str) -> None:
        self.state.done_preloads.append(key)
        del self.state.done_preloads[:-DONE_PRELOADS_KEPT]

    async def watchdog(self) -> TickOutcome:
        """Restore at once the hot set of a pod that came back empty (it restarted)."""
        plan = self.state.plan
        if plan is None:
            return TickOutcome.IDLE
        await self.discover()
        present = await self.ports.actuator.registered(self.fleet)
        empty = [
            pod
            for pod, held in present.items()
            if held is not None and not held and plan.pods.get(pod) and plan.pods[pod].registered
        ]
        if not empty:
            return TickOutcome.IDLE
        sub_fleet = _only(self.fleet, set(empty))
        logger.info("watchdog: %s came back empty; restoring the plan's hot set", ", ".join(empty))
        async with self._actuation:
            self._fence()
            report = await self.ports.actuator.apply(
                plan, fleet=sub_fleet, ledger=self.state.ledger
            )
        self._note_landings(report)
        self.metrics.applied(report)
        self.metrics.restored(len(empty))
        await self.persist()
        return TickOutcome.DONE


def _only(fleet: Fleet, names: set[PodId]) -> Fleet:
    pools: list[Pool] = [
        replace(pool, pods=tuple(p for p in pool.pods if p.name in names)) for pool in fleet.pools
    ]
    return Fleet(pools=tuple(pools))


#: Forecasts kept for scoring: an hour's window at one forecast per 15 min is 5.
_PENDING_FORECASTS = 16


def _next_window(now: datetime, validity_s: int) -> datetime:
    """The next boundary of ``validity_s`` windows (the next hour, by default)."""
    start_s = (int(now.timestamp()) // validity_s + 1) * validity_s
    return datetime.fromtimestamp(start_s, UTC) if start_s else now + timedelta(seconds=validity_s)
