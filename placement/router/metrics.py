"""The router's Prometheus metrics, registered on a registry the entry point passes in.

Owns the metric names and labels; must not decide anything. Label children are cached
so the hot path pays a dict lookup, not prometheus_client's label validation.

The ``adapter`` label is bounded: the caller passes a name the router knows (the
catalog's, the plan's, one a pod lists, a served base model) or ``UNKNOWN_ADAPTER``,
and past ``max_adapter_labels`` names every new one is ``UNKNOWN_ADAPTER`` too, so that
random names cannot grow ``/metrics`` or the router's memory.

Many workers (``router.workers``): each worker process writes its figures to its own
files in a directory the parent made (prometheus_client's multiprocess mode, switched
on in the worker by ``record_in`` before it builds its router), and ``/metrics`` of any
worker reads every worker's files (``RouterMetrics.share``): counters and histograms
are summed over the workers, those that have exited included, so they never go back;
each gauge is folded over the live workers as ``GAUGE_ACROSS_WORKERS`` says (the parent
drops an exited worker's gauges, ``forget_worker``). One process (the default) keeps
prometheus_client's in-memory values and renders its own registry, as before.

A pod that leaves the topology (``RouterMetrics.keep_pods``) leaves ``/metrics``: every
series with its ``pod`` label, the router's and the fleet's, is left out of what is
rendered (else a scaled-down or replaced pod would read healthy, with its last queue,
for ever), and in one process removed from the registry too, so a fleet that churns
pods keeps none of theirs. Multiprocess files cannot drop a series; leaving it out of
the render is all there is there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.samples import Sample

from placement.metrics import drop_pod_series, in_files
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

Fold = Literal["sum", "max", "min"]

#: How each gauge of the router's registry reads over N workers (counters and
#: histograms are always summed). ``sum``: a count of things each worker holds apart
#: (a load is started by one worker). ``max``: the pod's shared state as the workers
#: see it, each from its own scrapes (queue depth, GPU adapters, slots, a missing
#: ``/metrics``), or the worst worker (failures in a row). ``min``: 1 only while every
#: worker says so (a pod healthy, a plan loaded). A gauge missing here reads ``max``.
GAUGE_ACROSS_WORKERS: Mapping[str, Fold] = {
    "lorafleet_pod_queue_depth": "max",
    "lorafleet_pod_healthy": "min",
    "lorafleet_router_pod_metrics_missing": "max",
    "lorafleet_router_plan_loaded": "min",
    "lorafleet_router_loop_consecutive_failures": "max",
    "lorafleet_pod_gpu_adapters": "max",
    "lorafleet_pod_gpu_slots": "max",
    "lorafleet_load_queue_depth": "sum",
    "lorafleet_active_adapters": "max",
    "lorafleet_slot_capacity": "max",
    "lorafleet_adapter_tenant_info": "max",
}

_FOLDS: Mapping[Fold, Callable[[Iterable[float]], float]] = {"sum": sum, "max": max, "min": min}

_MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"


def record_in(directory: Path) -> None:
    """Make every metric this process creates from now on write its figures to its own
    files in ``directory`` (prometheus_client's multiprocess values). For a worker, after
    the fork and before it builds its router; prometheus_client chose its value class
    when the parent imported it, so it is replaced here, for this process only.

    The files are named by this process's pid, read once here rather than at every
    write as prometheus_client does (``os.getpid`` on the hot path): a process forked
    from this one must call ``record_in`` again before it writes a figure."""
    os.environ[_MULTIPROC_DIR] = str(directory)
    pid = os.getpid()
    values.ValueClass = values.MultiProcessValue(lambda: pid)  # type: ignore[no-untyped-call]


def forget_worker(directory: Path, pid: int) -> None:
    """An exited worker's gauges leave ``/metrics``; its counters and histograms stay."""
    for path in directory.glob(f"gauge_*_{pid}.db"):
        path.unlink(missing_ok=True)


class WorkersCollector:
    """Every worker's figures from their files in ``directory``, gauges folded."""

    def __init__(self, directory: Path) -> None:
        self._files = MultiProcessCollector(None, path=str(directory))  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Metric]:
        for metric in self._files.collect():  # type: ignore[no-untyped-call]
            if metric.type == "gauge":
                fold = _FOLDS[GAUGE_ACROSS_WORKERS.get(metric.name, "max")]
                metric.samples = _folded(metric.samples, fold)
            yield metric


def _folded(samples: Iterable[Sample], fold: Callable[[Iterable[float]], float]) -> list[Sample]:
    """One sample per series: the workers' (``pid`` label) values folded."""
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}
    for sample in samples:
        labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "pid"))
        series.setdefault((sample.name, labels), []).append(sample.value)
    return [Sample(name, dict(labels), fold(got)) for (name, labels), got in series.items()]


class KeptPodsCollector:
    """``source``'s families less the samples of pods not in ``kept()`` (None: all)."""

    def __init__(
        self, source: CollectorRegistry, kept: Callable[[], frozenset[str] | None]
    ) -> None:
        self._source = source
        self._kept = kept

    def collect(self) -> Iterator[Metric]:
        kept = self._kept()
        for metric in self._source.collect():
            if kept is not None:
                metric.samples = [s for s in metric.samples if _kept(s, kept)]
            yield metric


def _kept(sample: Sample, pods: frozenset[str]) -> bool:
    pod = sample.labels.get("pod")
    return pod is None or pod in pods


class RouterMetrics:
    def __init__(
        self, registry: CollectorRegistry, *, max_adapter_labels: int | None = None
    ) -> None:
        """``max_adapter_labels``: None takes ``RouterSettings``' (the router passes its own).

        Long on purpose (past 80 lines): every family the router exports is declared
        here, in one place, so that a reader sees all the names, help texts, labels and
        buckets of ``/metrics`` together, as a dashboard or alert rule author needs them;
        split into helpers, the families would scatter for no gain. The methods below
        only cache label children and record."""
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
        self.scrape_problems = Counter(
            "lorafleet_router_scrape_problems",
            "Lines of a pod's /metrics the router could not read and left out, the rest of "
            "the page read, by kind: sample (a sample line), metadata (a # HELP or # TYPE "
            "line). A broken line of a metric the router reads fails the scrape instead. "
            "too_large: a page over the 8 MiB cap, read from its head when the metrics the "
            "router reads are whole there, else the pod judged by /health (one a scrape).",
            ["pod", "kind"],
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
        self._activations: dict[str, Counter] = {}
        self._ttft: dict[str, Histogram] = {}
        self._queue: dict[str, Histogram] = {}
        #: Every worker's figures, once ``share`` names their directory.
        self._workers: CollectorRegistry | None = None
        #: The topology's pods (``keep_pods``); None until given: every pod's series.
        self._pods: frozenset[str] | None = None
        self._rendered = self._render_kept(registry)

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

    def keeps(self, pod: str) -> bool:
        """Whether ``pod`` is in the topology (``keep_pods``), so its series may be
        written: a request or load that ends after its pod left writes none back."""
        return self._pods is None or pod in self._pods

    def activation(self, pod: str) -> None:
        """A request sent to ``pod`` for an adapter in its host memory: the engine moves
        it to a GPU slot (``lorafleet_adapter_loads_total{reason="activation"}``)."""
        child = self._activations.get(pod)
        if child is None:
            if not self.keeps(pod):
                return
            child = self._activations[pod] = self.loads.labels(pod=pod, reason="activation")
        child.inc()

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

    def keep_pods(self, pods: Collection[str]) -> None:
        """The topology's pods now (``PodScraper.keep_only``): the series of any other
        pod, with a ``pod`` label in any family of the registry, are rendered no more;
        this class's own are removed as well (``drop_pod_series``). The fleet's families
        are ``FleetMetrics.pods_left``'s to remove."""
        kept = frozenset(pods)
        left = (self._pods or frozenset()) - kept
        self._pods = kept
        for pod in left:
            self._activations.pop(pod, None)
            if in_files():  # kept in the files: written only as it changes, so reset
                self.metrics_missing.labels(pod=pod).set(0)
        families = (
            self.loads,
            self.queue_depth,
            self.pod_healthy,
            self.metrics_missing,
            self.scrape_problems,
        )
        drop_pod_series(families, left)

    def share(self, directory: Path) -> None:
        """Render every worker's figures from ``directory`` (where ``record_in`` had
        this process write its own) instead of this registry's."""
        workers = CollectorRegistry(auto_describe=False)
        workers.register(WorkersCollector(directory))
        self._workers = workers
        self._rendered = self._render_kept(workers)

    def _render_kept(self, source: CollectorRegistry) -> CollectorRegistry:
        rendered = CollectorRegistry(auto_describe=False)
        rendered.register(KeptPodsCollector(source, lambda: self._pods))
        return rendered

    def render(self) -> bytes:
        return generate_latest(self._rendered)
