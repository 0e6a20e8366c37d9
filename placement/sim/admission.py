"""The replay engine's admission under ``SimSettings.load_admission`` "vllm": vLLM's
scheduler around a load, instead of the default drain.

vLLM (vllm-project/vllm ``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``)
passes over a waiting request whose adapter would take the batch past ``max_loras``
distinct adapters (``scheduled_loras``) and goes on down the queue, the requests
passed over put back at its head; it does not drain the batch for a load. The model
runner activates the batch's adapters inside the step, before the forward pass
(``vllm/v1/worker/gpu_model_runner.py``, ``_prepare_inputs``: ``set_active_loras``;
``vllm/lora/worker_manager.py``, ``LRUCacheWorkerLoRAManager.add_adapter``: a read
from storage when the host cache lacks it, then ``activate_adapter``), so every request
in that step waits for the load. Here: a request whose adapter is off the GPU and can
get no slot (every slot's adapter has a request running) waits in ``SimPod.passed``
while those behind it on resident adapters run; a load starts without a drain, the
pod admits nothing until it lands (the step it is in), and it stalls the running batch
for its duration: each running request ends that much later, and one still in its
prefill has its first token that much later too.

``EngineAdmission`` is a part of ``FleetReplay`` (``placement.sim.engine``), as its
loads and deliveries are; the default ("drain") never calls it. Owns no IO and no wall
clock.
"""

from __future__ import annotations

from collections import deque
from heapq import heappush

from placement.sim.deliveries import EngineDeliveries
from placement.sim.pods import SimPod
from placement.sim.sim_log import DONE

#: A stall shorter than this is rounding, not a stall.
_EPSILON_S = 1e-12


def can_take_slot(pod: SimPod) -> bool:
    """Whether a load could have a GPU slot now: a free one, a ghost's, or one whose
    adapter has no request running (vLLM's ``max_loras`` counts the batch's adapters)."""
    if pod.free_slots > 0 or pod.ghosts > 0:
        return True
    running = pod.running_adapters
    return any(adapter not in running for adapter in pod.gpu_adapters)


class EngineAdmission(EngineDeliveries):
    """vLLM's admission for ``FleetReplay``; the attributes are the replay's."""

    stall_seen_s: dict[int, float]
    preload_names: list[str]

    def _pump_vllm(self, p: int, now_s: float) -> None:
        """The passed-over requests first, then the queue in order; a request whose
        adapter can get no slot is passed over and those behind it go on."""
        pod = self.pods[p]
        if pod.load_adapter is not None or not pod.healthy:
            return
        if pod.passed and not self._pump_passed(pod, p, now_s):
            return
        queue = pod.queue
        adapters = self.workload.adapters
        max_seqs = self.sim.max_num_seqs
        while queue and pod.load_adapter is None:
            r = queue[0]
            adapter = adapters[r] if r >= 0 else self.preload_names[-1 - r]
            if r < 0:
                if not self._preload_vllm(pod, p, adapter, now_s, max_seqs):
                    return
                continue
            if adapter not in pod.gpu_adapters:
                if pod.passed or not can_take_slot(pod):
                    queue.popleft()
                    waiting = pod.passed.get(adapter)
                    if waiting is None:
                        waiting = pod.passed[adapter] = deque()
                    waiting.append(r)
                    continue
                self._start_load(pod, p, adapter, now_s, r)
                return
            if not self._room(pod, r, max_seqs):
                return
            queue.popleft()
            self._admit_queued(pod, p, r, adapter, now_s)

    def _pump_passed(self, pod: SimPod, p: int, now_s: float) -> bool:
        """Admit the passed-over requests whose adapter is on the GPU now, in order, and
        start the load of the first that is not, if a slot can be had. True: those
        left wait for a slot, and the queue behind them may go on."""
        passed = pod.passed
        max_seqs = self.sim.max_num_seqs
        while passed:
            adapter, waiting = next(iter(passed.items()))
            if adapter not in pod.gpu_adapters:
                if not can_take_slot(pod):
                    return True
                self._start_load(pod, p, adapter, now_s, waiting[0])
                return False
            while waiting:
                r = waiting[0]
                if not self._room(pod, r, max_seqs):
                    return False
                waiting.popleft()
                self._admit_queued(pod, p, r, adapter, now_s)
            del passed[adapter]
        return True

    def _preload_vllm(self, pod: SimPod, p: int, adapter: str, now_s: float, max_seqs: int) -> bool:
        """A warm-up or preload at the queue's head, as the default pump takes it; one
        that would need a slot the batch holds is dropped. False: the pump stops."""
        queue = pod.queue
        if adapter in pod.warmups:
            if adapter in pod.gpu_adapters and pod.running >= max_seqs:
                return False  # a warm-up is a request: it waits for room in the batch
            queue.popleft()
            pending = pod.warmups.pop(adapter) - 1
            if pending:
                pod.warmups[adapter] = pending
            if adapter in pod.gpu_adapters:
                self._warm_up(pod, p, adapter, now_s)
            return True
        wanted = adapter in pod.event_wanted
        if wanted:
            pod.event_wanted.discard(adapter)  # event_preloads chose what it displaces
        elif adapter not in pod.planned or not self._worth_preloading(pod, now_s):
            queue.popleft()
            return True
        if adapter in pod.gpu_adapters or not can_take_slot(pod):
            queue.popleft()
            return True
        self._start_load(pod, p, adapter, now_s, -1)
        if wanted:
            pod.preloaded[adapter] = len(self.log.preload_used)
            self.log.preload_used.append(False)
            self.log.preload_at_s.append(now_s)
        return False

    def _room(self, pod: SimPod, r: int, max_seqs: int) -> bool:
        """Whether request ``r`` fits the batch now: a sequence free and its tokens in the
        KV cache (a batch of none takes any request). Both admissions ask it."""
        need = self.workload.prompt_tokens[r] + self.workload.output_tokens[r]
        return pod.running < max_seqs and not (
            pod.running and pod.kv_tokens + need > self.sim.kv_capacity_tokens
        )

    def _admit_queued(self, pod: SimPod, p: int, r: int, adapter: str, now_s: float) -> None:
        """Request ``r``, off the queue, into the batch: the queue's counts, the loads
        it waited for, then ``_admit``. Both admissions call it."""
        pod.queue_depth -= 1
        waiting = pod.waiting_adapters
        left = waiting[adapter] - 1
        if left:
            waiting[adapter] = left
        else:
            del waiting[adapter]
        self._charge_loads(pod, r, adapter)
        need = self.workload.prompt_tokens[r] + self.workload.output_tokens[r]
        self._admit(pod, p, r, adapter, need, now_s)

    def _admitted_vllm(self, pod: SimPod, r: int, first_token_s: float) -> None:
        """Note request ``r`` admitted: the stall it has seen, and its prefill's end."""
        self.stall_seen_s[r] = pod.stall_s
        prefilling = pod.prefilling
        now_s = self.now_s
        while prefilling and prefilling[0][0] <= now_s:
            prefilling.popleft()
        prefilling.append((first_token_s, r))

    def _stall_batch(self, pod: SimPod, load_ms: float, now_s: float) -> None:
        """A load starts: the running batch stalls for ``load_ms``; a request still in
        its prefill has its first token that much later."""
        pod.stall_s += load_ms / 1000.0
        ttft_ms = self.log.ttft_ms
        for first_token_s, r in pod.prefilling:
            if first_token_s > now_s:
                ttft_ms[r] += load_ms
        pod.prefilling.clear()

    def _stalled_past(self, pod: SimPod, p: int, r: int, now_s: float) -> bool:
        """Request ``r``'s end, reached: True if loads stalled the batch since it was
        admitted (or last moved), its end then moved that much later."""
        extra_s = pod.stall_s - self.stall_seen_s[r]
        if extra_s > _EPSILON_S:
            self.stall_seen_s[r] = pod.stall_s
            end_s = now_s + extra_s
            self.log.end_s[r] = end_s
            heappush(self.heap, (end_s, DONE, p, r))
            return True
        del self.stall_seen_s[r]
        return False

    # the engine's own (``FleetReplay``) --------------------------------------------

    def _admit(self, pod: SimPod, p: int, r: int, adapter: str, need: int, now_s: float) -> None:
        raise NotImplementedError

    def _warm_up(self, pod: SimPod, p: int, adapter: str, now_s: float) -> None:
        raise NotImplementedError
