"""The Protocols the router, the controller and the executor use to reach pods.

Each port has one real adapter per engine (``placement.adapters.vllm``,
``placement.adapters.sglang``, picked by ``placement.adapters.engines.engine_client``)
and one in-memory twin (the emulated pod, ``placement.emulator``), and one contract
suite (``tests/pods``) runs against both. This module holds types only: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from placement.domain import AdapterId, PodId


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

    async def load(self, adapter: AdapterId, *, lora_path: str, pinned: bool = False) -> bool:
        """Register ``adapter``; True if it was loaded now, False if it already was."""
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
