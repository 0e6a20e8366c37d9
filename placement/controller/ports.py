"""The controller's vocabulary: its jobs, tick outcomes, backoff, ports and state.

The ports are what ``placement.controller.ticks.Controller`` takes (``ControllerPorts``);
their real implementations are in ``placement.controller.live_ports`` and the cluster
adapters, their twins in tests. The forecaster and planner ports are shared with the
replay simulator, so they live below both: ``placement.forecast.demand.DemandForecaster``
and ``placement.solver.planner.Planner``. Types and small pure helpers only: no IO.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from placement.actuation.executor import ApplyReport, Ledger
from placement.domain import Action, AdapterId, Catalog, Fleet, PodId
from placement.forecast.demand import DemandForecaster
from placement.forecast.event_preloads import Predictor
from placement.forecast.scoring import ForecastScore
from placement.inputs.request_log import RequestLog
from placement.plan import Plan
from placement.ports import (
    DiscoveredPod,
    HotSetBoard,
    PlanStore,
    PodDiscovery,
    StateStore,
)
from placement.solver.planner import Planner
from placement.solver.problem import Demand

DONE_PRELOADS_KEPT = 4096


class Job(enum.StrEnum):
    INGEST = "ingest"
    FORECAST = "forecast"
    PLAN = "plan"
    PRELOAD = "preload"
    WATCHDOG = "watchdog"
    LEASE = "lease"


class TickOutcome(enum.StrEnum):
    """What one run of a job came to (a request's is ``placement.domain.Outcome``)."""

    DONE = "done"
    FAILED = "failed"
    #: Not the lease holder: nothing done.
    STANDBY = "standby"
    #: Still backing off from an earlier failure.
    BACKING_OFF = "backing_off"
    #: Nothing to do (no history yet, no plan yet).
    IDLE = "idle"


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """A job's failure streak: no run before ``retry_at_s``."""

    failures: int = 0
    retry_at_s: float = 0.0
    last_error: str = ""

    def due(self, now_s: float, *, max_s: float) -> bool:
        # A retry time further away than the cap means the clock jumped back.
        return now_s >= self.retry_at_s or self.retry_at_s - now_s > max_s

    def failed(self, error: str, *, now_s: float, base_s: float, max_s: float) -> Backoff:
        failures = self.failures + 1
        wait_s = min(max_s, base_s * 2 ** (failures - 1))
        return Backoff(failures=failures, retry_at_s=now_s + wait_s, last_error=error)


# --- the ports the ticks take ---------------------------------------------------------


class HistorySource(Protocol):
    def __call__(self) -> RequestLog: ...


class RecentUse(Protocol):
    """When each pod last served each adapter: the Unix seconds of the latest request's
    arrival per pod and adapter, as of the call (the router's request log,
    ``placement.controller.recent_use.RouterLogUse``, which folds in what the log gained
    since its last read, at most every ``recent_use_refresh_s``). Rows are written as
    requests end, so a request still running is not in it yet."""

    def __call__(self) -> Mapping[PodId, Mapping[AdapterId, float]]: ...


class Actuator(Protocol):
    """Pushes actions to pods (``placement.actuation.apply`` and the executor behind it)."""

    async def apply(self, plan: Plan, *, fleet: Fleet, ledger: Ledger) -> ApplyReport: ...

    async def run(
        self, actions: tuple[Action, ...], *, fleet: Fleet, ledger: Ledger
    ) -> ApplyReport: ...

    async def registered(self, fleet: Fleet) -> Mapping[PodId, frozenset[AdapterId] | None]:
        """Each pod's registrations; None for a pod that did not answer."""
        ...


class Leadership(Protocol):
    """Who acts: a Lease (``placement.controller.leader.LeaderElector``) on Kubernetes,
    the state directory's lock (``placement.adapters.statedir.DirLock``) on one machine."""

    @property
    def identity(self) -> str: ...

    def is_leader(self) -> bool: ...

    def tick(self) -> bool:
        """Acquire or renew once; whether this replica leads now."""
        ...

    def fence(self, *, margin_s: float) -> None:
        """Raise LeadershipLostError unless a write started now ends while we lead."""
        ...

    def term(self) -> float | None:
        """The fencing token of this tenure (larger for a later leader); None when
        not leading, or when the lock needs none."""
        ...

    def release(self) -> None: ...


class CatalogSource(Protocol):
    """The catalog file (``placement.inputs.catalog.CatalogFile``): a new catalog when it
    changed, None when not; InputError, naming what is wrong, for a bad new version."""

    def poll(self) -> Catalog | None: ...


@dataclass(frozen=True, kw_only=True)
class CatalogBound:
    """The ports built over one catalog, built again when the catalog changes."""

    forecaster: DemandForecaster
    planner: Planner
    actuator: Actuator
    predictor: Predictor
    learn_predictor: Callable[[RequestLog], Predictor] | None = None


@dataclass(frozen=True, kw_only=True)
class ControllerPorts:
    #: The catalog in force: the file's adapters, then the unannounced ones resolved
    #: through ``InputSettings.adapter_source_template``.
    catalog: Catalog
    #: The fleet file: the pods themselves locally; on Kubernetes, per pool the budgets
    #: (its first pod's) that discovered pods of that pool inherit.
    fleet: Fleet
    history: HistorySource
    forecaster: DemandForecaster
    planner: Planner
    actuator: Actuator
    plans: PlanStore
    state: StateStore
    predictor: Predictor
    discovery: PodDiscovery | None = None
    hot_sets: HotSetBoard | None = None
    elector: Leadership | None = None
    #: Run by the lease tick that takes the lease (and by the next ones until it
    #: succeeds): stamps this leader's term on the objects it writes, so a deposed
    #: leader's write already past its checks (read before a pause, sent after) is
    #: refused. None where the lock fences on its own (a
    #: state directory: a paused holder keeps its flock, so no one takes over).
    claim: Callable[[], None] | None = None
    #: Learns event models (transitions, login affinities) from each new history;
    #: until it has, and when it fails, ``predictor`` answers events alone.
    learn_predictor: Callable[[RequestLog], Predictor] | None = None
    #: Re-read at each ingest; None: the catalog is fixed for the process's life.
    catalog_file: CatalogSource | None = None
    #: The catalog-bound ports over a new catalog; InputError when it cannot serve
    #: (pipelines.yaml names an adapter it lacks). None: only ``catalog`` changes.
    rebind: Callable[[Catalog], CatalogBound] | None = None
    #: When each pod last served each adapter, read at each event for the preloads'
    #: idle times; None (no live request log): the events decide without them.
    recent_use: RecentUse | None = None


@dataclass(kw_only=True)
class ControllerState:
    history: RequestLog | None = None
    predictor: Predictor | None = None
    demand: Mapping[AdapterId, Demand] | None = None
    plan: Plan | None = None
    lookahead: Plan | None = None
    #: Set by a forecast that moves adapters between tiers: plan at once.
    replan_now: bool = False
    ledger: Ledger = field(default_factory=Ledger)
    done_preloads: list[str] = field(default_factory=list)
    backoff: dict[Job, Backoff] = field(default_factory=dict)
    #: The catalog file's adapters as last read well (None: not read since start).
    declared: Catalog | None = None
    #: Set by an ingest that changed the catalog: forecast (then plan) at once.
    forecast_now: bool = False
    #: Why the catalog file's current version is refused (None: it is in force).
    catalog_problem: str | None = None
    #: Names in traffic the catalog lacks that the last ingest left unplanned.
    unplanned: frozenset[AdapterId] = frozenset()
    #: When this process last loaded or warmed each adapter on each pod (Unix seconds,
    #: the controller's clock): a landing the request log does not show. Not saved.
    landed_s: dict[PodId, dict[AdapterId, float]] = field(default_factory=dict)
    #: Whether ``ControllerPorts.claim`` has run since this replica last took the lease.
    claimed: bool = False


def fleet_from_discovery(template: Fleet, pods: tuple[DiscoveredPod, ...]) -> Fleet:
    """The fleet of the discovered pods, each with its pool's budgets from ``template``."""
    pools = []
    for pool in template.pools:
        model = pool.pods[0] if pool.pods else None
        found = tuple(p for p in pods if p.pool == pool.name and p.ready)
        if model is None:
            continue
        members = tuple(
            replace(model, name=p.name, url=p.url, labels=dict(p.labels)) for p in found
        )
        pools.append(replace(pool, pods=members))
    return Fleet(pools=tuple(pools))


def idle_times(
    hot: tuple[AdapterId, ...],
    *,
    used_s: Mapping[AdapterId, float],
    landed_s: Mapping[AdapterId, float],
    now_s: float,
) -> dict[AdapterId, float]:
    """Seconds each adapter on a GPU slot has been idle at ``now_s``: since its last
    request or its landing, the later; left out where neither is known. A time ahead
    of ``now_s`` (another clock's) counts as in use: never idler than it is."""
    idle: dict[AdapterId, float] = {}
    for name in hot:
        last_s = max(used_s.get(name, -math.inf), landed_s.get(name, -math.inf))
        if last_s > -math.inf:
            idle[name] = max(0.0, now_s - last_s)
    return idle


def preload_key(at: datetime, pod: PodId, adapter: AdapterId) -> str:
    return f"{at.astimezone(UTC).isoformat()}|{pod}|{adapter}"


def tiers_moved(before: Plan | None, after: Plan) -> bool:
    """Whether any adapter changes tier between two plans."""
    if before is None:
        return True
    names = set(before.adapters) | set(after.adapters)
    return any(before.tier_of(name) != after.tier_of(name) for name in names)


class ControllerObserver:
    """What the ticks report; ``placement.controller.schedule`` feeds it to Prometheus."""

    def tick(self, job: Job, outcome: TickOutcome, *, backoff: Backoff | None) -> None:
        pass

    def applied(self, report: ApplyReport) -> None:
        pass

    def published(self, plan: Plan, *, period_s: float) -> None:
        pass

    def restored(self, pods: int) -> None:
        pass

    def error(self, task: str, exc: BaseException) -> None:
        """A task's iteration raised ``exc``; the task goes on."""

    def history_skipped(self, rows: int, *, unread_files: int = 0) -> None:
        """Rows the last ingest left out of the history (faulty, half-written), and the
        files of the live log it could not read."""

    def forecast_scored(self, score: ForecastScore) -> None:
        """An issued forecast scored against what arrived, beside the naive forecasts."""

    def ingested(
        self, history: RequestLog, *, catalog: Catalog, fleet: Fleet, now: datetime
    ) -> None:
        """A fresh history: what it says about demand against the fleet's slots."""
