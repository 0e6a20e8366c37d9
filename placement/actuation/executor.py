"""Run reconcile's actions against pods: in order per pod, bounded, retried, reported.

One action at a time per pod; an unload also waits for the earlier loads of its
adapter on other pods (make before break, ``reconcile.depends_on``); at most
``max_concurrency`` calls in flight over the fleet. A retryable failure is retried
with exponential backoff and full jitter (``rng`` and ``sleep`` are parameters), never
sooner than the pod's ``Retry-After`` asked (capped at ``backoff_max_s``), until
``max_attempts`` or the action's deadline; a permanent one is not. An action whose
prerequisite failed is skipped, so a failed load never leaves its adapter without a
replica. Actions of one pod run in the order given (each waits for the one before it,
whatever ``after`` says), since what a pod's GPU holds depends on that order. Each
action that succeeds is applied to the ledger (``placement.actuation.ledger``: every
pod's engine model) as it completes, so the ledger sees each pod's calls in order.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from placement.actuation.ledger import Ledger
from placement.actuation.reconcile import depends_on
from placement.domain import Action, ActionKind, AdapterId, PodId
from placement.errors import EngineError, PermanentEngineError, RetryableEngineError
from placement.ports import EngineClient
from placement.settings import ExecutorSettings

__all__ = [
    "ActionResult",
    "ApplyReport",
    "Executor",
    "Ledger",
    "PodReport",
    "Sleep",
    "Status",
    "backoff_s",
]

Sleep = Callable[[float], Awaitable[None]]


class Status(enum.StrEnum):
    DONE = "done"
    #: The pod already was in the wanted state ("already loaded", "cannot be found").
    UNCHANGED = "unchanged"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True, kw_only=True)
class ActionResult:
    action: Action
    status: Status
    detail: str = ""
    attempts: int = 0
    #: For a failure: True when retrying later cannot help.
    permanent: bool = False
    #: For a miss: the pod's later actions must not run (see ``_holds_pod``).
    holds_pod: bool = False


@dataclass(frozen=True, kw_only=True)
class PodReport:
    pod: PodId
    done: tuple[ActionResult, ...] = ()
    skipped: tuple[ActionResult, ...] = ()
    failed: tuple[ActionResult, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ApplyReport:
    results: tuple[ActionResult, ...]

    @property
    def ok(self) -> bool:
        return not any(r.status is Status.FAILED for r in self.results)

    @property
    def failed(self) -> tuple[ActionResult, ...]:
        return tuple(r for r in self.results if r.status is Status.FAILED)

    def per_pod(self) -> dict[PodId, PodReport]:
        pods = sorted({r.action.pod for r in self.results})
        return {
            pod: PodReport(
                pod=pod,
                done=self._of(pod, Status.DONE, Status.UNCHANGED),
                skipped=self._of(pod, Status.SKIPPED),
                failed=self._of(pod, Status.FAILED),
            )
            for pod in pods
        }

    def _of(self, pod: PodId, *statuses: Status) -> tuple[ActionResult, ...]:
        return tuple(r for r in self.results if r.action.pod == pod and r.status in statuses)


def backoff_s(
    attempt: int,
    *,
    settings: ExecutorSettings,
    rng: random.Random,
    retry_after_s: float | None = None,
) -> float:
    """Full jitter: uniform in [0, min(max, base * 2**(attempt-1))]; at least the
    pod's ``retry_after_s`` (its Retry-After) when it gave one, but never more than
    ``backoff_max_s``: a pod cannot hold an action (and its concurrency slot) longer
    between attempts than our own schedule could. The draw is made either way, so the
    jitter of later retries does not depend on what a pod said. Pure."""
    cap = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** (attempt - 1))
    jittered_s = rng.uniform(0.0, cap)
    if retry_after_s is None or not retry_after_s > 0.0:  # NaN is not a wait either
        return jittered_s
    return max(jittered_s, min(retry_after_s, settings.backoff_max_s))


class Executor:
    """Runs one tuple of actions; make one per apply."""

    def __init__(
        self,
        clients: Mapping[PodId, EngineClient],
        *,
        lora_paths: Mapping[AdapterId, str],
        settings: ExecutorSettings,
        rng: random.Random,
        sleep: Sleep = asyncio.sleep,
        ledger: Ledger | None = None,
        on_result: Callable[[ActionResult], None] | None = None,
    ) -> None:
        self._clients = clients
        self._lora_paths = lora_paths
        self._settings = settings
        self._rng = rng
        self._sleep = sleep
        self.ledger = ledger if ledger is not None else Ledger()
        self._on_result = on_result

    async def run(
        self, actions: tuple[Action, ...], *, after: tuple[tuple[int, ...], ...] | None = None
    ) -> ApplyReport:
        """Run ``actions``; ``after`` (from ``reconcile.schedule``) gives what each waits
        for, else the conservative ``reconcile.depends_on`` order is used."""
        deps = _in_pod_order(actions, depends_on(actions) if after is None else after)
        finished = [asyncio.Event() for _ in actions]
        results: list[ActionResult | None] = [None] * len(actions)
        gate = asyncio.Semaphore(max(1, self._settings.max_concurrency))

        async def one(index: int) -> None:
            for dep in deps[index]:
                await finished[dep].wait()
            blocker = next(
                (results[d] for d in deps[index] if _blocks(results[d], actions[index])),
                None,
            )
            if blocker is not None:
                result = ActionResult(
                    action=actions[index],
                    status=Status.SKIPPED,
                    detail=f"after {blocker.action.describe()} did not succeed",
                    holds_pod=_holds_pod(actions[index], blocker=blocker, permanent=False),
                )
            else:
                async with gate:
                    result = await self._attempt(actions[index])
            results[index] = result
            finished[index].set()
            if self._on_result is not None:
                self._on_result(result)

        await asyncio.gather(*(one(i) for i in range(len(actions))))
        return ApplyReport(results=tuple(r for r in results if r is not None))

    async def _attempt(self, action: Action) -> ActionResult:
        attempts = 0
        deadline_s = self._settings.per_action_deadline_s
        try:
            async with asyncio.timeout(deadline_s):
                while True:
                    attempts += 1
                    try:
                        changed = await self._call(action)
                    except RetryableEngineError as exc:
                        if attempts >= self._settings.max_attempts:
                            raise
                        delay_s = backoff_s(
                            attempts,
                            settings=self._settings,
                            rng=self._rng,
                            retry_after_s=exc.retry_after_s,
                        )
                        await self._sleep(delay_s)
                        continue
                    break
        except TimeoutError:
            detail = f"no success within the {deadline_s:g} s deadline"
            return self._failed(action, detail, attempts=attempts, permanent=False)
        except EngineError as exc:
            permanent = isinstance(exc, PermanentEngineError)
            return self._failed(action, str(exc), attempts=attempts, permanent=permanent)
        self.ledger.record(
            action, changed=changed, lora_path=self._lora_paths.get(action.adapter, "")
        )
        status = Status.DONE if changed else Status.UNCHANGED
        return ActionResult(action=action, status=status, attempts=attempts)

    @staticmethod
    def _failed(action: Action, detail: str, *, attempts: int, permanent: bool) -> ActionResult:
        return ActionResult(
            action=action,
            status=Status.FAILED,
            detail=detail,
            attempts=attempts,
            permanent=permanent,
            holds_pod=_holds_pod(action, blocker=None, permanent=permanent),
        )

    async def _call(self, action: Action) -> bool:
        client = self._clients.get(action.pod)
        if client is None:
            raise PermanentEngineError("no client for this pod", pod=action.pod)
        if action.kind is ActionKind.LOAD:
            path = self._lora_paths.get(action.adapter)
            if path is None:
                raise PermanentEngineError(
                    f"no lora_path (catalog source) for {action.adapter}", pod=action.pod
                )
            return await client.load(
                action.adapter, lora_path=path, pinned=action.pinned, inplace=action.inplace
            )
        if action.kind is ActionKind.UNLOAD:
            return await client.unload(action.adapter)
        await client.warmup(action.adapter)
        return True


def _in_pod_order(
    actions: tuple[Action, ...], after: tuple[tuple[int, ...], ...]
) -> tuple[tuple[int, ...], ...]:
    """``after`` with each action also waiting for the previous one on its pod."""
    last_on_pod: dict[PodId, int] = {}
    deps = []
    for index, action in enumerate(actions):
        previous = last_on_pod.get(action.pod)
        wait = after[index]
        deps.append(wait if previous is None or previous in wait else (*wait, previous))
        last_on_pod[action.pod] = index
    return tuple(deps)


def _holds_pod(action: Action, *, blocker: ActionResult | None, permanent: bool) -> bool:
    """Whether a miss on ``action`` must hold back the rest of its pod.

    An unload not done leaves no room; a load that failed in a way it may still land
    (a timeout, a 5xx) may take a slot; a pod already held stays held. A load refused
    for good, or a warm-up, took no slot, and holds back only its own adapter.
    """
    if action.kind is ActionKind.UNLOAD or (blocker is not None and blocker.holds_pod):
        return True
    return action.kind is ActionKind.LOAD and blocker is None and not permanent


def _blocks(result: ActionResult | None, action: Action) -> bool:
    if result is None:
        return True
    if result.status in (Status.DONE, Status.UNCHANGED):
        return False
    return result.holds_pod or result.action.adapter == action.adapter
