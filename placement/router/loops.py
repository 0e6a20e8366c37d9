"""The router's background loops, supervised: no round's exception ends its loop.

Each loop (scrape, plan, pods, log) waits its interval and runs one round. A round
that raises anything (an ``Exception``) is logged with what the loop works on (the plan
source, the pod source, the pods, the log file), counted in
``lorafleet_router_loop_errors_total{loop,error}``, and the next round waits the
interval doubled per failure in a row, up to ``loop_backoff_max_s``; the first success
resets it. A loop that ended all the same (cancelled from elsewhere, or a
``BaseException``) or a round running past ``loop_stall_s`` is a ``problem``:
``/healthz`` and ``/readyz`` answer 503 naming it.

``sleep`` and ``timer`` are parameters: tests move them instead of waiting.

Must not know what the rounds do; the router (``router.core``) hands them in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from placement.clock import Clock
from placement.router.metrics import RouterMetrics

log = logging.getLogger("lorafleet.router")

Round = Callable[[], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(kw_only=True, slots=True)
class LoopHealth:
    """How one loop is doing; ``/healthz`` shows it."""

    name: str
    #: What the loop works on, for the log lines: "file plan.json", "every pod".
    concerning: str
    every_s: float
    #: Failed rounds in a row (0 after a success).
    failures: int = 0
    #: Failed rounds since the start.
    errors: int = 0
    last_error: str | None = None
    #: When the round in progress began (on the timer); None between rounds.
    round_started_s: float | None = None
    task: asyncio.Task[None] | None = None

    def delay_s(self, *, backoff_max_s: float) -> float:
        """The wait before the next round: the interval, doubled per failure in a row."""
        if self.failures == 0:
            return self.every_s
        return min(self.every_s * 2.0 ** min(self.failures, 30), max(backoff_max_s, self.every_s))

    def problem(self, *, now_s: float, stall_s: float) -> str | None:
        """Why this loop fails the health check, or None."""
        task = self.task
        if task is not None and task.done():
            if task.cancelled():
                return f"the {self.name} loop stopped (cancelled)"
            error = task.exception()
            if error is None:
                return f"the {self.name} loop stopped"
            return f"the {self.name} loop stopped: {type(error).__name__}: {error}"
        started_s = self.round_started_s
        if started_s is not None and now_s - started_s > stall_s:
            return (
                f"the {self.name} loop has run one round for {now_s - started_s:.0f} s "
                f"(stuck past {stall_s:.0f} s)"
            )
        return None

    def as_json(self) -> dict[str, object]:
        return {
            "every_s": self.every_s,
            "failures_in_a_row": self.failures,
            "errors": self.errors,
            "last_error": self.last_error,
        }


class Supervisor:
    """Runs the loops and keeps their ``LoopHealth``; ``stop`` ends them all."""

    def __init__(
        self,
        *,
        metrics: RouterMetrics,
        timer: Clock,
        backoff_max_s: float,
        stall_s: float,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.metrics = metrics
        self.timer = timer
        self.backoff_max_s = backoff_max_s
        self.stall_s = stall_s
        self.sleep = sleep
        self.loops: dict[str, LoopHealth] = {}

    def start_health(self, name: str, *, every_s: float, concerning: str) -> LoopHealth:
        """The health record of a loop about to start (its first round may run now)."""
        health = LoopHealth(name=name, concerning=concerning, every_s=every_s)
        self.loops[name] = health
        self.metrics.loop_failures.labels(loop=name).set(0)
        return health

    def start(self, health: LoopHealth, round_: Round) -> None:
        """Run ``round_`` every ``health.every_s`` (backed off after failures)."""
        health.task = asyncio.create_task(self._run(health, round_), name=health.name)
        health.task.add_done_callback(self._ended)

    async def _run(self, health: LoopHealth, round_: Round) -> None:
        while True:
            await self.sleep(health.delay_s(backoff_max_s=self.backoff_max_s))
            await self.run_round(health, round_)

    async def run_round(self, health: LoopHealth, round_: Round) -> bool:
        """One supervised round: True if it succeeded. Only cancellation escapes."""
        health.round_started_s = self.timer()
        try:
            await round_()
        except Exception as exc:
            self._failed(health, exc)
            return False
        finally:
            health.round_started_s = None
        if health.failures:
            log.info("the %s loop (%s) works again", health.name, health.concerning)
        health.failures = 0
        self.metrics.loop_failures.labels(loop=health.name).set(0)
        return True

    def _failed(self, health: LoopHealth, exc: Exception) -> None:
        health.failures += 1
        health.errors += 1
        health.last_error = f"{type(exc).__name__}: {exc}"
        self.metrics.loop_errors.labels(loop=health.name, error=type(exc).__name__).inc()
        self.metrics.loop_failures.labels(loop=health.name).set(health.failures)
        delay_s = health.delay_s(backoff_max_s=self.backoff_max_s)
        log.warning(
            "the %s loop (%s) failed %d time(s) in a row, next round in %.1f s: %s",
            health.name,
            health.concerning,
            health.failures,
            delay_s,
            health.last_error,
            exc_info=health.failures == 1,  # the traceback once, not every round
        )

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return  # stop(), or the server shutting down
        error = task.exception()
        log.error("the %s loop ended: %r; /healthz now fails", task.get_name(), error)

    def problems(self) -> list[str]:
        now_s = self.timer()
        found = (
            health.problem(now_s=now_s, stall_s=self.stall_s) for health in self.loops.values()
        )
        return [problem for problem in found if problem is not None]

    async def stop(self) -> None:
        """Cancel every loop and wait for each; whatever one raised stays in its task."""
        tasks = [health.task for health in self.loops.values() if health.task is not None]
        for task in tasks:
            task.remove_done_callback(self._ended)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
