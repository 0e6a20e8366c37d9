"""Pick the engine client for a pod by its engine (the composition roots call this)."""

from __future__ import annotations

import httpx

from placement.adapters.http_engine import DEFAULT_TIMEOUT_S
from placement.adapters.sglang import SglangClient
from placement.adapters.vllm import VllmClient
from placement.domain import Engine, Pod
from placement.ports import EngineClient


def engine_client(
    pod: Pod,
    *,
    served_model_name: str | None = None,
    http: httpx.AsyncClient | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> EngineClient:
    """A client for ``pod``; share ``http`` across pods to share one connection pool."""
    kind = SglangClient if pod.engine is Engine.SGLANG else VllmClient
    return kind(
        pod.name, pod.url, served_model_name=served_model_name, http=http, timeout_s=timeout_s
    )
