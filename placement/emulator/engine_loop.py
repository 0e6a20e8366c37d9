"""The one loop an emulated engine steps its batch on, and the locks loads and unloads take.

Each engine runs its running batch on one loop, a step at a time; a cold read of an
adapter's weights and a copy of weights onto a GPU slot run on that loop between steps,
so every running request waits them out, and reads on one pod run one after another
(``EngineLoop.read``, which names the engines' source). Loads and unloads also take a
lock: vLLM's per adapter name, SGLang's one for every name (``EngineLoop.updates``).

Timing and locks only: what the engine holds is ``placement.residency``'s, and every
wait goes through the pod's ``pause``. No HTTP, no clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from placement.residency import EngineModel

Pause = Callable[[float], Awaitable[None]]


class EngineLoop:
    """One pod's engine loop (``step``) and its load and unload locks; made afresh when
    the pod restarts."""

    def __init__(self, model: EngineModel, *, pause: Pause) -> None:
        self.model = model
        #: Waits this many milliseconds (the pod's ``_pause``).
        self.pause = pause
        #: Held for each step of the batch, each read and each swap: they take turns.
        self.step = asyncio.Lock()
        #: SGLang's ``lora_update_lock``: one load or unload at a time, whatever the name.
        self.lora_updates = asyncio.Lock()
        self._by_name: dict[str, asyncio.Lock] = {}

    def updates(self, name: str) -> asyncio.Lock:
        """The lock a load or unload of ``name`` holds: vLLM's per name; SGLang's one
        ``lora_update_lock`` for every load and unload (sgl-project/sglang
        python/sglang/srt/managers/tokenizer_control_mixin.py ``load_lora_adapter``,
        ``unload_lora_adapter``), held through the soft cap's unloads and their wait
        for requests in flight (``_unload_lora_adapter_locked``)."""
        if self.model.is_sglang:
            return self.lora_updates
        return self._by_name.setdefault(name, asyncio.Lock())

    async def read(self, ms: float) -> None:
        """Read an adapter's weights from storage on the engine's one loop, so every
        running request waits, and reads on one pod run one at a time.

        vLLM: a load over HTTP is ``EngineCore.add_lora``, run between steps
        (vllm-project/vllm ``vllm/v1/engine/core.py``), and a listed adapter whose weights
        left the host cache is read again inside a step by ``set_active_loras``
        (``vllm/v1/worker/lora_model_runner_mixin.py``); both end in
        ``LRUCacheWorkerLoRAManager.add_adapter`` -> ``_load_adapter``
        (``vllm/lora/worker_manager.py``), which reads the checkpoint before it returns.

        SGLang: the scheduler's loop (sgl-project/sglang
        ``python/sglang/srt/managers/scheduler.py``, ``event_loop_normal`` and
        ``event_loop_overlap``) runs ``process_input_requests`` before it builds and
        runs the next batch; its dispatcher sends a ``LoadLoRAAdapterReqInput`` to
        ``Scheduler.load_lora_adapter`` -> the worker's -> ``ModelRunner.load_lora_adapter``
        -> ``LoRAManager.load_lora_adapter`` -> ``load_lora_weights``
        (``python/sglang/srt/lora/lora_manager.py``), which reads the weights into host
        memory before it returns. A request for an adapter the soft cap unloaded goes
        the same way (``TokenizerManager._resolve_lora_path`` calls
        ``load_lora_adapter``)."""
        async with self.step:
            await self.pause(ms)

    async def swap(self, ms: float) -> None:
        """Move weights onto a GPU slot between steps: every running request stalls (the
        drain)."""
        async with self.step:
            await self.pause(ms)
