"""The vLLM engine client: runtime LoRA loading, listing, warm-up, metrics, health.

Maps every answer of a vLLM pod (POD-API.md) onto the exception tree so that callers
decide by type: "already loaded" on load and "cannot be found" on unload are success
(reconcile is idempotent); FastAPI's 404 ``{"detail":"Not Found"}`` on the LoRA routes
means the pod runs without ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``. Every other load
failure is permanent and carries the engine's own message: vLLM answers 404 for "No
adapter found" and 400 for the rest (a rank above ``--max-lora-rank``, bad files), in
the nested ``{"error": {...}}`` body of current versions or the flat one of older ones.

``load(..., inplace=True)`` sends ``load_inplace``: new weights under a loaded name
(an adapter whose ``source`` changed).
"""

from __future__ import annotations

import httpx

from placement.adapters.http_engine import HttpEngine, error_text, is_route_missing
from placement.adapters.metrics_text import parse_vllm_metrics
from placement.domain import AdapterId
from placement.errors import PermanentEngineError
from placement.ports import PodMetrics

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"


class VllmClient(HttpEngine):
    """One vLLM pod. ``pinned`` is ignored: vLLM has no pin over HTTP."""

    def _runtime_updating_off(self) -> PermanentEngineError:
        return self.permanent(
            f"runtime LoRA updating is off: set VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 on {self.pod}",
            status=404,
        )

    async def load(
        self, adapter: AdapterId, *, lora_path: str, pinned: bool = False, inplace: bool = False
    ) -> bool:
        body = {"lora_name": adapter, "lora_path": lora_path, "load_inplace": inplace}
        response = await self.call("POST", LOAD_PATH, body=body)
        if response.status_code == 200:
            return True
        message = error_text(response)
        if response.status_code == 400 and "has already been loaded" in message:
            return False
        if is_route_missing(response):
            raise self._runtime_updating_off()
        raise self.permanent(
            f"cannot load {adapter} from lora_path {lora_path!r}: {response.status_code} {message}",
            status=response.status_code,
        )

    async def unload(self, adapter: AdapterId) -> bool:
        response = await self.call("POST", UNLOAD_PATH, body={"lora_name": adapter})
        if response.status_code == 200:
            return True
        if is_route_missing(response):
            raise self._runtime_updating_off()
        message = error_text(response)
        if response.status_code in (400, 404) and "cannot be found" in message:
            return False  # older vLLM answered 400 here
        raise self.unexpected(UNLOAD_PATH, response)

    async def warmup(self, adapter: AdapterId) -> None:
        body = {"model": adapter, "prompt": "warm-up", "max_tokens": 1, "temperature": 0.0}
        response = await self.call("POST", "/v1/completions", body=body)
        if response.status_code != 200:
            raise self._warmup_failed(adapter, response)

    def _warmup_failed(self, adapter: AdapterId, response: httpx.Response) -> PermanentEngineError:
        return self.permanent(
            f"warm-up of {adapter} answered {response.status_code}: {error_text(response)}",
            status=response.status_code,
        )

    async def metrics(self) -> PodMetrics:
        return parse_vllm_metrics(await self.scrape(), pod=self.pod)
