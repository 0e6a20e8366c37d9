"""When the controller's ticks run: APScheduler 3 jobs, and the process around them.

Owns the schedule only. Every job runs at most one instance at a time, missed runs
coalesce into one, and a run later than ``misfire_grace_s`` is skipped; the ticks
themselves (``placement.controller.ticks``) do the work and keep their own backoff. Jobs:

- ``lease``: every ``lease_retry_period_s`` (acquire, renew, take over); a new leader
  without a forecast brings ``ingest`` forward to now;
- ``ingest``, ``forecast``, ``plan``, ``watchdog``: at their intervals; the first
  history, and an ingest that changed the catalog, bring the forecast forward, and a
  forecast that moves adapters between tiers (the first one included) brings the
  next ``plan`` run forward to now;
- ``preload@<time>``: one date trigger per time the look-ahead plan preloads at.

``serve`` runs the scheduler and the webhook/metrics app in one event loop.

Supervision: every run goes through ``Controller.guarded``, which catches whatever a
tick raises; what still escapes a job (the scheduler's own errors) is logged and
counted by a listener. ``health`` says what is wrong with the loop itself: the
scheduler stopped, an interval job gone from it, or a run in flight longer than
``job_stall_s`` (hung). ``/healthz`` answers 503 with those reasons (the kubelet then
restarts the process); ``/readyz`` answers 200 only on a healthy replica that leads,
so a Service sends webhooks to the leader alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import uvicorn
from apscheduler.events import EVENT_JOB_ERROR, JobExecutionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from placement.controller.ports import Job, TickOutcome
from placement.controller.ticks import Controller
from placement.metrics import render
from placement.settings import ControllerSettings

logger = logging.getLogger(__name__)

PRELOAD_PREFIX = "preload@"


class Schedule:
    """The jobs of one controller on one AsyncIOScheduler."""

    def __init__(
        self,
        controller: Controller,
        *,
        settings: ControllerSettings,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        to_wall: Callable[[datetime], datetime] | None = None,
    ) -> None:
        self.controller = controller
        self.settings = settings
        self._monotonic = monotonic
        #: Runs in flight: a token per run, its job and when it started (monotonic s).
        self._in_flight: dict[object, tuple[str, float]] = {}
        self.started = False
        # The scheduler runs on the wall clock; the controller's clock may be warped
        # (a demo replaying a day in minutes): ``to_wall`` maps its times to the wall's.
        self._wall = wall
        self._to_wall = to_wall or (lambda at: at)
        self.scheduler = AsyncIOScheduler(
            timezone=UTC,
            job_defaults={
                "max_instances": 1,
                "coalesce": True,
                "misfire_grace_time": settings.misfire_grace_s,
            },
        )
        self.scheduler.add_listener(self._job_error, EVENT_JOB_ERROR)
        self._add_intervals()

    def _add_intervals(self) -> None:
        cfg, c = self.settings, self.controller
        start = self.wall_now()
        jobs: list[tuple[Job, Callable[[], Awaitable[TickOutcome]], float]] = [
            (Job.LEASE, self.lease, cfg.lease_retry_period_s),
            (Job.INGEST, self.ingest, cfg.ingest_interval_s),
            (Job.FORECAST, self.forecast, cfg.forecast_interval_s),
            (Job.PLAN, c.plan_and_apply, cfg.plan_interval_s),
            (Job.WATCHDOG, c.watchdog, cfg.watchdog_interval_s),
        ]
        for offset_s, (job, tick, every_s) in enumerate(jobs):
            self.scheduler.add_job(
                self._run,
                IntervalTrigger(seconds=every_s, timezone=UTC),
                args=(job, tick),
                id=job.value,
                name=job.value,
                # Staggered first runs, in the order the loop needs: lease, history, ...
                next_run_time=start + timedelta(seconds=offset_s),
            )

    def wall_now(self) -> datetime:
        return datetime.fromtimestamp(self._wall(), UTC)

    async def _run(self, job: Job, tick: Callable[[], Awaitable[TickOutcome]]) -> TickOutcome:
        token = object()
        self._in_flight[token] = (job.value, self._monotonic())
        try:
            return await self.controller.guarded(job, tick)
        finally:
            del self._in_flight[token]

    def _job_error(self, event: JobExecutionEvent) -> None:
        """What escaped a job (``guarded`` catches the ticks' own errors)."""
        exc = event.exception or RuntimeError("unknown error")
        self.controller.metrics.error(f"scheduler:{event.job_id.partition('@')[0]}", exc)
        logger.error("job %s raised: %s: %s", event.job_id, type(exc).__name__, exc)

    def health(self) -> list[str]:
        """What is wrong with the loop, in words; empty when it runs."""
        problems = []
        if self.started and not self.scheduler.running:
            problems.append("the scheduler stopped")
        if self.started:
            present = {job.id for job in self.scheduler.get_jobs()}
            interval_jobs = (Job.LEASE, Job.INGEST, Job.FORECAST, Job.PLAN, Job.WATCHDOG)
            problems += [
                f"job {job.value} is no longer scheduled"
                for job in interval_jobs
                if job.value not in present
            ]
        now_s = self._monotonic()
        stall_s = self.settings.job_stall_s
        problems += [
            f"job {job} has run for {now_s - since_s:.0f} s (stuck past {stall_s:.0f} s)"
            for job, since_s in sorted(self._in_flight.values())
            if now_s - since_s > stall_s
        ]
        return problems

    async def lease(self) -> TickOutcome:
        """The lease tick; a replica that just took the lead and has no forecast (a
        standby reads no history) ingests at once instead of at its next interval."""
        was_leader = self.controller.is_leader()
        outcome = await self.controller.lease()
        if outcome is TickOutcome.DONE and not was_leader and self.controller.state.demand is None:
            self.scheduler.modify_job(Job.INGEST.value, next_run_time=self.wall_now())
        return outcome

    async def ingest(self) -> TickOutcome:
        """The ingest tick; the first history, or a catalog that changed (an edit, an
        unannounced adapter in the traffic), brings the next forecast forward to now."""
        outcome = await self.controller.ingest()
        state = self.controller.state
        if outcome is TickOutcome.DONE and (state.demand is None or state.forecast_now):
            self.scheduler.modify_job(Job.FORECAST.value, next_run_time=self.wall_now())
        return outcome

    async def forecast(self) -> TickOutcome:
        """The forecast tick, then what it changes in the schedule."""
        outcome = await self.controller.forecast()
        if outcome is TickOutcome.DONE:
            self.after_forecast()
        return outcome

    def after_forecast(self) -> None:
        if self.controller.state.replan_now:
            self.scheduler.modify_job(Job.PLAN.value, next_run_time=self.wall_now())
        self.sync_preloads()

    def sync_preloads(self) -> None:
        """One date trigger per due preload time; stale ones removed."""
        wanted = {f"{PRELOAD_PREFIX}{at.isoformat()}": at for at in self.controller.due_preloads()}
        for job in self.scheduler.get_jobs():
            if job.id.startswith(PRELOAD_PREFIX) and job.id not in wanted:
                job.remove()
        for job_id, at in wanted.items():
            self.scheduler.add_job(
                self._run,
                DateTrigger(run_date=max(self._to_wall(at), self.wall_now()), timezone=UTC),
                args=(Job.PRELOAD, self._preload_at(at)),
                id=job_id,
                name=job_id,
                replace_existing=True,
            )

    def _preload_at(self, at: datetime) -> Callable[[], Awaitable[TickOutcome]]:
        async def tick() -> TickOutcome:
            return await self.controller.preload(at)

        return tick

    def job_ids(self) -> list[str]:
        return sorted(job.id for job in self.scheduler.get_jobs())


def add_process_routes(app: FastAPI, schedule: Schedule, registry: CollectorRegistry) -> None:
    """``/healthz`` (the loop runs: 503 with the reasons when not), ``/readyz`` (200 only
    when this replica leads and is healthy: the Service routes webhooks to it alone),
    ``/metrics``."""
    controller = schedule.controller

    def status() -> dict[str, object]:
        plan = controller.state.plan
        return {
            "leader": controller.is_leader(),
            "plan": plan.id if plan is not None else None,
            "backing_off": sorted(job.value for job in controller.state.backoff),
            "problems": schedule.health(),
        }

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        problems = schedule.health()
        return JSONResponse(
            {"status": "ok" if not problems else "failing", "problems": problems},
            status_code=200 if not problems else 503,
        )

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        body = status()
        if body["problems"]:
            reason = "unhealthy"
        elif not schedule.started:
            reason = "starting"
        elif not body["leader"]:
            reason = "standby: the leader takes the webhooks"
        else:
            reason = None
        body["ready"] = reason is None
        body["reason"] = reason
        return JSONResponse(body, status_code=200 if reason is None else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(render(registry), media_type="text/plain; version=0.0.4")


async def serve(
    schedule: Schedule, app: FastAPI, *, host: str, port: int, stop: asyncio.Event | None = None
) -> None:
    """Resume, start the jobs, serve HTTP until stopped; release the lease on the way out."""
    controller = schedule.controller
    try:
        await controller.resume()
    except Exception as exc:  # the API may be down: a lease tick resumes again
        controller.metrics.error("resume", exc)
        logger.warning("could not load the saved state: %s: %s", type(exc).__name__, exc)
    schedule.scheduler.start()
    schedule.started = True
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info"))
    try:
        if stop is None:
            await server.serve()
        else:
            serving = asyncio.create_task(server.serve())
            await stop.wait()
            server.should_exit = True
            await serving
    finally:
        schedule.scheduler.shutdown(wait=False)
        if controller.ports.elector is not None:
            await asyncio.to_thread(controller.ports.elector.release)
        logger.info("controller stopped at %s", datetime.now(UTC).isoformat())
