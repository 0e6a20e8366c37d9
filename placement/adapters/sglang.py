"""The SGLang engine client: load (with ``pinned``), unload, listing, warm-up, metrics.

SGLang answers every LoRA failure with HTTP 400 and ``{"success": false,
"error_message": ...}`` (POD-API.md), so the message decides: "already loaded" on load
and "does not exist" on unload are success, anything else is permanent. Requests name
an adapter as ``<served-base>:<adapter>``; a bare adapter name is refused.
"""

from __future__ import annotations

from placement.adapters.http_engine import HttpEngine, error_text, is_route_missing
from placement.adapters.metrics_text import parse_sglang_metrics
from placement.domain import AdapterId
from placement.ports import PodMetrics

LOAD_PATH = "/load_lora_adapter"
UNLOAD_PATH = "/unload_lora_adapter"


class SglangClient(HttpEngine):
    """One SGLang pod."""

    async def load(self, adapter: AdapterId, *, lora_path: str, pinned: bool = False) -> bool:
        body = {"lora_name": adapter, "lora_path": lora_path, "pinned": pinned}
        response = await self.call("POST", LOAD_PATH, body=body)
        if response.status_code == 200:
            return True
        message = error_text(response)
        if "already loaded" in message:
            return False
        if is_route_missing(response):
            raise self.permanent(f"{LOAD_PATH} is not served: is LoRA enabled?", status=404)
        raise self.permanent(
            f"cannot load {adapter} from lora_path {lora_path!r}: {message}",
            status=response.status_code,
        )

    async def unload(self, adapter: AdapterId) -> bool:
        response = await self.call("POST", UNLOAD_PATH, body={"lora_name": adapter})
        if response.status_code == 200:
            return True
        message = error_text(response)
        if "does not exist" in message:
            return False
        raise self.unexpected(UNLOAD_PATH, response)

    async def warmup(self, adapter: AdapterId) -> None:
        base = await self.served_model_name()
        body = {
            "model": f"{base}:{adapter}",
            "messages": [{"role": "user", "content": "warm-up"}],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        response = await self.call("POST", "/v1/chat/completions", body=body)
        if response.status_code != 200:
            raise self.permanent(
                f"warm-up of {adapter} answered {response.status_code}: {error_text(response)}",
                status=response.status_code,
            )

    async def metrics(self) -> PodMetrics:
        return parse_sglang_metrics(await self.scrape(), pod=self.pod)
