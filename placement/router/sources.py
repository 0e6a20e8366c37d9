"""Where the router gets its plan and its pods: small ports and their file-based adapters.

``PlanSource.poll`` returns a new plan when the source changed, None when it did not,
and raises ``PlanError`` when the source is missing or unreadable, so the router keeps
its last good plan and says why. ``PodSource.upstreams`` returns the pods to route to.
The Kubernetes versions (a ConfigMap, a label selector) are in ``router.kube_sources``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from placement.domain import Fleet
from placement.errors import PlanError
from placement.plan import Plan, plan_from_json
from placement.router.state import Upstream, upstreams_from_fleet


class PlanSource(Protocol):
    @property
    def description(self) -> str: ...

    async def poll(self) -> Plan | None:
        """A plan newer than the last one returned, None if unchanged; PlanError if bad."""
        ...


class PodSource(Protocol):
    @property
    def description(self) -> str: ...

    async def upstreams(self) -> tuple[Upstream, ...]: ...


@dataclass(frozen=True, slots=True)
class _Stamp:
    inode: int
    size: int
    mtime_ns: int


class FilePlanSource:
    """A plan JSON file, re-read when its inode, size or modification time changes.

    Writers should replace the file atomically (write beside it, then rename); a
    half-written file fails to parse, and the router keeps the plan it had.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._stamp: _Stamp | None = None
        self._error: PlanError | None = None

    @property
    def description(self) -> str:
        return f"file {self.path}"

    async def poll(self) -> Plan | None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._stamp = None
            raise PlanError(f"{self.path}: no such file") from None
        stamp = _Stamp(inode=stat.st_ino, size=stat.st_size, mtime_ns=stat.st_mtime_ns)
        if stamp == self._stamp:
            if self._error is not None:
                raise self._error
            return None
        self._stamp = stamp
        try:
            text = await asyncio.to_thread(self.path.read_text, encoding="utf-8")
            plan = plan_from_json(text, source=str(self.path))
        except (OSError, UnicodeDecodeError) as exc:
            self._error = PlanError(f"{self.path}: cannot read: {exc}")
            raise self._error from None
        except PlanError as exc:
            self._error = exc
            raise
        self._error = None
        return plan


class StaticPlanSource:
    """A plan given once (or none): for tests, the demo and ``--plan`` absent."""

    def __init__(self, plan: Plan | None) -> None:
        self._plan = plan
        self._sent = False

    @property
    def description(self) -> str:
        return "static plan" if self._plan is not None else "no plan"

    async def poll(self) -> Plan | None:
        if self._plan is None:
            raise PlanError("no plan was given: routing by consistent hashing")
        if self._sent:
            return None
        self._sent = True
        return self._plan


class FleetPodSource:
    """The pods of a fleet file, fixed for the router's lifetime."""

    def __init__(self, fleet: Fleet, *, description: str = "fleet") -> None:
        self._upstreams = upstreams_from_fleet(fleet)
        self._description = description

    @property
    def description(self) -> str:
        return self._description

    async def upstreams(self) -> tuple[Upstream, ...]:
        return self._upstreams
