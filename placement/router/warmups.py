"""Class warm-ups: the short requests that keep a higher class off a load's victim place.

Under ``RouterSettings.class_priority`` the ``Picker`` names, with a pod for a load on a
full pod, the adapters to warm up there first (``Choice.refresh``): vLLM evicts its
least recently used adapter and cannot be told which, so a production adapter idle
beside an idle experiment is given a one-token request (``warmup`` of the pod's engine
client: vLLM's ``/v1/completions``, SGLang's ``/v1/chat/completions``) and is no longer
the LRU victim. The proxy (``router.asgi``) and the endpoint picker
(``router.endpoint_picking``) send them, all at once, before the request's load and the
request itself; each one answered is applied to the pod's ledger as a request is
(``LivePod.note_use``). A warm-up that fails never fails the request: it is logged and
counted in ``lorafleet_class_warmups_total{result="failed"}``.

Must not decide which adapters to warm up (``policies.victims`` does) nor touch the
client's request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from placement.clock import Clock
from placement.domain import AdapterId
from placement.errors import EngineError
from placement.router.state import LivePod, Upstream

log = logging.getLogger("lorafleet.router")


class Warmable(Protocol):
    """An engine client that can send a warm-up (``VllmClient``, ``SglangClient``)."""

    async def warmup(self, adapter: AdapterId) -> None: ...


class WarmupHost(Protocol):
    """What sending warm-ups needs of the router (``router.core.Router``)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def warmup_metrics(self) -> WarmupMetrics: ...

    def engine_client(self, upstream: Upstream) -> Warmable: ...


class WarmupMetrics:
    """``lorafleet_class_warmups_total``: class warm-ups sent, by result."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent = Counter(
            "lorafleet_class_warmups",
            "Class warm-ups the router sent before a load on a full pod (class_priority):"
            " sent (answered) or failed (the request went on all the same).",
            ["result"],
            registry=registry,
        )


async def send_warmups(router: WarmupHost, state: LivePod, adapters: Sequence[AdapterId]) -> int:
    """Warm up ``adapters`` on ``state``'s pod, all at once; the number answered."""
    if not adapters:
        return 0
    results = await asyncio.gather(*(_warm_one(router, state, name) for name in adapters))
    return sum(results)


async def _warm_one(router: WarmupHost, state: LivePod, adapter: AdapterId) -> bool:
    client = router.engine_client(state.upstream)
    try:
        await client.warmup(adapter)
    except (EngineError, OSError) as exc:
        log.warning("warm-up of %s on %s failed: %s", adapter, state.upstream.pod, exc)
        router.warmup_metrics.sent.labels(result="failed").inc()
        return False
    state.note_use(adapter, router.clock())
    router.warmup_metrics.sent.labels(result="sent").inc()
    return True
