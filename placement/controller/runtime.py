"""The controller's running state and the guards every tick runs under.

``ControllerRuntime`` owns what is not one tick's work: the ports, the state, the lease
(``lease``), the backoff and supervision of each run (``guarded``), the write fence
(``_fence``), the saved plan and ledger (``resume``, ``persist``), the catalog in
force (``refresh_catalog``: the file re-read, the traffic's unannounced adapters
added, the catalog-bound ports rebuilt), the pods discovered (``discover``) and the
hot sets published (``publish_hot_sets``). The ticks that use
them are ``placement.controller.ticks.Controller``'s; the rules both keep are in that
module's docstring. No decisions here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

from placement.actuation.executor import Ledger
from placement.controller.ports import (
    Backoff,
    CatalogBound,
    ControllerObserver,
    ControllerPorts,
    ControllerState,
    Job,
    TickOutcome,
    fleet_from_discovery,
)
from placement.controller.surprises import catalog_with_traffic, traffic_by_name
from placement.domain import AdapterId, Fleet
from placement.errors import InputError, KubeError, LeadershipLostError, LorafleetError, PlanError
from placement.forecast.scoring import IssuedForecast
from placement.inputs.request_log import RequestLog
from placement.plan import Plan, plan_from_json, plan_to_json
from placement.ports import StoredState
from placement.settings import Settings

logger = logging.getLogger(__name__)


class ControllerRuntime:
    """The state and the guards; ``placement.controller.ticks.Controller`` adds the ticks."""

    def __init__(
        self,
        ports: ControllerPorts,
        *,
        settings: Settings,
        clock: Callable[[], float],
        metrics: ControllerObserver | None = None,
    ) -> None:
        self.ports = ports
        self.settings = settings
        self.clock = clock
        self.state = ControllerState(declared=ports.catalog)
        self.metrics = metrics or ControllerObserver()
        self._actuation = asyncio.Lock()
        self._background: set[asyncio.Task[None]] = set()
        #: The ticks in flight, cancelled when the lease is lost.
        self._running: set[asyncio.Task[TickOutcome]] = set()
        self._fleet = ports.fleet if ports.discovery is None else Fleet(pools=())
        #: Forecasts whose window has not passed yet: scored at a later forecast tick.
        self._issued: list[IssuedForecast] = []

    # --- helpers ---------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), UTC)

    @property
    def fleet(self) -> Fleet:
        """The fleet as last discovered (or the fleet file, locally)."""
        return self._fleet

    def is_leader(self) -> bool:
        elector = self.ports.elector
        return elector is None or elector.is_leader()

    async def guarded(self, job: Job, tick: Callable[[], Awaitable[TickOutcome]]) -> TickOutcome:
        """Run one tick if this replica leads and the job is not backing off.

        Whatever the tick raises is caught here: a lost lease makes it STANDBY, any
        other exception FAILED (logged, counted, backed off). Only the cancellation of
        the caller itself (a shutdown) goes through."""
        if job is not Job.LEASE and not self.is_leader():
            return self._observed(job, TickOutcome.STANDBY)
        cfg = self.settings.controller
        now_s = self.clock()
        backoff = self.state.backoff.get(job, Backoff())
        if not backoff.due(now_s, max_s=cfg.backoff_max_s):
            return self._observed(job, TickOutcome.BACKING_OFF)
        task = asyncio.get_running_loop().create_task(_outcome_of(tick))
        self._running.add(task)
        try:
            outcome = await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being stopped, not the tick
            logger.warning("%s tick stopped: this replica lost the lease", job)
            return self._observed(job, TickOutcome.STANDBY)
        except LeadershipLostError as exc:
            logger.warning("%s tick stopped before writing: %s", job, exc)
            return self._observed(job, TickOutcome.STANDBY)
        except Exception as exc:  # the loop never dies: every failure backs off
            self.state.backoff[job] = backoff.failed(
                str(exc), now_s=now_s, base_s=cfg.backoff_base_s, max_s=cfg.backoff_max_s
            )
            self.metrics.error(job.value, exc)
            expected = isinstance(exc, LorafleetError | OSError)
            logger.warning(
                "%s tick failed (%d in a row): %s: %s",
                job,
                backoff.failures + 1,
                type(exc).__name__,
                exc,
                exc_info=not expected,
            )
            return self._observed(job, TickOutcome.FAILED)
        finally:
            self._running.discard(task)
        self.state.backoff.pop(job, None)
        return self._observed(job, outcome)

    def stop_jobs(self) -> int:
        """Cancel every tick in flight and every event's preloads (the lease was lost),
        but not the caller's own tick; how many were cancelled."""
        current = asyncio.current_task()
        doomed = [t for t in (*self._running, *self._background) if t is not current]
        for task in doomed:
            task.cancel()
        return len(doomed)

    def _fence(self) -> None:
        """Before every write: LeadershipLostError unless we lead with time to spare."""
        elector = self.ports.elector
        if elector is not None:
            elector.fence(margin_s=self.settings.controller.api_timeout_s)

    def _observed(self, job: Job, outcome: TickOutcome) -> TickOutcome:
        self.metrics.tick(job, outcome, backoff=self.state.backoff.get(job))
        return outcome

    # --- restart ---------------------------------------------------------------

    async def resume(self) -> None:
        """Load the last plan and the ledger; a standby does this again when it leads."""
        stored = await asyncio.to_thread(self.ports.state.load)
        if stored.plan_json is not None:
            try:
                self.state.plan = plan_from_json(stored.plan_json, source="saved state")
            except PlanError as exc:
                logger.warning("saved plan unreadable, starting without one: %s", exc)
        if stored.ledger_json is not None:
            try:
                raw = json.loads(stored.ledger_json)
                ledger = Ledger.from_dict(raw.get("ledger", {}))
                done = [str(k) for k in raw.get("done_preloads", [])]
            except (ValueError, TypeError, AttributeError, RecursionError) as exc:
                # Reconcile still sees what each pod registers: nothing is loaded twice,
                # at worst some adapters are warmed again.
                logger.warning("saved ledger unreadable, starting with an empty one: %s", exc)
                return
            self.state.ledger, self.state.done_preloads = ledger, done

    async def persist(self) -> None:
        ledger = {"ledger": self.state.ledger.to_dict(), "done_preloads": self.state.done_preloads}
        plan = self.state.plan
        stored = StoredState(
            plan_json=plan_to_json(plan) if plan is not None else None,
            ledger_json=json.dumps(ledger, sort_keys=True),
        )
        self._fence()
        await asyncio.to_thread(self.ports.state.save, stored)

    # --- ticks -------------------------------------------------------------------

    async def lease(self) -> TickOutcome:
        elector = self.ports.elector
        if elector is None:
            return TickOutcome.IDLE
        was_leader = elector.is_leader()
        leads = await asyncio.to_thread(elector.tick)
        if not leads:
            stopped = self.stop_jobs()
            if was_leader or stopped:
                logger.warning(
                    "%s lost the lease: %d jobs in flight stopped", elector.identity, stopped
                )
        if leads and not was_leader:
            self.state.claimed = False
            await self.resume()  # the previous leader's last plan and ledger
        if leads and not self.state.claimed:
            await self._claim()
        return TickOutcome.DONE if leads else TickOutcome.STANDBY

    async def _claim(self) -> None:
        """Stamp our term on the objects we write (``ControllerPorts.claim``); a failure
        is tried again at the next lease tick, which it does not delay: each write
        checks the term on its own."""
        claim = self.ports.claim
        if claim is not None:
            try:
                self._fence()
                await asyncio.to_thread(claim)
            except (LorafleetError, OSError) as exc:
                logger.warning(
                    "could not stamp this leader's term on its objects (tried again at the "
                    "next lease tick): %s: %s",
                    type(exc).__name__,
                    exc,
                )
                return
        self.state.claimed = True

    # --- cluster side effects ----------------------------------------------------

    # --- the catalog in force ----------------------------------------------------

    async def refresh_catalog(self, history: RequestLog) -> None:
        """The catalog file re-read if it changed, plus the adapters the traffic names
        that it lacks (``placement.controller.surprises``); the catalog-bound ports
        rebuilt when the result differs. A bad file, or a catalog the ports cannot be
        built over, is refused: logged and counted (``lorafleet_controller_errors``,
        task ``catalog``) once per version, the last good one kept."""
        declared = self.state.declared or self.ports.catalog
        source = self.ports.catalog_file
        fresh = None
        if source is not None:
            try:
                fresh = await asyncio.to_thread(source.poll)
            except InputError as exc:
                self._refuse_catalog(exc)
        candidate = fresh or declared
        fleet = self.fleet if self.fleet.pools else self.ports.fleet
        traffic = await asyncio.to_thread(traffic_by_name, history)
        rules = self.settings.inputs
        update = catalog_with_traffic(candidate, traffic, fleet=fleet, rules=rules)
        if update.catalog != self.ports.catalog:
            rebind = self.ports.rebind
            try:
                bound = rebind(update.catalog) if rebind is not None else None
            except InputError as exc:
                self._refuse_catalog(exc)
                return
            before = self.ports.catalog.names()
            self.ports = _rebound(replace(self.ports, catalog=update.catalog), bound)
            self.state.forecast_now = True
            now = update.catalog.names()
            logger.info(
                "catalog in force: %d adapters (%d from the source template); added %s, removed %s",
                len(now),
                len(update.unannounced),
                ", ".join(sorted(now - before)[:10]) or "none",
                ", ".join(sorted(before - now)[:10]) or "none",
            )
        if fresh is not None:
            self.state.declared = fresh
            self.state.catalog_problem = None
        self._note_unplanned(update.unplanned)

    def _refuse_catalog(self, exc: InputError) -> None:
        """Log and count a refused catalog once, however many ingests find it."""
        if self.state.catalog_problem != str(exc):
            logger.warning("new catalog refused, the last good one stays in force: %s", exc)
            self.metrics.error("catalog", exc)
        self.state.catalog_problem = str(exc)

    def _note_unplanned(self, unplanned: Mapping[AdapterId, str]) -> None:
        """Log the names in traffic left unplanned, once each."""
        seen = self.state.unplanned
        new = {name: why for name, why in unplanned.items() if name not in seen}
        self.state.unplanned = frozenset(unplanned)
        if new:
            shown = "; ".join(f"{name}: {why}" for name, why in list(new.items())[:5])
            logger.warning(
                "%d adapters in traffic not in the catalog stay unplanned: %s", len(new), shown
            )

    async def discover(self) -> None:
        discovery = self.ports.discovery
        if discovery is None:
            return
        pods = await asyncio.to_thread(discovery.list_pods)
        fleet = fleet_from_discovery(self.ports.fleet, pods)
        if not fleet.pods:
            # Planning for no pods would publish an all-cold plan: keep the last one.
            raise KubeError("the pod selector matched no ready pod of a known pool")
        self._fleet = fleet

    async def publish_hot_sets(self, plan: Plan) -> None:
        """Publish each discovered pod's hot set (for people: ``kubectl get configmap``);
        a failure is logged and counted, the plan stays published."""
        board = self.ports.hot_sets
        if board is None:
            return
        hot_sets = {
            pod.name: plan.pods[pod.name].hot if pod.name in plan.pods else ()
            for pod in self.fleet.pods
        }
        try:
            self._fence()
            await asyncio.to_thread(board.publish_hot_sets, hot_sets, plan_id=plan.id)
        except LeadershipLostError:
            raise
        except Exception as exc:
            self.metrics.error("hot_sets", exc)
            logger.warning("could not publish the hot sets of plan %s: %s", plan.id, exc)


async def _outcome_of(tick: Callable[[], Awaitable[TickOutcome]]) -> TickOutcome:
    return await tick()


def _rebound(ports: ControllerPorts, bound: CatalogBound | None) -> ControllerPorts:
    """``ports`` with the catalog-bound ones ``bound`` gives (as they were without)."""
    if bound is None:
        return ports
    return replace(
        ports,
        forecaster=bound.forecaster,
        planner=bound.planner,
        actuator=bound.actuator,
        predictor=bound.predictor,
        learn_predictor=bound.learn_predictor,
    )
