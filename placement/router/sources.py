"""Where the router gets its plan and its pods: small ports and their file-based adapters.

``PlanSource.poll`` returns a new plan when the source changed, None when it did not,
and raises ``PlanError`` when the source is missing or unreadable, so the router keeps
its last good plan and says why. ``PodSource.upstreams`` returns the pods to route to.
The Kubernetes versions (a ConfigMap, a label selector) are in ``router.kube_sources``.

The catalog changes too: ``CatalogWatchingPlanSource`` re-reads the catalog file at
each plan poll and hands a changed one to the router (a bad one is logged once and
the last good one kept). ``TemplateSources`` is where an adapter the catalog lacks
is loaded from, through ``InputSettings.adapter_source_template``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from placement.domain import AdapterId, Catalog, Fleet
from placement.errors import InputError, PlanError
from placement.inputs.catalog import CatalogFile
from placement.inputs.sources import source_from_template
from placement.plan import Plan, plan_from_json
from placement.router.state import Upstream, upstreams_from_fleet
from placement.settings import InputSettings

log = logging.getLogger("lorafleet.router")


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


class TemplateSources:
    """The source ``rules.adapter_source_template`` gives an adapter name, or None when
    it gives none (a name that is not a DNS label, a source the rules refuse); each
    answer kept, up to ``MAX_REMEMBERED`` names, so a request pays the check once."""

    MAX_REMEMBERED = 4096

    def __init__(self, template: str, *, rules: InputSettings) -> None:
        self.template = template
        self._rules = rules
        self._known: dict[AdapterId, str | None] = {}

    def __call__(self, adapter: AdapterId) -> str | None:
        if adapter in self._known:
            return self._known[adapter]
        try:
            source: str | None = source_from_template(self.template, adapter, rules=self._rules)
        except ValueError:
            source = None
        if len(self._known) >= self.MAX_REMEMBERED:
            self._known.clear()
        self._known[adapter] = source
        return source


class CatalogWatchingPlanSource:
    """A plan source that also re-reads the catalog file at each poll: a changed
    catalog goes to ``on_catalog`` (the router's ``use_adapters``, set by the wiring);
    a bad one is logged once, and the catalog in force stays. The plan's own poll
    answers as the wrapped source's does."""

    def __init__(self, plans: PlanSource, catalog: CatalogFile) -> None:
        self._plans = plans
        self._catalog = catalog
        self._problem: str | None = None
        self.on_catalog: Callable[[Catalog], None] | None = None

    @property
    def description(self) -> str:
        return self._plans.description

    async def poll(self) -> Plan | None:
        try:
            fresh = await asyncio.to_thread(self._catalog.poll)
        except InputError as exc:
            if self._problem != str(exc):
                log.warning("new catalog refused, the last good one stays in force: %s", exc)
            self._problem = str(exc)
        else:
            if fresh is not None and self.on_catalog is not None:
                self.on_catalog(fresh)
                log.info("catalog re-read: %d adapters", len(fresh.adapters))
            if fresh is not None:
                self._problem = None
        return await self._plans.poll()
