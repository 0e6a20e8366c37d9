"""The SGLang engine client: load (with ``pinned``), unload, listing, warm-up, metrics.

SGLang answers every LoRA failure it expects with HTTP 400 and ``{"success": false,
"error_message": ...}`` (POD-API.md), so the message decides: "already loaded" on load
and "does not exist" on unload are success, anything else is permanent. Two answers
need more than the message:

- dynamic loads and unloads need ``dp_size == 1``; with more, they fail an assertion
  that nothing catches, and the server answers Starlette's bare 500 "Internal Server
  Error" (python/sglang/srt/managers/tokenizer_manager.py, ``load_lora_adapter``). A
  5xx is normally worth retrying; this one never succeeds, so it is permanent and says
  what to change (``--dp-size 1``).
- without ``--enable-metrics`` there is no ``/metrics`` route (404): the pod is judged
  by ``/health`` instead, and the client says once which flag is missing.

Requests name an adapter twice: ``model: "<served-base>:<adapter>"`` (since
sgl-project/sglang PR #11570) and ``lora_path: "<adapter>"``, which older engines need
(they ignore ``model`` and would silently run the base model) and newer ones accept.
"""

from __future__ import annotations

import logging

import httpx

from placement.adapters.http_engine import HttpEngine, error_text, is_route_missing
from placement.adapters.metrics_text import parse_sglang_metrics
from placement.domain import AdapterId
from placement.errors import EngineError
from placement.ports import PodMetrics

LOAD_PATH = "/load_lora_adapter"
UNLOAD_PATH = "/unload_lora_adapter"

#: Starlette's body for an exception no handler caught (SGLang adds none for 500).
UNCAUGHT_500 = "Internal Server Error"

log = logging.getLogger("lorafleet.adapters")


def metrics_missing_message(pod: str) -> str:
    """What to say when an SGLang pod answers 404 on ``/metrics``."""
    return (
        f"SGLang pod {pod} serves no /metrics (404): start it with --enable-metrics; "
        "until then lorafleet judges its health by /health and sees no queue or KV use"
    )


def adapter_request(base: str, adapter: AdapterId, body: dict[str, object]) -> dict[str, object]:
    """A completion body that names ``adapter`` as every SGLang version needs it."""
    return {**body, "model": f"{base}:{adapter}", "lora_path": adapter}


class SglangClient(HttpEngine):
    """One SGLang pod."""

    _warned_metrics = False

    async def load(
        self, adapter: AdapterId, *, lora_path: str, pinned: bool = False, inplace: bool = False
    ) -> bool:
        """``inplace``: SGLang has no in-place reload, so the name is unloaded first
        (it waits for the adapter's requests in flight) and loaded from ``lora_path``."""
        if inplace:
            await self.unload(adapter)
        body = {"lora_name": adapter, "lora_path": lora_path, "pinned": pinned}
        response = await self.call("POST", LOAD_PATH, body=body, answer_5xx=True)
        if response.status_code == 200:
            return True
        if response.status_code >= 500 or response.status_code == 429:
            raise self._lora_5xx("loading", adapter, LOAD_PATH, response)
        message = error_text(response)
        if "already loaded" in message:
            return False
        if is_route_missing(response):
            raise self.permanent(f"{LOAD_PATH} is not served: is LoRA enabled?", status=404)
        raise self.permanent(
            f"cannot load {adapter} from lora_path {lora_path!r}: {message}",
            status=response.status_code,
        )

    def _lora_5xx(
        self, doing: str, adapter: AdapterId, path: str, response: httpx.Response
    ) -> EngineError:
        """The dp_size assertion is permanent; any other 5xx is worth retrying."""
        message = error_text(response)
        if response.status_code == 500 and (message == UNCAUGHT_500 or "dp_size" in message):
            return self.permanent(
                f"{doing} {adapter} answered 500 {message!r}: SGLang fails an assertion "
                "there when dp_size > 1 (it changes adapters at run time only with dp_size "
                "1): restart the pod with --dp-size 1 (if it has dp_size 1, its log says "
                "what failed)",
                status=500,
            )
        return self.retryable_answer(
            f"POST {path} answered {response.status_code}: {message}", response
        )

    async def unload(self, adapter: AdapterId) -> bool:
        body = {"lora_name": adapter}
        response = await self.call("POST", UNLOAD_PATH, body=body, answer_5xx=True)
        if response.status_code == 200:
            return True
        if response.status_code >= 500 or response.status_code == 429:
            raise self._lora_5xx("unloading", adapter, UNLOAD_PATH, response)
        message = error_text(response)
        if "does not exist" in message:
            return False
        raise self.unexpected(UNLOAD_PATH, response)

    async def warmup(self, adapter: AdapterId) -> None:
        base = await self.served_model_name()
        prompt: dict[str, object] = {
            "messages": [{"role": "user", "content": "warm-up"}],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        body = adapter_request(base, adapter, prompt)
        response = await self.call("POST", "/v1/chat/completions", body=body)
        if response.status_code != 200:
            raise self.permanent(
                f"warm-up of {adapter} answered {response.status_code}: {error_text(response)}",
                status=response.status_code,
            )

    async def metrics(self) -> PodMetrics:
        """``/metrics``; without ``--enable-metrics`` (404), only ``/health``'s verdict."""
        response = await self.call("GET", "/metrics")
        if response.status_code == 404:
            if not self._warned_metrics:
                log.warning(metrics_missing_message(self.pod))
                self._warned_metrics = True
            return PodMetrics(healthy=await self.health())
        if response.status_code != 200:
            raise self.unexpected("/metrics", response)
        return parse_sglang_metrics(response.text, pod=self.pod)
