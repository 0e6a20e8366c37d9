"""The router's ledger of what each pod holds: registered and GPU-active adapters, in LRU order.

Neither vLLM nor SGLang reports GPU residency per adapter (POD-API.md), so the router
keeps its own account from what it routed, what it loaded and what the plan says the
controller loaded, and corrects it against each pod's ``/v1/models`` listing.

The model follows vLLM's LRUCacheLoRAModelManager: a request activates its adapter into
one of ``max_loras`` GPU slots, evicting the least recently used active one; a load
registers an adapter in a host cache of ``max_cpu_loras`` entries, evicting the least
recently used registration (vLLM keeps an evicted registration *listed* and reloads it
from its path on next use, so ``listed`` is tracked apart from ``registered``).

No IO, no clock: the caller owns the ledger and calls it from one event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from placement.domain import AdapterId, Outcome


class PodLedger:
    """One pod's registered and GPU-active adapters, each an LRU (oldest first)."""

    __slots__ = ("_active", "_listed", "_registered", "max_cpu_loras", "max_loras")

    def __init__(self, *, max_loras: int, max_cpu_loras: int) -> None:
        self.max_loras = max(1, max_loras)
        self.max_cpu_loras = max(self.max_loras, max_cpu_loras)
        self._active: OrderedDict[AdapterId, None] = OrderedDict()
        self._registered: OrderedDict[AdapterId, None] = OrderedDict()
        self._listed: set[AdapterId] = set()

    def classify(self, adapter: AdapterId) -> Outcome:
        """How a request for ``adapter`` admitted now would find it."""
        if adapter in self._active:
            return Outcome.GPU_HIT
        if adapter in self._registered:
            return Outcome.CPU_HIT
        return Outcome.COLD_LOAD

    def is_active(self, adapter: AdapterId) -> bool:
        return adapter in self._active

    def is_listed(self, adapter: AdapterId) -> bool:
        """Whether the pod knows the name at all (a request for it will not 404)."""
        return adapter in self._listed

    def has_free_slot(self) -> bool:
        return len(self._active) < self.max_loras

    @property
    def active_view(self) -> Collection[AdapterId]:
        """The GPU-active adapters, least recently used first (a live view, not a copy)."""
        return self._active.keys()

    @property
    def registered_view(self) -> Collection[AdapterId]:
        return self._registered.keys()

    def active(self) -> tuple[AdapterId, ...]:
        return tuple(self._active)

    def registered(self) -> tuple[AdapterId, ...]:
        return tuple(self._registered)

    def register(self, adapter: AdapterId) -> AdapterId | None:
        """A load finished: the adapter sits in the host cache. Returns the one evicted."""
        self._listed.add(adapter)
        return _touch(self._registered, adapter, self.max_cpu_loras)

    def activate(self, adapter: AdapterId) -> AdapterId | None:
        """A request was routed here: the adapter takes a GPU slot. Returns the one evicted."""
        self._listed.add(adapter)
        _touch(self._registered, adapter, self.max_cpu_loras)
        return _touch(self._active, adapter, self.max_loras)

    def forget(self, adapter: AdapterId) -> None:
        """The adapter was unloaded from the pod."""
        self._active.pop(adapter, None)
        self._registered.pop(adapter, None)
        self._listed.discard(adapter)

    def clear(self) -> None:
        """The pod restarted empty."""
        self._active.clear()
        self._registered.clear()
        self._listed.clear()

    def seed(self, *, hot: Iterable[AdapterId], warm: Iterable[AdapterId]) -> None:
        """Expect what a plan says: warm ones registered, hot ones also active.

        The names are not marked as listed: until ``/v1/models`` shows them, the router
        still asks the pod to load them (a no-op if the controller already did).
        """
        for adapter in warm:
            if adapter not in self._registered:
                _touch(self._registered, adapter, self.max_cpu_loras)
        for adapter in hot:
            _touch(self._registered, adapter, self.max_cpu_loras)
            _touch(self._active, adapter, self.max_loras)

    def reconcile_listing(self, listed: Iterable[AdapterId]) -> None:
        """Correct the ledger from the pod's ``/v1/models``: the names it knows now.

        A name the ledger holds that the pod no longer lists was unloaded (or the pod
        restarted); a listed name the ledger lacks was loaded by someone else and is
        put at the cold end of the host cache.
        """
        names = set(listed)
        known = self._listed | set(self._registered) | set(self._active)
        for adapter in [a for a in known if a not in names]:
            self.forget(adapter)
        for adapter in names - self._listed:
            self._listed.add(adapter)
            if len(self._registered) < self.max_cpu_loras:
                self._registered[adapter] = None
                self._registered.move_to_end(adapter, last=False)


def _touch(lru: OrderedDict[AdapterId, None], adapter: AdapterId, limit: int) -> AdapterId | None:
    if adapter in lru:
        lru.move_to_end(adapter)
        return None
    lru[adapter] = None
    if len(lru) > limit:
        evicted, _ = lru.popitem(last=False)
        return evicted
    return None
