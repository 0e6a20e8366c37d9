"""The router's Prometheus metrics, registered on a registry the entry point passes in.

Owns the metric names and labels; must not decide anything. Label children are cached
so the hot path pays a dict lookup, not prometheus_client's label validation.

The ``adapter`` label is bounded: the caller passes a name the router knows (the
catalog's, the plan's, one a pod lists, a served base model) or ``UNKNOWN_ADAPTER``,
and past ``max_adapter_labels`` names every new one is ``UNKNOWN_ADAPTER`` too, so that
random names cannot grow ``/metrics`` or the router's memory.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from placement.settings import RouterSettings

#: TTFT buckets in seconds: a GPU hit is tens of ms, a load 85-670 ms more.
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)

#: Adapter load buckets in seconds: from host RAM a few ms, from storage 85-670 ms
#: (docs/background.md), a slow bucket store or a stalled pod seconds.
LOAD_BUCKETS_S = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 30.0)
#: Request queue buckets in seconds: most requests wait for nothing (under 1 ms).
QUEUE_BUCKETS_S = (0.001, 0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8)

CONTENT_TYPE = CONTENT_TYPE_LATEST

#: The one ``adapter`` label of every name the router does not know. Not a name an
#: adapter can have (catalog names are DNS labels), so it never mixes with one, and the
#: controller's Prometheus history leaves it out.
UNKNOWN_ADAPTER = "_unknown"


class RouterMetrics:
    def __init__(
        self, registry: CollectorRegistry, *, max_adapter_labels: int | None = None
    ) -> None:
        """``max_adapter_labels``: None takes ``RouterSettings``' (the router passes its own)."""
        self.registry = registry
        self.max_adapter_labels = (
            RouterSettings().max_adapter_labels
            if max_adapter_labels is None
            else max_adapter_labels
        )
        self._adapter_labels: set[str] = set()
        self.requests = Counter(
            "lorafleet_requests",
            "Requests routed, by adapter and by how they found it (or why they were refused).",
            ["adapter", "outcome"],
            registry=registry,
        )
        self.ttft = Histogram(
            "lorafleet_ttft_seconds",
            "Time from the request's arrival to the first byte from the pod, by outcome.",
            ["outcome"],
            buckets=TTFT_BUCKETS_S,
            registry=registry,
        )
        self.loads = Counter(
            "lorafleet_adapter_loads",
            "Adapter loads the router caused: cold (registered from storage) or "
            "activation (a registered adapter pulled onto a GPU slot by a request).",
            ["pod", "reason"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "lorafleet_pod_queue_depth",
            "Requests waiting at each pod, as last scraped plus those sent since.",
            ["pod"],
            registry=registry,
        )
        self.pod_healthy = Gauge(
            "lorafleet_pod_healthy",
            "1 when the pod passes its scrapes.",
            ["pod"],
            registry=registry,
        )
        self.unplanned = Counter(
            "lorafleet_unplanned_requests",
            "Requests for adapters the plan does not place (routed by consistent hashing).",
            ["adapter"],
            registry=registry,
        )
        self.retries = Counter(
            "lorafleet_upstream_retries", "Requests retried on another pod.", registry=registry
        )
        self.metrics_missing = Gauge(
            "lorafleet_router_pod_metrics_missing",
            "1 while the pod answers 404 on /metrics (SGLang without --enable-metrics): "
            "it is judged by /health, and its queue and KV use are unknown.",
            ["pod"],
            registry=registry,
        )
        self.plan_ok = Gauge(
            "lorafleet_router_plan_loaded",
            "1 while the router routes by a plan, 0 while it falls back to hashing.",
            registry=registry,
        )
        self.refused = Counter(
            "lorafleet_router_refused_requests",
            "Requests refused at the front door, before routing: body_too_large (413), "
            "not_json, too_deep, bad_model, bad_user (400).",
            ["reason"],
            registry=registry,
        )
        self.loop_errors = Counter(
            "lorafleet_router_loop_errors",
            "Exceptions a background loop (scrape, plan, pods, log) caught from one of its "
            "rounds, or a pod's scrape from one pod, by exception type; the loop went on.",
            ["loop", "error"],
            registry=registry,
        )
        self.loop_failures = Gauge(
            "lorafleet_router_loop_consecutive_failures",
            "Failed rounds in a row of each background loop (0 once one succeeds).",
            ["loop"],
            registry=registry,
        )
        self.log_rows_dropped = Counter(
            "lorafleet_router_log_rows_dropped",
            "Request-log rows not written: invalid (text that is not Unicode, a number "
            "out of range), overflow (the writer fell max_pending_log_rows behind), "
            "write_error (the file refused a batch).",
            ["reason"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "lorafleet_adapter_load_seconds",
            "Adapter loads the router triggered, by where the weights came from (storage: "
            "the pod read them; host: the pod already held them) and stage (queued: asked "
            "to sent; loading: sent to answered; total).",
            ["source", "stage"],
            buckets=LOAD_BUCKETS_S,
            registry=registry,
        )
        self.queue_seconds = Histogram(
            "lorafleet_request_queue_seconds",
            "Time from a request's arrival to the start of its forwarding, by what it "
            "waited on: load (an adapter load, its own or a coalesced one), pressure "
            "(room on a pod under memory pressure), none.",
            ["cause"],
            buckets=QUEUE_BUCKETS_S,
            registry=registry,
        )
        self._requests: dict[tuple[str, str], Counter] = {}
        self._ttft: dict[str, Histogram] = {}
        self._queue: dict[str, Histogram] = {}

    def adapter_label(self, adapter: str, *, known: bool) -> str:
        """The label for ``adapter``: itself if known and there is room, else the shared one."""
        if not known:
            return UNKNOWN_ADAPTER
        labels = self._adapter_labels
        if adapter in labels:
            return adapter
        if len(labels) >= self.max_adapter_labels:
            return UNKNOWN_ADAPTER
        labels.add(adapter)
        return adapter

    def request(self, adapter: str, outcome: str, ttft_s: float | None) -> None:
        """Count a request; ``adapter`` is a label from ``adapter_label``."""
        key = (adapter, outcome)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(adapter=adapter, outcome=outcome)
        child.inc()
        if ttft_s is not None:
            hist = self._ttft.get(outcome)
            if hist is None:
                hist = self._ttft[outcome] = self.ttft.labels(outcome=outcome)
            hist.observe(ttft_s)

    def adapter_loaded(
        self, *, source: str, queued_s: float, started_s: float, finished_s: float
    ) -> None:
        """One load the router triggered, timed at its three moments (timer seconds)."""
        hist = self.load_seconds
        hist.labels(source=source, stage="queued").observe(max(0.0, started_s - queued_s))
        hist.labels(source=source, stage="loading").observe(max(0.0, finished_s - started_s))
        hist.labels(source=source, stage="total").observe(max(0.0, finished_s - queued_s))

    def request_queued(self, cause: str, seconds: float) -> None:
        """A request's wait from arrival to forwarding (``cause``: load, pressure, none)."""
        hist = self._queue.get(cause)
        if hist is None:
            hist = self._queue[cause] = self.queue_seconds.labels(cause=cause)
        hist.observe(max(0.0, seconds))

    def render(self) -> bytes:
        return generate_latest(self.registry)
