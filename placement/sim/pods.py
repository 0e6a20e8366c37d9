"""One simulated pod: what its engine holds, and the batch and queue the replay mutates.

What a pod holds (the names it lists, its host cache, its GPU slots and their LRU
orders) is ``placement.residency.PodResidency``, the engine model the emulator and the
router's ledger run too, so the replay and an emulated pod cannot disagree. ``SimPod``
calls it for each load, unload and request (and each request's last step) and keeps,
next to it, what the model does not: time (when an adapter landed on its slot, when it
was used), the running batch and queue, and two mirrors of the model's state that the
routers read per request without a copy (``gpu_adapters``, ``registered``). The
mirrors are rebuilt from the model after every call that moves anything, and
``agrees()`` checks them.

Speed: a hit (a request for an adapter on a GPU slot) and a last step change only the
LRU orders, so they are noted, not sent: before the model is next called or read
(``model``), the hits since are sent in the order of their last request, then, on
SGLang, where a last step moves the GPU order alone, the mirror's GPU order is set,
which leaves the model exactly as one call each would (a replay sends hundreds of
thousands).

``SimPod`` satisfies ``policies.routing.PodLike``. Mutated only by the
replay (``placement.sim.engine`` and its parts ``loads``, ``deliveries`` and
``eviction_choice``) and by tests, through ``load``, ``unload`` and ``request``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from placement.residency import Effects, EngineModel, PodResidency

_HIT = Effects()


@dataclass(frozen=True, kw_only=True)
class PodSpec:
    pod_id: str
    max_loras: int
    #: vLLM: ``--max-cpu-loras`` (the host cache); SGLang: ``--max-loaded-loras``.
    max_cpu_loras: int
    capacity_rps: float = 1.0
    engine: EngineModel = EngineModel.VLLM
    #: The pool's adapter storage (fleet.yaml ``storage:``); None: the load-cost
    #: settings' storage bandwidth.
    storage_bytes_per_s: float | None = None
    first_byte_ms: float = 0.0


class SimPod:
    """One pod's live state; satisfies ``policies.routing.PodLike`` without copies."""

    __slots__ = (
        "_hits",
        "_model",
        "_steps",
        "busy_until",
        "event_wanted",
        "free_slots",
        "ghosts",
        "gpu_adapters",
        "gpu_util",
        "healthy",
        "kv_tokens",
        "kv_usage",
        "last_used",
        "load_adapter",
        "load_cold",
        "load_counts",
        "loading",
        "max_cpu_loras",
        "max_loras",
        "passed",
        "planned",
        "pod_id",
        "prefilling",
        "preloaded",
        "queue",
        "queue_depth",
        "queued_since",
        "recent",
        "registered",
        "residencies_s",
        "residency_ends_s",
        "running",
        "running_adapters",
        "served",
        "stall_s",
        "uses",
        "victim_cost",
        "waiting_adapters",
        "warmups",
    )

    def __init__(self, spec: PodSpec) -> None:
        self.pod_id = spec.pod_id
        self.max_loras = spec.max_loras
        self.max_cpu_loras = spec.max_cpu_loras
        self._model = PodResidency(
            spec.engine, max_loras=spec.max_loras, max_cpu_loras=spec.max_cpu_loras
        )
        #: Adapters hit since the model was last called, in the order of their last hit;
        #: and, on SGLang, those whose request ran its last step since (the module's
        #: docstring).
        self._hits: dict[str, None] = {}
        self._steps: set[str] = set()
        self.healthy = True
        self.queue: deque[int] = deque()
        self.queue_depth = 0
        #: Under ``SimSettings.load_admission`` "vllm": the queued requests passed over
        #: because their adapter could get no GPU slot, by adapter in the order the
        #: first of each was passed over (they go before the queue, as vLLM puts its
        #: skipped requests back at the head of the waiting queue); the time the loads
        #: here have stalled the running batch, all told; and the requests admitted
        #: with the time their prefill ends (a load that starts before delays their
        #: first token).
        self.passed: dict[str, deque[int]] = {}
        self.stall_s = 0.0
        self.prefilling: deque[tuple[float, int]] = deque()
        #: Per adapter, the loads started here and how many of them read storage; and
        #: per queued request, those two counts of its adapter when it was queued: a
        #: request admitted after a load of its adapter started waited for that load.
        self.load_counts: dict[str, list[int]] = {}
        self.queued_since: dict[int, tuple[int, int]] = {}
        self.running = 0
        self.kv_tokens = 0
        self.kv_usage = 0.0
        self.gpu_util = 0.0
        #: The model's GPU slots, least recently used first, each with the time it
        #: landed (an adapter still loading is in ``loading`` instead).
        self.gpu_adapters: dict[str, float] = {}
        #: The model's host cache (on SGLang: the adapters it holds loaded).
        self.registered: dict[str, None] = {}
        #: GPU slots held by entries no listed name points to (vLLM after an unload).
        self.ghosts = 0
        #: GPU slots neither landed, loading nor held by a ghost (kept, not computed:
        #: the routers read it for every pod on every request).
        self.free_slots = spec.max_loras
        self.running_adapters: dict[str, int] = {}
        self.waiting_adapters: dict[str, int] = {}
        self.loading: set[str] = set()
        self.load_adapter: str | None = None
        self.load_cold = False
        #: The hot set the latest plan wants here: preloads follow it; only a
        #: counterfactual eviction policy protects it (vLLM's LRU does not).
        self.planned: frozenset[str] = frozenset()
        #: Adapters an event's Warmup queued here and not yet started.
        self.event_wanted: set[str] = set()
        #: Class warm-ups queued here and not yet sent, by adapter (two routes may queue
        #: one each): a request refreshing an adapter on its GPU slot
        #: (``RouteDecision.refresh``). A queue entry of a name counted here is a
        #: warm-up, not a plan's preload.
        self.warmups: dict[str, int] = {}
        #: Adapters an event preloaded here, no request having reached them yet (each
        #: with its index in the log's ``preload_used``); an eviction drops them.
        self.preloaded: dict[str, int] = {}
        self.busy_until = 0.0
        self.last_used: dict[str, float] = {}
        self.uses: dict[str, int] = {}
        self.recent: dict[str, deque[float]] = {}
        self.served: set[str] = set()
        #: How long each adapter that left a GPU slot stayed on it.
        self.residencies_s: list[float] = []
        #: When each of those stays ended (replay seconds), in the same order.
        self.residency_ends_s: list[float] = []
        #: Set by the engine when eviction is not LRU: the victim's cost on the LRU
        #: scale (an equivalent last-use time), so routers compare pods alike.
        self.victim_cost: Callable[[SimPod], float] | None = None

    @property
    def victim_last_used_s(self) -> float:
        if self.victim_cost is not None:
            return self.victim_cost(self)
        victim = lru_victim(self)
        return math.inf if victim is None else self.last_used.get(victim, 0.0)

    @property
    def model(self) -> PodResidency:
        """The engine model, up to date."""
        hits, steps, model = self._hits, self._steps, self._model
        if hits:
            for adapter in [name for name in hits if name in self.gpu_adapters]:
                model.request(adapter)  # both orders (SGLang: the registry's acquire)
        if steps:  # SGLang: the GPU order alone, to the mirror's (hits' places too)
            for adapter in [name for name in self.gpu_adapters if name in steps or name in hits]:
                model.last_step(model.entry(adapter))
            steps.clear()
        hits.clear()
        return model

    # the engine's three calls --------------------------------------------------------
    def load(self, adapter: str, *, busy: Collection[str] = (), now_s: float = 0.0) -> Effects:
        """``load_lora_adapter`` (on vLLM it activates the adapter on a GPU slot)."""
        return self._sync(self.model.load(adapter, adapter, busy=busy), now_s=now_s)

    def unload(self, adapter: str, *, now_s: float = 0.0) -> Effects:
        """``unload_lora_adapter`` (on vLLM the entry keeps its GPU slot: a ghost)."""
        # SGLang keeps the name to load again on use, as the emulator does (``remember``)
        return self._sync(self.model.unload(adapter, remember=True), now_s=now_s, moved=True)

    def request(self, adapter: str, *, busy: Collection[str] = (), now_s: float = 0.0) -> Effects:
        """A request naming ``adapter``: it activates it (reading it again if needed)."""
        if adapter in self.gpu_adapters:
            self.touch(adapter)
            return _HIT
        return self._sync(self.model.request(adapter, busy=busy), now_s=now_s)

    def fetch(self, adapter: str, *, busy: Collection[str], now_s: float) -> Effects:
        """Start putting ``adapter`` on a GPU slot for a request or a preload: loaded
        first where the pod does not serve it (the router's or controller's load), then
        requested unless the load activated it. It stays in ``loading`` until it lands."""
        model = self.model
        if model.serves(adapter):
            return self._sync(model.request(adapter, busy=busy), now_s=now_s, pending=adapter)
        loaded = model.load(adapter, adapter, busy=busy)
        if loaded.activated:
            return self._sync(loaded, now_s=now_s, pending=adapter)
        then = model.request(adapter, busy=busy)
        effects = Effects(
            cold=True,
            activated=then.activated,
            gpu_evicted=loaded.gpu_evicted + then.gpu_evicted,
            host_evicted=loaded.host_evicted + then.host_evicted,
            unlisted=loaded.unlisted + then.unlisted,
        )
        return self._sync(effects, now_s=now_s, pending=adapter)

    def restart(self, now_s: float) -> None:
        """The engine restarted: it holds nothing (no load may be in flight)."""
        for landed_s in self.gpu_adapters.values():
            self.residencies_s.append(max(0.0, now_s - landed_s))
            self.residency_ends_s.append(now_s)
        self._hits.clear()
        self._steps.clear()
        self._model.restart()
        self.gpu_adapters = {}
        self.registered = {}
        self.ghosts = 0
        self.loading.clear()
        self.preloaded.clear()
        self.event_wanted.clear()
        self.warmups.clear()
        self.free_slots = self.max_loras

    def touch(self, adapter: str) -> None:
        """A request for an adapter on a GPU slot: a hit, which refreshes both LRUs."""
        hits = self._hits
        hits.pop(adapter, None)
        hits[adapter] = None
        slots = self.gpu_adapters
        slots[adapter] = slots.pop(adapter)

    def last_step(self, adapter: str) -> None:
        """A request on ``adapter`` ran its last step, which marked its GPU slot used as
        every step does (``PodResidency.last_step``): on vLLM in both LRUs, a hit's
        touch; on SGLang in the GPU pool's only (``LoRAMemoryPool.prepare_lora_batch``:
        ``mark_used``), the soft cap's registry moving on arrival alone. An adapter no
        longer on its GPU slot is left as it is; ``last_used`` keeps the start (what the
        router saw)."""
        slots = self.gpu_adapters
        if adapter not in slots:
            return
        if self._model.engine is EngineModel.VLLM:
            self.touch(adapter)
            return
        self._steps.add(adapter)
        slots[adapter] = slots.pop(adapter)

    def land(self, adapter: str, now_s: float) -> None:
        """The adapter fetched last is on its slot now."""
        self.loading.discard(adapter)
        self.gpu_adapters[adapter] = now_s

    # the mirrors -------------------------------------------------------------------
    def _sync(
        self, effects: Effects, *, now_s: float, pending: str | None = None, moved: bool = False
    ) -> Effects:
        """Bring the mirrors to the model after a call; ``pending`` goes to ``loading``."""
        host_moved = moved or effects.cold or effects.host_evicted or effects.unlisted
        if not (host_moved or effects.activated or effects.gpu_evicted):
            return effects  # a hit: only the LRU orders moved
        model = self._model
        on_gpu = model.on_gpu()
        kept = set(on_gpu)
        for name in [n for n in self.gpu_adapters if n not in kept]:
            self.residencies_s.append(max(0.0, now_s - self.gpu_adapters.pop(name)))
            self.residency_ends_s.append(now_s)
            self.preloaded.pop(name, None)
        for name in on_gpu:
            if name == pending:
                if name not in self.gpu_adapters:
                    self.loading.add(name)
            elif name not in self.gpu_adapters and name not in self.loading:
                self.gpu_adapters[name] = now_s
        for name in [n for n in self.loading if n not in kept]:
            self.preloaded.pop(name, None)
        self.loading.intersection_update(kept)
        if host_moved:  # a request off the GPU but in the host cache leaves it as it was
            self.registered = dict.fromkeys(model.in_host())
        if moved or self.ghosts:  # only an unload makes a ghost; evictions end them
            self.ghosts = model.ghosts_on_gpu()
        self.free_slots = self.max_loras - len(self.gpu_adapters) - len(self.loading) - self.ghosts
        return effects

    def agrees(self) -> bool:
        """Whether the mirrors say what the model holds, in the model's LRU order."""
        model = self.model
        landed = [name for name in model.on_gpu() if name not in self.loading]
        return (
            list(self.gpu_adapters) == landed
            and set(self.registered) == set(model.in_host())
            and self.ghosts == model.ghosts_on_gpu()
            and self.free_slots == self.max_loras - len(model.on_gpu()) - self.ghosts
        )


def lru_victim(pod: SimPod) -> str | None:
    """The adapter the engine evicts next under LRU, read from the mirror: the least
    recently used one with no request running or queued, else the least recently used
    (as the engine model's ``busy``)."""
    fallback: str | None = None
    for adapter in pod.gpu_adapters:
        if adapter not in pod.running_adapters and adapter not in pod.waiting_adapters:
            return adapter
        if fallback is None:
            fallback = adapter
    return fallback
