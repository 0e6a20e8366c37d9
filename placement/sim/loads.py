"""The replay engine's adapter loads: whether a preload is worth its victim, a swap's
five phases and what they cost, the storage read of a cold one, what a load charges
the requests waiting for it, and its landing (then the pod's queue moves on).

``EngineLoads`` is a part of ``FleetReplay`` (``placement.sim.engine``), as its victim
choice (``EngineEviction``, which it extends) is: it reads the replay's pods,
workload, settings and faults, and writes the pod it loads on, the log and the heap
(the load's end, a ``LOAD_DONE`` the engine's loop delivers). Owns no IO and no wall
clock.
"""

from __future__ import annotations

from heapq import heappush

from placement.settings import LoadCostSettings, SimSettings
from placement.sim.eviction_choice import EngineEviction
from placement.sim.faults import FaultSchedule
from placement.sim.pods import PodSpec, SimPod, lru_victim
from placement.sim.sim_log import COLD_LOAD, CPU_HIT, LOAD_DONE, SimLog


class EngineLoads(EngineEviction):
    """Loads for ``FleetReplay``; the attributes are the replay's."""

    specs: list[PodSpec]
    pods: list[SimPod]
    sim: SimSettings
    load_cost: LoadCostSettings
    faults: FaultSchedule
    log: SimLog
    heap: list[tuple[float, int, int, int]]
    #: When each pod's load in flight lands (a restart waits for it).
    load_end_s: dict[int, float]

    def _worth_preloading(self, pod: SimPod, now_s: float) -> bool:
        if pod.free_slots > 0:
            return True
        victim = lru_victim(pod)
        return victim is not None and (
            now_s - pod.last_used.get(victim, 0.0) >= self.sim.preload_min_idle_s
        )

    def _start_load(self, pod: SimPod, p: int, adapter: str, now_s: float, r: int) -> None:
        """A swap's five phases: drain the batch, then deallocate, transfer, init, warm up
        (under ``load_admission`` "vllm" no drain, and the load stalls the batch)."""
        cost = self.load_cost
        size = self.workload.size_bytes.get(adapter, 0)
        # Into a free slot the weights move between steps (a swap's best case, no
        # drain); replacing an adapter drains the running batch first.
        drain_ms = 0.0
        if pod.free_slots <= 0 and not self.vllm_admission:
            drain_ms = min(cost.max_drain_ms, max(0.0, pod.busy_until - now_s) * 1000.0)
        effects = self._fetch(pod, adapter, now_s)
        cold = effects.cold
        load_ms = cost.warm_load_ms(size, drain_ms=drain_ms)
        if cold:
            load_ms += self.fetch_ms(p, size)
        load_ms *= self.faults.load_factor(pod.pod_id, now_s)
        if self.vllm_admission:
            self._stall_batch(pod, load_ms, now_s)  # vLLM loads inside the step
        pod.load_adapter = adapter
        pod.load_cold = cold
        pod.gpu_util = 1.0
        counts = pod.load_counts.get(adapter)
        if counts is None:
            counts = pod.load_counts[adapter] = [0, 0]
        counts[0] += 1  # the requests queued now are charged at their admission
        counts[1] += int(cold)
        end_s = now_s + load_ms / 1000.0
        self.load_end_s[p] = end_s
        self.log.loads.append((now_s, end_s, p, cold))
        heappush(self.heap, (end_s, LOAD_DONE, p, -1))

    def _charge_loads(self, pod: SimPod, r: int, adapter: str) -> None:
        """Request ``r``, leaving ``pod``'s queue for the batch, waited for every load of
        its adapter that started while it was queued: it is charged the heavier of its
        outcome at routing and theirs (a hit whose adapter left the GPU, or a host hit
        whose adapter left the host cache, before the load: as on vLLM, the weights are
        read again). Counts, not a walk of the queue: a load costs O(1) however long
        the queue (round-robin's queues hold thousands)."""
        loads_then, cold_then = pod.queued_since.pop(r)
        counts = pod.load_counts.get(adapter)
        if counts is None or counts[0] == loads_then:
            return
        charged = COLD_LOAD if counts[1] > cold_then else CPU_HIT
        outcomes = self.log.outcome
        outcomes[r] = max(outcomes[r], charged)

    def fetch_ms(self, p: int, size_bytes: int) -> float:
        """Reading an adapter from storage into host memory: the pool's storage (its
        first byte, then its bandwidth) or, without one, the load-cost settings'."""
        spec = self.specs[p]
        if spec.storage_bytes_per_s is None:
            return 1000.0 * size_bytes / self.load_cost.storage_to_host_bytes_per_s
        return spec.first_byte_ms + 1000.0 * size_bytes / spec.storage_bytes_per_s

    def _load_done(self, p: int, now_s: float) -> None:
        pod = self.pods[p]
        adapter = pod.load_adapter
        assert adapter is not None
        pod.load_adapter = None
        pod.land(adapter, now_s)
        pod.last_used[adapter] = now_s  # activation counts as a use (vLLM's LRU)
        pod.gpu_util = pod.running / self.sim.max_num_seqs
        self._pump(p, now_s)

    # the engine's own (``FleetReplay``) --------------------------------------------

    def _pump(self, p: int, now_s: float) -> None:
        raise NotImplementedError

    def _stall_batch(self, pod: SimPod, load_ms: float, now_s: float) -> None:
        raise NotImplementedError
