"""The real implementations of the controller's ports, over the other modules of lorafleet.

- ``EngineActuator``: pods through ``placement.actuation.apply`` and the ``Executor``;
  its listings (``apply`` for the plan and watchdog ticks, ``registered`` for the
  preload and watchdog ticks) retried as ``lorafleet apply``'s are, but for a timeout.
- the planner, ``placement.solver.planner.SolverPlanner``, lives with the solver: the
  replay simulator plans through it too.
- ``ReusingForecaster``: ``placement.forecast.forecaster.ModelForecaster`` (``models/``), one
  fit per history for both windows of a forecast tick.
- ``SeasonalForecaster``: the same window on each of the last days, averaged (mean)
  and its 90th percentile across days (q90); no fitting (``forecast_model: same-hour``).
- history sources: a request-log file, or Prometheus (``placement.adapters.prom``).
- ``ConfigMapCatalog``: the catalog as a ConfigMap's key, re-read when its
  resourceVersion changes (the file is ``placement.inputs.catalog.CatalogFile``).
- ``PrometheusObserver``: the ticks' outcomes and ``placement.metrics.ControllerMetrics``.

No decisions here: each class adapts one module's API to one port.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
from prometheus_client import CollectorRegistry, Counter, Gauge

from placement.actuation.apply import apply_plan, lora_paths, make_clients, observe
from placement.actuation.executor import ApplyReport, Executor, Ledger, Sleep
from placement.actuation.reconcile import depends_on
from placement.adapters.kube import KubeConfigMapKey
from placement.adapters.live_request_log import WorkersRequestLog
from placement.adapters.prom import PromHistorySource
from placement.controller.ports import Backoff, ControllerObserver, Job, TickOutcome
from placement.domain import Action, AdapterId, Catalog, Fleet, PodId
from placement.errors import InputError, KubeError, Problem
from placement.forecast.demand import demand_from_forecast
from placement.forecast.forecaster import ModelForecaster
from placement.forecast.scoring import ForecastScore
from placement.inputs.catalog import catalog_from_text
from placement.inputs.request_log import RequestLog, load_request_log
from placement.metrics import ControllerMetrics, FleetMetrics
from placement.plan import Plan
from placement.settings import InputSettings, Settings
from placement.solver.problem import Demand

DAY_S = 86_400


class EngineActuator:
    """Pushes actions to the pods' engines, sharing one HTTP client."""

    def __init__(
        self,
        *,
        catalog: Catalog,
        http: httpx.AsyncClient,
        settings: Settings,
        rng: random.Random,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._catalog = catalog
        self._http = http
        self._settings = settings
        self._rng = rng
        self._sleep = sleep

    async def apply(self, plan: Plan, *, fleet: Fleet, ledger: Ledger) -> ApplyReport:
        """Apply ``plan`` (``apply.apply_plan``) for the plan and watchdog ticks. Their
        listing does not retry a timeout, as ``registered``'s does not: it runs under the
        controller's actuation lock, so a hung pod retried ``LIST_ATTEMPTS`` times would
        hold the webhook's preloads three ``per_action_deadline_s`` and the backoff; the
        next plan tick lists that pod again."""
        timeout_s = self._settings.executor.per_action_deadline_s
        outcome = await apply_plan(
            plan,
            fleet=fleet,
            catalog=self._catalog,
            clients=make_clients(fleet, http=self._http, timeout_s=timeout_s),
            settings=self._settings.executor,
            rng=self._rng,
            ledger=ledger,
            sleep=self._sleep,
            retry_timeouts=False,
        )
        return outcome.report

    async def run(
        self, actions: tuple[Action, ...], *, fleet: Fleet, ledger: Ledger
    ) -> ApplyReport:
        timeout_s = self._settings.executor.per_action_deadline_s
        executor = Executor(
            make_clients(fleet, http=self._http, timeout_s=timeout_s),
            lora_paths=lora_paths(self._catalog),
            settings=self._settings.executor,
            rng=self._rng,
            sleep=self._sleep,
            ledger=ledger,
        )
        return await executor.run(actions, after=depends_on(actions))

    async def registered(self, fleet: Fleet) -> Mapping[PodId, frozenset[AdapterId] | None]:
        """Each pod's registrations, None for one that could not be listed: listed as
        ``apply`` lists them (``apply.observe``), a 5xx, 429, refused or broken
        connection retried up to ``LIST_ATTEMPTS`` times with the executor's backoff,
        ``rng`` and ``sleep``; a timeout (no answer within ``per_action_deadline_s``)
        is not retried. Every pod is listed together and the tick's work waits for all
        of them, so one hung pod holds the others' restores and preloads one timeout,
        not ``LIST_ATTEMPTS`` of them and the backoff between."""
        timeout_s = self._settings.executor.per_action_deadline_s
        observation = await observe(
            fleet,
            make_clients(fleet, http=self._http, timeout_s=timeout_s),
            settings=self._settings.executor,
            rng=self._rng,
            sleep=self._sleep,
            retry_timeouts=False,
        )
        states = observation.states
        return {
            pod.name: states[pod.name].registered if pod.name in states else None
            for pod in fleet.pods
        }


class SeasonalForecaster:
    """Mean and 90th percentile of the same window on each of the last ``days`` days."""

    def __init__(self, *, bucket_s: int, days: int = 7) -> None:
        self.days = days
        self.bucket_s = bucket_s

    def __call__(
        self, history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        counts = history.counts(self.bucket_s)
        if counts.empty:
            return {}
        first, last = counts["ts"].min(), counts["ts"].max() + pd.Timedelta(seconds=self.bucket_s)
        end = pd.Timestamp(start) + pd.Timedelta(seconds=duration_s)
        # The most recent day whose window the history covers, then the days before it.
        k0 = max(1, math.ceil((end - last).total_seconds() / DAY_S))
        windows = []
        for k in range(k0, k0 + self.days):
            w_start = pd.Timestamp(start) - pd.Timedelta(days=k)
            if w_start >= first - pd.Timedelta(seconds=self.bucket_s):
                windows.append(w_start)
        if not windows:  # less than a day of history: its most recent window
            windows = [last - pd.Timedelta(seconds=duration_s)]
        per_window = np.array(
            [self._totals(counts, w, duration_s) for w in windows], dtype=float
        )  # windows x adapters
        names = sorted(counts["adapter"].astype(str).unique())
        rates = per_window / duration_s
        return {
            AdapterId(name): Demand(
                mean_rps=float(rates[:, i].mean()),
                q90_rps=float(np.quantile(rates[:, i], 0.9)),
            )
            for i, name in enumerate(names)
        }

    @staticmethod
    def _totals(counts: pd.DataFrame, start: pd.Timestamp, duration_s: int) -> list[float]:
        end = start + pd.Timedelta(seconds=duration_s)
        inside = counts[(counts["ts"] >= start) & (counts["ts"] < end)]
        totals = inside.groupby("adapter", observed=True)["requests"].sum()
        names = sorted(counts["adapter"].astype(str).unique())
        return [float(totals.get(name, 0.0)) for name in names]


class ReusingForecaster:
    """``placement.forecast.forecaster.ModelForecaster``, fitted once per history: a later window
    inside the forecast's horizon (the forecast tick's look-ahead) reuses the fit."""

    def __init__(self, model: ModelForecaster, *, bucket_s: int) -> None:
        self._model = model
        self._bucket_s = bucket_s
        self._cached: tuple[RequestLog, pd.DataFrame] | None = None

    def __call__(
        self, history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        frame = self._frame(history, start=start, duration_s=duration_s)
        return demand_from_forecast(frame, at=start, validity_s=duration_s, bucket_s=self._bucket_s)

    def _frame(self, history: RequestLog, *, start: datetime, duration_s: int) -> pd.DataFrame:
        if self._cached is not None and self._cached[0] is history:
            frame = self._cached[1]
            end = pd.Timestamp(start) + pd.Timedelta(seconds=duration_s)
            last = frame["ts"].max() + pd.Timedelta(seconds=self._bucket_s)
            if not frame.empty and frame["ts"].min() <= pd.Timestamp(start) and end <= last:
                return frame
        forecast = self._model.forecast(history, start=start, duration_s=duration_s)
        self._cached = (history, forecast.frame)
        return forecast.frame


class FileHistory:
    """The request log file, plus the router's live log when given, read at every ingest.

    The request log is the operator's and read strictly (a fault in it fails the ingest,
    naming the file). The live log is the router's, still being written: a faulty row
    (an empty or invalid adapter name) or a half-written line is left out and reported
    in the history's ``skipped``, never a reason to drop the whole live log; a file of it
    that cannot be read is named there and in ``unread_files``, and the rest is read."""

    def __init__(self, path: Path, *, bucket_s: int, live: Path | None = None) -> None:
        self.path = path
        self.live = live
        self.bucket_s = bucket_s
        # The router's layout (a JSON-lines file and its rotations, or a directory of
        # Parquet parts and hours), read incrementally: only new files and new lines;
        # with the logs of its further workers (``router --workers N``) beside it.
        self._live_log = WorkersRequestLog(live) if live is not None else None

    def __call__(self) -> RequestLog:
        history = load_request_log(self.path)
        if self._live_log is None:  # a live log not there (yet, or mid-rotation) reads empty
            return history
        try:
            live = self._live_log.read()
        except InputError as exc:  # unreadable as a whole (a missing column): next ingest
            return replace(history, skipped=exc.problems)
        return combined(history, live, bucket_s=self.bucket_s)


def combined(history: RequestLog, live: RequestLog, *, bucket_s: int) -> RequestLog:
    """Both logs as one: per request if both are, else as counts per bucket. Each was
    validated when read, so the rows are kept as they are (no duplicate dropping); the
    rows the live log left out stay reported."""
    if live.frame.empty:
        return replace(
            history,
            skipped=live.skipped,
            skipped_rows=live.skipped_rows,
            unread_files=live.unread_files,
        )
    aggregated = history.aggregated or live.aggregated
    if aggregated:
        frames = [log.counts(bucket_s) for log in (history, live)]
    else:
        columns = [c for c in history.frame.columns if c in live.frame.columns]
        frames = [log.frame[columns] for log in (history, live)]
    frame = pd.concat(frames, ignore_index=True).sort_values("ts", kind="stable")
    return RequestLog(
        frame=frame.reset_index(drop=True),
        aggregated=aggregated,
        source=f"{history.source} + {live.source}",
        skipped=live.skipped,
        skipped_rows=live.skipped_rows,
        unread_files=live.unread_files,
    )


class ConfigMapCatalog:
    """The catalog port over a ConfigMap's key (``kubernetes.catalog_configmap``): a new
    catalog when the object's resourceVersion changed and its text differs; the last
    bad version's InputError again until it changes; a ConfigMap that cannot be read
    an InputError naming it (the catalog in force stays)."""

    def __init__(self, key: KubeConfigMapKey, *, fleet: Fleet, rules: InputSettings) -> None:
        self._key = key
        self._fleet = fleet
        self._rules = rules
        self._version: str | None = None
        self._text: str | None = None
        self._error: InputError | None = None

    def poll(self) -> Catalog | None:
        where = self._key.description
        try:
            version, text = self._key.read()
        except KubeError as exc:
            raise InputError([Problem(source=where, message=str(exc))]) from None
        if version == self._version or text == self._text:
            self._version = version
            if self._error is not None:
                raise self._error
            return None
        self._version, self._text = version, text
        try:
            catalog = catalog_from_text(text, source=where, fleet=self._fleet, rules=self._rules)
        except InputError as exc:
            self._error = exc
            raise
        self._error = None
        return catalog


class PrometheusHistory:
    """The router's request counters in Prometheus, over the last ``lookback_s``."""

    def __init__(
        self,
        source: PromHistorySource,
        *,
        lookback_s: int,
        bucket_s: int,
        clock: Callable[[], float],
    ) -> None:
        self._source = source
        self._lookback_s = lookback_s
        self._bucket_s = bucket_s
        self._clock = clock

    def __call__(self) -> RequestLog:
        end = datetime.fromtimestamp(self._clock(), UTC)
        start = end - timedelta(seconds=self._lookback_s)
        return self._source.request_log(start=start, end=end, bucket_s=self._bucket_s)


class PrometheusObserver(ControllerObserver):
    """The ticks' outcomes, backoff and restored pods, plus the shared controller metrics."""

    def __init__(self, registry: CollectorRegistry, *, bucket_s: int) -> None:
        self.bucket_s = bucket_s
        self.shared = ControllerMetrics(registry)
        self.fleet = FleetMetrics(registry)
        self.ticks = Counter(
            "lorafleet_controller_ticks",
            "Controller job runs by job and outcome (done, failed, standby, backing_off, idle).",
            ["job", "outcome"],
            registry=registry,
        )
        self.failures = Gauge(
            "lorafleet_controller_consecutive_failures",
            "Failures in a row of each job (0 once it succeeds again).",
            ["job"],
            registry=registry,
        )
        self.leader = Gauge(
            "lorafleet_controller_leader",
            "1 while this replica holds the lease and acts.",
            registry=registry,
        )
        self.restored_pods = Counter(
            "lorafleet_controller_restored_pods",
            "Pods the watchdog found empty (restarted) and refilled.",
            registry=registry,
        )
        self.errors = Counter(
            "lorafleet_controller_errors",
            "Exceptions a controller task caught from one of its iterations, by task "
            "(a job, event, hot_sets, learn_events, resume) and exception type; the task "
            "went on.",
            ["task", "error"],
            registry=registry,
        )
        self.skipped_rows = Gauge(
            "lorafleet_controller_history_skipped_rows",
            "Rows of the live request log the last ingest left out (faulty or half-written).",
            registry=registry,
        )
        self.unread_files = Gauge(
            "lorafleet_controller_history_unread_files",
            "Files of the live request log the last ingest could not read (each named in "
            "its warning; the rest of the log was read, and they are tried again).",
            registry=registry,
        )

    def tick(self, job: Job, outcome: TickOutcome, *, backoff: Backoff | None) -> None:
        self.ticks.labels(job=job.value, outcome=outcome.value).inc()
        self.failures.labels(job=job.value).set(backoff.failures if backoff else 0)
        if outcome is TickOutcome.FAILED:
            self.shared.job_failed(job.value)
        if job is Job.LEASE:
            # IDLE: no lease to hold (one replica, no Kubernetes): it always acts.
            self.leader.set(1 if outcome in {TickOutcome.DONE, TickOutcome.IDLE} else 0)

    def applied(self, report: ApplyReport) -> None:
        self.shared.apply_reported(report)

    def published(self, plan: Plan, *, period_s: float) -> None:
        self.shared.plan_published(plan, period_s=period_s)

    def restored(self, pods: int) -> None:
        self.restored_pods.inc(pods)

    def error(self, task: str, exc: BaseException) -> None:
        self.errors.labels(task=task, error=type(exc).__name__).inc()

    def history_skipped(self, rows: int, *, unread_files: int = 0) -> None:
        self.skipped_rows.set(rows)
        self.unread_files.set(unread_files)

    def forecast_scored(self, score: ForecastScore) -> None:
        self.shared.forecast_scored(score)

    def ingested(
        self, history: RequestLog, *, catalog: Catalog, fleet: Fleet, now: datetime
    ) -> None:
        """The early warning: distinct adapters of the last hour against the slots."""
        self.fleet.fleet_activity(
            history.counts(self.bucket_s),
            catalog=catalog,
            fleet=fleet,
            since=now - timedelta(hours=1),
        )
