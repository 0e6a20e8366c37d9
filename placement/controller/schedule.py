"""When the controller's ticks run: APScheduler 3 jobs, and the process around them.

Owns the schedule only. Every job runs at most one instance at a time, missed runs
coalesce into one, and a run later than ``misfire_grace_s`` is skipped; the ticks
themselves (``placement.controller.ticks``) do the work and keep their own backoff. Jobs:

- ``lease``: every third of the lease duration (acquire, renew, take over);
- ``ingest``, ``forecast``, ``plan``, ``watchdog``: at their intervals; the first
  history brings the first forecast forward, and a forecast that moves adapters
  between tiers (the first one included) brings the next ``plan`` run forward to now;
- ``preload@<time>``: one date trigger per time the look-ahead plan preloads at.

``serve`` runs the scheduler and the webhook/metrics app in one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import uvicorn
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from placement.controller.ports import Job, TickOutcome
from placement.controller.ticks import Controller
from placement.errors import LorafleetError
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
        to_wall: Callable[[datetime], datetime] | None = None,
    ) -> None:
        self.controller = controller
        self.settings = settings
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
        self._add_intervals()

    def _add_intervals(self) -> None:
        cfg, c = self.settings, self.controller
        start = self.wall_now()
        jobs: list[tuple[Job, Callable[[], Awaitable[TickOutcome]], float]] = [
            (Job.LEASE, c.lease, max(1.0, cfg.lease_duration_s / 3)),
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
        return await self.controller.guarded(job, tick)

    async def ingest(self) -> TickOutcome:
        """The ingest tick; the first history brings the first forecast forward to now."""
        outcome = await self.controller.ingest()
        if outcome is TickOutcome.DONE and self.controller.state.demand is None:
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


def add_process_routes(app: FastAPI, controller: Controller, registry: CollectorRegistry) -> None:
    """``/healthz`` (the loop is alive), ``/readyz`` (leading or standing by), ``/metrics``."""

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        plan = controller.state.plan
        return JSONResponse(
            {
                "leader": controller.is_leader(),
                "plan": plan.id if plan is not None else None,
                "backing_off": sorted(job.value for job in controller.state.backoff),
            }
        )

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
    except LorafleetError as exc:  # the API may be down: a lease tick resumes again
        logger.warning("could not load the saved state: %s", exc)
    schedule.scheduler.start()
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
