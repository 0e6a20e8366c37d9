"""The discrete-event fleet model: pods, their adapter caches, batches and loads.

Per pod: what the engine holds (``SimPod.model``, the engine model of
``placement.residency``: the names it lists, its host cache of ``max_cpu_loras``, its
``max_loras`` GPU slots, and what each load and request does to them), a running
batch of up to ``max_num_seqs``, a FIFO queue, and adapter loads in the five swap
phases. A request for an adapter off the GPU is loaded where the pod does not list it
(the router's load; on vLLM a load activates it) and requested otherwise; a planned
preload does the same. The engine evicts the least recently used adapter with no
request running or queued, as vLLM's LRU does: a plan's hot set has no protection
from it (vLLM has no pin over HTTP). Another ``EvictionPolicy`` stands for an engine
that would evict otherwise (counterfactual: it protects the plan's hot set), its
victim passed to the model (``placement.sim.eviction_choice``). A load drains the batch first (up to
``max_drain_ms``) and the pod admits nothing new until the weights are in: that is
the convoy effect (the default ``SimSettings.load_admission``; under "vllm", vLLM's
scheduler, ``placement.sim.admission``). The step cost rises with batch size and
distinct adapters. A request's outcome (GPU hit, host hit, cold load) is set where
it is routed and made heavier, never lighter, by the load it then waits for: its
adapter may have left the GPU or the host cache meanwhile, and the engine reads it
again.

Events live on one heap of ``(time_s, kind, pod, request)`` tuples merged with the
sorted arrivals; state is plain lists, dicts and deques so that a replay runs at
over a million requests a minute. Routing and eviction are the pure functions of
``policies``; the router object passed in decides where each request goes. The
loop, routing and the batch are here; ``FleetReplay``'s other parts are its loads
(``placement.sim.loads``), its event and fault delivery (``placement.sim.deliveries``)
and its victim choice; what it records is ``placement.sim.sim_log``'s ``SimLog``.
Owns no IO and no wall clock.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import Protocol

from placement.domain import Action
from placement.forecast.event_preloads import Event
from placement.settings import LoadCostSettings, SimSettings
from placement.sim.admission import EngineAdmission
from placement.sim.events import SimEvent
from placement.sim.faults import FaultSchedule
from placement.sim.pods import PodSpec, SimPod
from placement.sim.sim_log import (
    COLD_LOAD,
    CPU_HIT,
    DONE,
    EVENT,
    FAULT,
    GPU_HIT,
    LOAD_DONE,
    PLAN,
    REJECTED,
    RETRY,
    WARMUP_DONE,
    SimLog,
)
from placement.sim.workload import SimWorkload
from policies.eviction import EvictionPolicy, EvictionSettings
from policies.routing import RouteDecision, RouteReason

#: Importable from here, as before the log, the loads and the deliveries moved out.
__all__ = [
    "COLD_LOAD",
    "CPU_HIT",
    "GPU_HIT",
    "MAX_RETRIES",
    "REJECTED",
    "WARMUP_TOKENS",
    "FleetReplay",
    "SimLog",
    "SimRouter",
]

#: A request waiting on memory pressure is rejected after this many retries.
MAX_RETRIES = 200
#: A warm-up's prompt and output tokens: the engine clients' warm-up ("warm-up",
#: ``max_tokens`` 1, placement/adapters/vllm.py).
WARMUP_TOKENS = (3, 1)


class SimRouter(Protocol):
    """What the engine asks of a policy: where to send a request, and when to replan."""

    eviction: EvictionPolicy

    def route(self, adapter: str, now_s: float) -> RouteDecision: ...

    def observe(self, adapter: str, now_s: float) -> bool:
        """Note an arrival; True asks the engine for an early replan."""
        ...

    def plan(self, now_s: float, replay: FleetReplay) -> dict[str, frozenset[str]] | None:
        """Replan; returns the adapters each pod should hold hot (None: no planning)."""
        ...

    def on_event(self, event: Event, now_s: float, replay: FleetReplay) -> tuple[Action, ...]:
        """A pipeline or login event: the Load/Warmup actions it sends (reactive: none)."""
        ...


class FleetReplay(EngineAdmission):
    """One replay of one workload under one router."""

    def __init__(
        self,
        workload: SimWorkload,
        specs: list[PodSpec],
        *,
        sim: SimSettings,
        load_cost: LoadCostSettings,
        eviction_settings: EvictionSettings | None = None,
        events: list[SimEvent] | None = None,
        faults: FaultSchedule | None = None,
    ) -> None:
        self.workload = workload
        self.events = events or []
        self.faults = faults or FaultSchedule()
        #: When each pod's load in flight lands (a restart waits for it).
        self.load_end_s: dict[int, float] = {}
        self.pods = [SimPod(spec) for spec in specs]
        self.specs = specs
        self.index = {spec.pod_id: i for i, spec in enumerate(specs)}
        self.sim = sim
        self.load_cost = load_cost
        self.eviction_settings = eviction_settings or EvictionSettings()
        count = len(workload)
        self.log = SimLog(
            pod=[-1] * count, outcome=[REJECTED] * count, ttft_ms=[0.0] * count, end_s=[0.0] * count
        )
        self.heap: list[tuple[float, int, int, int]] = []
        self.retries: dict[int, int] = {}
        self.preload_names: list[str] = []
        self.preload_code: dict[str, int] = {}
        self.now_s = 0.0
        self.arrived = 0
        self._next_use: dict[str, list[float]] | None = None
        self._track_recent = False
        self.router_eviction = EvictionPolicy.LRU
        #: The latest forecast (req/s per adapter), for forecast-aware eviction.
        self.forecast_rps: dict[str, float] = {}
        #: ``SimSettings.load_admission`` "vllm" (``placement.sim.admission``), and there
        #: each running request's pod's ``stall_s`` when it was admitted or last moved.
        self.vllm_admission = sim.load_admission == "vllm"
        self.stall_seen_s: dict[int, float] = {}

    # --- the loop ------------------------------------------------------------------

    def run(self, router: SimRouter) -> SimLog:
        self._track_recent = router.eviction in (
            EvictionPolicy.TIME_WEIGHTED_LRU,
            EvictionPolicy.CHAMELEON,
        )
        if router.eviction is EvictionPolicy.BELADY:
            self._next_use = self._arrivals_by_adapter()
        if router.eviction is EvictionPolicy.BELADY:
            for pod in self.pods:
                pod.victim_cost = self._victim_cost
        arrivals = self.workload.arrival_s
        count = len(arrivals)
        heap = self.heap
        self.router_eviction = router.eviction
        if count:
            heappush(heap, (0.0, PLAN, -1, -1))
        for k, sim_event in enumerate(self.events):
            heappush(heap, (sim_event.at_s, EVENT, -1, k))
        for k, step in enumerate(self.faults.steps):
            if step.pod_id in self.index:
                heappush(heap, (step.at_s, FAULT, self.index[step.pod_id], k))
        i = 0
        while i < count or heap:
            if heap and (i >= count or heap[0][0] <= arrivals[i]):
                now_s, kind, p, r = heappop(heap)
                self.now_s = now_s
                if kind == DONE:
                    self._done(p, r, now_s)
                elif kind == LOAD_DONE:
                    self._load_done(p, now_s)
                elif kind == RETRY:
                    self._route(router, r, now_s)
                elif kind == EVENT:
                    self._event(router, r, now_s)
                elif kind == FAULT:
                    for moved in self._fault(p, r, now_s):  # an outage's queue goes elsewhere
                        self._route(router, moved, now_s)
                elif kind == WARMUP_DONE:
                    self._warmup_done(p, now_s)
                else:
                    self._plan(router, now_s, scheduled=True)
                continue
            now_s = arrivals[i]
            self.now_s = now_s
            self.arrived = i + 1
            if router.observe(self.workload.adapters[i], now_s):
                self._plan(router, now_s, scheduled=False)
            self._route(router, i, now_s)
            i += 1
        self._close_residency()
        return self.log

    def _plan(self, router: SimRouter, now_s: float, *, scheduled: bool) -> None:
        hot = router.plan(now_s, self)
        if (
            scheduled
            and hot is not None
            and now_s + self.sim.plan_interval_s <= self.workload.duration_s
        ):
            heappush(self.heap, (now_s + self.sim.plan_interval_s, PLAN, -1, -1))
        if hot is None:
            return
        self.log.plans += 1
        for p, pod in enumerate(self.pods):
            wanted = hot.get(pod.pod_id, frozenset())
            pod.planned = wanted
            for adapter in sorted(wanted):
                if adapter not in pod.gpu_adapters and adapter not in pod.loading:
                    pod.queue.append(-1 - self._code(adapter))
            self._pump(p, now_s)

    def _event(self, router: SimRouter, k: int, now_s: float) -> None:
        """An event, delivered: the router's actions for it (``placement.sim.deliveries``)."""
        event = self.events[k].event
        self.log.events.append(event.id)
        self._preload_for_event(router.on_event(event, now_s, self), now_s)

    def _code(self, adapter: str) -> int:
        code = self.preload_code.get(adapter)
        if code is None:
            code = self.preload_code[adapter] = len(self.preload_names)
            self.preload_names.append(adapter)
        return code

    # --- requests ------------------------------------------------------------------

    def _route(self, router: SimRouter, r: int, now_s: float) -> None:
        adapter = self.workload.adapters[r]
        decision = router.route(adapter, now_s)
        if decision.pod_id is None:
            tries = self.retries.get(r, 0)
            if decision.reason is RouteReason.PRESSURE_WAIT and tries < MAX_RETRIES:
                self.retries[r] = tries + 1
                heappush(self.heap, (now_s + self.sim.pressure_retry_s, RETRY, -1, r))
            elif decision.reason is RouteReason.REJECT:
                self.log.shed.append(r)
            return
        p = self.index[decision.pod_id]
        pod = self.pods[p]
        if adapter in pod.gpu_adapters:
            outcome = GPU_HIT
        elif adapter in pod.loading:
            outcome = COLD_LOAD if pod.load_cold else CPU_HIT
        else:
            outcome = CPU_HIT if adapter in pod.registered else COLD_LOAD
        self.log.outcome[r] = outcome
        self.log.pod[r] = p
        if pod.preloaded:
            used = pod.preloaded.pop(adapter, None)
            if used is not None:
                self.log.preload_used[used] = True
        for name in decision.refresh:  # class warm-ups go ahead of the request
            pod.warmups[name] = pod.warmups.get(name, 0) + 1
            pod.queue.append(-1 - self._code(name))
        pod.queue.append(r)
        pod.queue_depth += 1
        waiting = pod.waiting_adapters
        waiting[adapter] = waiting.get(adapter, 0) + 1
        counts = pod.load_counts.get(adapter)
        pod.queued_since[r] = (counts[0], counts[1]) if counts is not None else (0, 0)
        self._pump(p, now_s)

    def _pump(self, p: int, now_s: float) -> None:
        if self.vllm_admission:
            self._pump_vllm(p, now_s)
            return
        pod = self.pods[p]
        queue = pod.queue
        adapters = self.workload.adapters
        max_seqs = self.sim.max_num_seqs
        while queue and pod.load_adapter is None and pod.healthy:
            r = queue[0]
            adapter = adapters[r] if r >= 0 else self.preload_names[-1 - r]
            if r < 0 and adapter in pod.warmups:
                if adapter in pod.gpu_adapters and pod.running >= max_seqs:
                    return  # a warm-up is a request: it waits for room in the batch
                queue.popleft()
                pending = pod.warmups.pop(adapter) - 1
                if pending:
                    pod.warmups[adapter] = pending
                if adapter in pod.gpu_adapters:
                    self._warm_up(pod, p, adapter, now_s)
                continue
            wanted = r < 0 and adapter in pod.event_wanted
            if wanted:
                pod.event_wanted.discard(adapter)  # event_preloads chose what it displaces
            elif r < 0 and (adapter not in pod.planned or not self._worth_preloading(pod, now_s)):
                queue.popleft()  # the latest plan no longer wants it, or it would evict
                continue  # an adapter in use a moment ago
            if adapter not in pod.gpu_adapters:
                self._start_load(pod, p, adapter, now_s, r)
                if wanted:
                    pod.preloaded[adapter] = len(self.log.preload_used)
                    self.log.preload_used.append(False)
                    self.log.preload_at_s.append(now_s)
                return
            if r < 0:
                queue.popleft()
                continue
            if not self._room(pod, r, max_seqs):
                return
            queue.popleft()
            self._admit_queued(pod, p, r, adapter, now_s)

    def _admit(self, pod: SimPod, p: int, r: int, adapter: str, need: int, now_s: float) -> None:
        sim = self.sim
        pod.running += 1
        running = pod.running_adapters
        running[adapter] = running.get(adapter, 0) + 1
        pod.kv_tokens += need
        pod.kv_usage = pod.kv_tokens / sim.kv_capacity_tokens
        pod.gpu_util = min(1.0, pod.running / sim.max_num_seqs)
        step_ms = (
            sim.decode_ms_per_step
            * (1.0 + sim.batch_step_slowdown * pod.running / sim.max_num_seqs)
            * (1.0 + sim.adapter_step_cost * (len(running) - 1))
        )
        prefill_ms = self.workload.prompt_tokens[r] * sim.prefill_ms_per_token
        log = self.log
        log.ttft_ms[r] = (now_s - self.workload.arrival_s[r]) * 1000.0 + prefill_ms
        end_s = now_s + (prefill_ms + self.workload.output_tokens[r] * step_ms) / 1000.0
        log.end_s[r] = end_s
        pod.busy_until = max(pod.busy_until, end_s)
        pod.touch(adapter)
        pod.last_used[adapter] = now_s
        pod.uses[adapter] = pod.uses.get(adapter, 0) + 1
        pod.served.add(adapter)
        if self._track_recent:
            self._remember(pod, adapter, now_s)
        if self.vllm_admission:
            self._admitted_vllm(pod, r, now_s + prefill_ms / 1000.0)
        heappush(self.heap, (end_s, DONE, p, r))

    def _warm_up(self, pod: SimPod, p: int, adapter: str, now_s: float) -> None:
        """A class warm-up reaches the batch: a short request for ``adapter`` (on its
        GPU slot) that refreshes its LRU place and holds a batch place while it runs."""
        sim = self.sim
        pod.running += 1
        pod.gpu_util = min(1.0, pod.running / sim.max_num_seqs)
        prompt_tokens, output_tokens = WARMUP_TOKENS
        step_ms = sim.decode_ms_per_step * (
            1.0 + sim.batch_step_slowdown * pod.running / sim.max_num_seqs
        )
        end_s = now_s + (prompt_tokens * sim.prefill_ms_per_token + output_tokens * step_ms) / 1e3
        pod.busy_until = max(pod.busy_until, end_s)
        pod.touch(adapter)
        pod.last_used[adapter] = now_s
        self.log.warmups += 1
        heappush(self.heap, (end_s, WARMUP_DONE, p, -1))

    def _warmup_done(self, p: int, now_s: float) -> None:
        pod = self.pods[p]
        pod.running -= 1
        if pod.load_adapter is None:
            pod.gpu_util = pod.running / self.sim.max_num_seqs
        self._pump(p, now_s)

    def _remember(self, pod: SimPod, adapter: str, now_s: float) -> None:
        recent = pod.recent.get(adapter)
        if recent is None:
            recent = pod.recent[adapter] = deque()
        recent.append(now_s)
        horizon = now_s - self.eviction_settings.window_s
        while recent[0] < horizon:
            recent.popleft()

    def _done(self, p: int, r: int, now_s: float) -> None:
        pod = self.pods[p]
        if self.vllm_admission and self._stalled_past(pod, p, r, now_s):
            return
        adapter = self.workload.adapters[r]
        pod.running -= 1
        running = pod.running_adapters
        left = running[adapter] - 1
        if left:
            running[adapter] = left
        else:
            del running[adapter]
        pod.last_step(adapter)  # vLLM and SGLang: a GPU slot is as recent as its last step
        pod.kv_tokens -= self.workload.prompt_tokens[r] + self.workload.output_tokens[r]
        pod.kv_usage = pod.kv_tokens / self.sim.kv_capacity_tokens
        if pod.load_adapter is None:
            pod.gpu_util = pod.running / self.sim.max_num_seqs
        self._pump(p, now_s)

    def _close_residency(self) -> None:
        for pod in self.pods:
            self.log.residency_s.extend(pod.residencies_s)
            self.log.residency_end_s.extend(pod.residency_ends_s)
            for loaded_at in pod.gpu_adapters.values():
                self.log.residency_s.append(max(0.0, self.now_s - loaded_at))
                self.log.residency_end_s.append(self.now_s)
