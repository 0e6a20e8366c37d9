"""Every Protocol lorafleet uses to reach an outside system, and the values that cross.

Pods: ``EngineClient`` has one real adapter per engine (``placement.adapters.vllm``,
``placement.adapters.sglang``, picked by ``placement.adapters.engines.engine_client``)
and one in-memory twin (the emulated pod, ``placement.emulator``), and one contract
suite (``tests/pods``) runs against both.

The cluster: ``PodDiscovery``, ``PlanStore``, ``HotSetBoard``, ``LeaseStore`` and
``StateStore`` have one real adapter each (``placement.adapters.kube`` on Kubernetes,
``placement.adapters.statedir`` on one machine) and an in-memory twin
(``placement.adapters.kube_memory``). The controller and the webhook take these
Protocols; the composition root (``placement.controller.wiring``) chooses the adapters.
Errors: every cluster method raises ``KubeConflictError`` when someone else changed the
object first, ``RetryableKubeError`` for 5xx and transport failures, and ``KubeError``
for the rest; never a client library's own exception.

This module holds types only: no IO.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from placement.domain import AdapterId, PodId, PoolId
from placement.plan import Plan


@dataclass(frozen=True, kw_only=True)
class PodMetrics:
    """What one scrape of a pod's ``/metrics`` says about its load.

    ``running_adapters`` and ``waiting_adapters`` come from vLLM's
    ``lora_requests_info`` (the series with the largest value): they show adapters with
    requests in flight, not residency. SGLang exposes no per-adapter series, so they
    are empty there and ``lora_slots_used``/``lora_slots_total`` are set instead.
    """

    running: int = 0
    waiting: int = 0
    #: Share of the KV cache in use, 0..1.
    kv_usage: float = 0.0
    running_adapters: frozenset[AdapterId] = frozenset()
    waiting_adapters: frozenset[AdapterId] = frozenset()
    #: vLLM's ``max_lora`` label of ``lora_requests_info`` when exposed.
    max_loras: int | None = None
    lora_slots_used: int | None = None
    lora_slots_total: int | None = None
    healthy: bool = True


@dataclass(frozen=True, kw_only=True)
class Registered:
    """The adapters a pod lists in ``/v1/models``: name to ``lora_path``."""

    adapters: Mapping[AdapterId, str] = field(default_factory=lambda: MappingProxyType({}))
    #: The served base model name (the base card's id), when the pod lists one.
    base_model: str | None = None

    def names(self) -> frozenset[AdapterId]:
        return frozenset(self.adapters)


@runtime_checkable
class EngineClient(Protocol):
    """One pod's LoRA management and health API, whatever its engine.

    Every method raises ``RetryableEngineError`` (5xx, refused connection, timeout) or
    ``PermanentEngineError`` (the request is wrong for this pod); nothing else escapes.
    """

    @property
    def pod(self) -> PodId: ...

    async def load(
        self, adapter: AdapterId, *, lora_path: str, pinned: bool = False, inplace: bool = False
    ) -> bool:
        """Register ``adapter``; True if it was loaded now, False if it already was.

        ``inplace`` loads new weights under a name already loaded (the catalog's
        ``source`` changed): vLLM's ``load_inplace``; SGLang unloads and loads again.
        """
        ...

    async def unload(self, adapter: AdapterId) -> bool:
        """Unregister ``adapter``; True if it was removed now, False if it was absent."""
        ...

    async def registered(self) -> Registered:
        """The adapters ``/v1/models`` lists (registrations, not GPU residency)."""
        ...

    async def warmup(self, adapter: AdapterId) -> None:
        """Send a one-token completion that activates ``adapter`` on a GPU slot."""
        ...

    async def metrics(self) -> PodMetrics:
        """Scrape ``/metrics``."""
        ...

    async def health(self) -> bool:
        """True when ``/health`` answers 200; False on any failure (never raises)."""
        ...

    async def aclose(self) -> None:
        """Close the HTTP client if this object owns it."""
        ...


#: The label that names a pod's pool when pods come from a label selector.
POOL_LABEL = "lorafleet.io/pool"
#: The plan the published hot sets came from.
PLAN_ID_ANNOTATION = "lorafleet.io/plan-id"

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


@dataclass(frozen=True, kw_only=True)
class DiscoveredPod:
    """A serving pod as the cluster reports it: where to reach it and which pool it is in."""

    name: PodId
    pool: PoolId
    ip: str
    port: int
    ready: bool
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


class PodEventKind(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, kw_only=True)
class PodEvent:
    kind: PodEventKind
    pod: DiscoveredPod


def hot_set_entries(hot_sets: Mapping[PodId, tuple[AdapterId, ...]]) -> dict[str, str]:
    """Each pod's hot set as one line, ``<count> <digest> <adapters, comma-joined>``: the
    same set gives the same line, and equal digests mean equal sets at a glance."""
    entries = {}
    for pod, adapters in sorted(hot_sets.items()):
        ordered = sorted(set(adapters))
        joined = ",".join(ordered)
        digest = hashlib.sha256(joined.encode()).hexdigest()[:12]
        entries[str(pod)] = f"{len(ordered)} {digest} {joined}".rstrip()
    return entries


def is_label_value(text: str) -> bool:
    """Whether Kubernetes accepts ``text`` as a label value (63 chars, alphanumeric ends)."""
    return len(text) <= 63 and _LABEL_VALUE.match(text) is not None


@dataclass(frozen=True, kw_only=True)
class LeaseRecord:
    """A coordination.k8s.io/v1 Lease as the elector sees it."""

    holder: str | None
    duration_s: int
    acquired_at: datetime | None = None
    renewed_at: datetime | None = None
    transitions: int = 0
    #: The server's resourceVersion; a replace with a stale one fails with a conflict.
    version: str | None = None


@dataclass(frozen=True, kw_only=True)
class StoredState:
    """What the controller keeps across restarts: the last good plan and the load ledger."""

    plan_json: str | None
    ledger_json: str | None


class PodDiscovery(Protocol):
    def list_pods(self) -> tuple[DiscoveredPod, ...]:
        """Ready pods only, sorted by name."""
        ...

    def watch_pods(self, *, timeout_s: int) -> Iterator[PodEvent]:
        """Changes to the selected pods until ``timeout_s`` passes or the stream ends."""
        ...


class PlanStore(Protocol):
    def publish(self, plan: Plan) -> None:
        """Make ``plan`` current and keep the one it replaces as the previous plan."""
        ...

    def current(self) -> Plan | None: ...

    def previous(self) -> Plan | None: ...

    def rollback(self) -> Plan:
        """Make the previous plan current again (and the current one previous)."""
        ...


class HotSetBoard(Protocol):
    """Where each pod's hot set is published for people (``kubectl get configmap``),
    written with the plan; no pod is patched (the controller may not patch pods)."""

    def publish_hot_sets(
        self, hot_sets: Mapping[PodId, tuple[AdapterId, ...]], *, plan_id: str
    ) -> None: ...


class LeaseStore(Protocol):
    def read(self) -> LeaseRecord | None: ...

    def create(self, record: LeaseRecord) -> LeaseRecord:
        """Create the lease; KubeConflictError when it already exists."""
        ...

    def replace(self, record: LeaseRecord) -> LeaseRecord:
        """Replace the lease at ``record.version``; KubeConflictError when it moved on."""
        ...


class StateStore(Protocol):
    def load(self) -> StoredState: ...

    def save(self, state: StoredState) -> None: ...
