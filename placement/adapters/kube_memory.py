"""In-memory twins of the cluster ports, for unit tests and for a controller on one machine.

They keep the same contract as ``placement.adapters.kube`` (the contract tests in
``tests/controller/test_kube_contract.py`` run against both): resource versions move
on every write, a stale replace is a ``KubeConflictError``, and ``faults`` queues
errors that the next calls raise, to rehearse a Kubernetes API that answers 500/409.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import replace

from placement.domain import AdapterId, PodId
from placement.errors import KubeConflictError, KubeError, PlanError
from placement.plan import Plan, plan_from_json, plan_to_json
from placement.ports import (
    DiscoveredPod,
    LeaseRecord,
    PodEvent,
    PodEventKind,
    StoredState,
    hot_set_entries,
)


class QueuedKubeErrors:
    """Errors queued for the next calls: each call pops one, if any."""

    def __init__(self) -> None:
        self.queued: list[KubeError] = []

    def check(self) -> None:
        if self.queued:
            raise self.queued.pop(0)


class MemoryPods:
    """Pods a test adds and removes; ``watch_pods`` replays the changes since the last watch."""

    def __init__(self, pods: tuple[DiscoveredPod, ...] = ()) -> None:
        self.faults = QueuedKubeErrors()
        self._pods: dict[PodId, DiscoveredPod] = {pod.name: pod for pod in pods}
        self._events: list[PodEvent] = [PodEvent(kind=PodEventKind.ADDED, pod=p) for p in pods]

    def put(self, pod: DiscoveredPod) -> None:
        kind = PodEventKind.MODIFIED if pod.name in self._pods else PodEventKind.ADDED
        self._pods[pod.name] = pod
        self._events.append(PodEvent(kind=kind, pod=pod))

    def remove(self, name: PodId) -> None:
        pod = self._pods.pop(name, None)
        if pod is not None:
            self._events.append(PodEvent(kind=PodEventKind.DELETED, pod=pod))

    def list_pods(self) -> tuple[DiscoveredPod, ...]:
        self.faults.check()
        return tuple(sorted((p for p in self._pods.values() if p.ready), key=lambda p: p.name))

    def watch_pods(self, *, timeout_s: int) -> Iterator[PodEvent]:
        self.faults.check()
        events, self._events = self._events, []
        yield from events


class MemoryPlanStore:
    """The plan ConfigMap's twin: a current and a previous plan, kept as JSON."""

    def __init__(self) -> None:
        self.faults = QueuedKubeErrors()
        self._current: str | None = None
        self._previous: str | None = None

    def publish(self, plan: Plan) -> None:
        self.faults.check()
        self._previous, self._current = self._current, plan_to_json(plan)

    def current(self) -> Plan | None:
        self.faults.check()
        return None if self._current is None else plan_from_json(self._current, source="memory")

    def previous(self) -> Plan | None:
        self.faults.check()
        return None if self._previous is None else plan_from_json(self._previous, source="memory")

    def rollback(self) -> Plan:
        self.faults.check()
        if self._previous is None:
            raise PlanError("no previous plan to roll back to")
        self._current, self._previous = self._previous, self._current
        return plan_from_json(self._current, source="memory")


class MemoryHotSets:
    """The hot-sets ConfigMap's twin: the last hot sets published, and their plan."""

    def __init__(self) -> None:
        self.faults = QueuedKubeErrors()
        self.hot_sets: dict[PodId, tuple[AdapterId, ...]] = {}
        self.plan_id: str | None = None

    def publish_hot_sets(
        self, hot_sets: Mapping[PodId, tuple[AdapterId, ...]], *, plan_id: str
    ) -> None:
        self.faults.check()
        self.hot_sets = {pod: tuple(sorted(set(adapters))) for pod, adapters in hot_sets.items()}
        self.plan_id = plan_id

    def entries(self) -> dict[str, str]:
        """What the ConfigMap's data would be."""
        return hot_set_entries(self.hot_sets)


class MemoryLeaseStore:
    """One lease shared by every elector given this object, with optimistic concurrency."""

    def __init__(self) -> None:
        self.faults = QueuedKubeErrors()
        self._record: LeaseRecord | None = None
        self._versions = itertools.count(1)

    def read(self) -> LeaseRecord | None:
        self.faults.check()
        return self._record

    def create(self, record: LeaseRecord) -> LeaseRecord:
        self.faults.check()
        if self._record is not None:
            raise KubeConflictError("lease already exists", status=409)
        self._record = replace(record, version=str(next(self._versions)))
        return self._record

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        self.faults.check()
        if self._record is None:
            raise KubeError("lease not found", status=404)
        if record.version != self._record.version:
            raise KubeConflictError("lease changed since it was read", status=409)
        self._record = replace(record, version=str(next(self._versions)))
        return self._record


class MemoryStateStore:
    def __init__(self) -> None:
        self.faults = QueuedKubeErrors()
        self._state = StoredState(plan_json=None, ledger_json=None)

    def load(self) -> StoredState:
        self.faults.check()
        return self._state

    def save(self, state: StoredState) -> None:
        self.faults.check()
        self._state = state
