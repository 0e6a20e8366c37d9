"""What fleet a workload needs: a grid of fleet shapes replayed, the cheapest meeting a target.

A shape is GPU slots per pod (``max_loras``), pods in the pool and host slots per pod
(``max_cpu_loras``). Each shape is the scenario's fleet with its pod template changed
(adapter budgets scaled with the slots) and is replayed under one policy (lorafleet by
default) on the same requests, in parallel processes. A row reports the GPU hit rate,
TTFT p95, loads per pod per second and, when the GPU and quantisation are known, what
the slots cost in KV cache (``placement.ledgers``: vLLM preallocates every slot at the
rank cap, so slots are paid for in KV tokens).

``recommend`` picks the cheapest shape that meets the targets: fewest pods (GPUs cost
money), then fewest GPU slots (they cost KV cache), then fewest host slots. When no
shape meets them it returns the best shape found (highest hit rate, then lowest TTFT
p95) and says so. Pure apart from the process pool in ``replay_grid``.

Only the requests from a short warm-up before the figures' window on are replayed one
by one (the cost of a grid is the replay's per-request routing, times the shapes); the
log before them reaches the forecaster as counts (``PastHistory``), as a controller's
history would, so a long history costs a replan a little and the replay nothing.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime

import pandas as pd

from placement.domain import AdapterId, Catalog, Fleet, Pipelines, PodId
from placement.errors import InputError, Problem
from placement.forecast.demand import DemandForecaster
from placement.inputs.request_log import RequestLog
from placement.settings import Settings
from placement.sim.events import EventController, SimEvent
from placement.sim.replay import run_policy
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload
from placement.solver.problem import Demand


@dataclass(frozen=True, kw_only=True, order=True)
class Shape:
    pods: int
    max_loras: int
    max_cpu_loras: int


@dataclass(frozen=True, kw_only=True)
class ShapeResult:
    shape: Shape
    gpu_hit_rate: float
    ttft_p95_ms: float
    loads_per_pod_s: float
    loads: int
    #: KV tokens a pod keeps with this many slots (None: GPU or quantisation unknown).
    kv_tokens: int | None = None
    #: Those tokens as a share of the KV tokens of the scenario's own shape.
    kv_headroom: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "max_loras": self.shape.max_loras,
            "pods": self.shape.pods,
            "max_cpu_loras": self.shape.max_cpu_loras,
            "gpu_hit_rate": round(self.gpu_hit_rate, 5),
            "ttft_p95_ms": round(self.ttft_p95_ms, 1),
            "loads_per_pod_s": round(self.loads_per_pod_s, 5),
            "loads": self.loads,
            "kv_tokens": self.kv_tokens,
            "kv_headroom": None if self.kv_headroom is None else round(self.kv_headroom, 4),
        }


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    result: ShapeResult
    #: False: no shape met the targets and ``result`` is the best one found.
    met: bool
    reason: str


def reshape(fleet: Fleet, shape: Shape) -> Fleet:
    """``fleet``'s one pool with ``shape.pods`` pods like its first, slots changed."""
    if len(fleet.pools) != 1:
        names = ", ".join(pool.name for pool in fleet.pools)
        raise InputError(
            [Problem(source="fleet", message=f"capacity models one pool; this fleet has: {names}")]
        )
    pool = fleet.pools[0]
    template = pool.pods[0]
    gpu_scale = shape.max_loras / template.max_loras
    host_scale = shape.max_cpu_loras / max(1, template.max_cpu_loras)
    existing = list(pool.pods)
    extra = [
        replace(template, name=PodId(f"{pool.name}-extra-{i}"), url=f"http://sim.invalid/{i}")
        for i in range(max(0, shape.pods - len(existing)))
    ]
    pods = tuple(
        replace(
            pod,
            max_loras=shape.max_loras,
            max_cpu_loras=shape.max_cpu_loras,
            hbm_adapter_bytes=round(template.hbm_adapter_bytes * gpu_scale),
            host_adapter_bytes=round(template.host_adapter_bytes * host_scale),
        )
        for pod in (existing + extra)[: shape.pods]
    )
    return replace(fleet, pools=(replace(pool, pods=pods),))


def default_grid(fleet: Fleet) -> list[Shape]:
    """Slots x1, x1.5, x2 and pods x1, x1.25, x1.5 of the fleet's own shape."""
    template = fleet.pools[0].pods[0]
    pods = len(fleet.pools[0].pods)
    slots = sorted({template.max_loras, round(template.max_loras * 1.5), template.max_loras * 2})
    counts = sorted({pods, pods + max(1, pods // 4), pods + max(1, pods // 2)})
    host = max(template.max_cpu_loras, template.max_loras)
    return [Shape(pods=n, max_loras=s, max_cpu_loras=max(host, s)) for n in counts for s in slots]


class PastHistory:
    """A forecaster that also sees ``past``, the counts of the log before the replayed
    requests: the replay's own history is appended to them at each replan."""

    def __init__(self, forecaster: DemandForecaster, past: RequestLog) -> None:
        self.forecaster = forecaster
        self.past = past

    def __call__(
        self, history: RequestLog, *, start: datetime, duration_s: int
    ) -> Mapping[AdapterId, Demand]:
        frame = pd.concat(
            [self.past.frame, history.frame[["ts", "adapter", "requests"]]], ignore_index=True
        )
        joined = RequestLog(frame=frame, aggregated=True, source=history.source)
        return self.forecaster(joined, start=start, duration_s=duration_s)


def past_counts(log: RequestLog, bucket_s: int) -> RequestLog:
    """``log`` as counts per adapter per ``bucket_s``: what ``PastHistory`` prepends."""
    counts = log.counts(bucket_s)
    counts["adapter"] = counts["adapter"].astype(str)
    return RequestLog(frame=counts, aggregated=True, source=log.source)


@dataclass(frozen=True, kw_only=True)
class GridJob:
    """Everything one process needs to replay one shape."""

    workload: SimWorkload
    fleet: Fleet
    settings: Settings
    policy: str
    planner: str
    window_s: tuple[float, float] | None
    #: The log before ``workload``, as counts the forecaster sees (None: none).
    past: RequestLog | None = None
    #: Events delivered to lorafleet's controller, and the pipelines they trigger.
    events: tuple[SimEvent, ...] = ()
    pipelines: Pipelines | None = None


def replay_shape(job: GridJob, shape: Shape, catalog: Catalog) -> ShapeResult:
    fleet = reshape(job.fleet, shape)
    planning = replay_planning(catalog, fleet, settings=job.settings, planner=job.planner)
    if job.past is not None and not job.past.frame.empty:
        planning = replace(planning, forecaster=PastHistory(planning.forecaster, job.past))
    controller = (
        EventController.build(
            catalog,
            fleet,
            job.pipelines or Pipelines(),
            max_loads=job.settings.controller.max_loads_per_event,
        )
        if job.events
        else None
    )
    result = run_policy(
        job.policy,
        job.workload,
        fleet,
        settings=job.settings,
        planning=planning,
        window_s=job.window_s,
        events=job.events,
        controller=controller,
    )
    figures = result.metrics
    return ShapeResult(
        shape=shape,
        gpu_hit_rate=float(figures["gpu_hit_rate"]),
        ttft_p95_ms=float(figures["ttft_p95_ms"]),
        loads_per_pod_s=float(figures["loads_per_pod_s"]),
        loads=int(figures["loads"]),
    )


#: The job of the grid being replayed: set in this process for ``jobs=1``, and once in
#: each worker process by ``_share`` (the workload crosses once per worker, not per shape).
_SHARED: dict[str, tuple[GridJob, Catalog]] = {}


def _share(job: GridJob, catalog: Catalog) -> None:
    _SHARED["job"] = (job, catalog)


def _child(shape: Shape) -> ShapeResult:
    job, catalog = _SHARED["job"]
    return replay_shape(job, shape, catalog)


def pool_context() -> multiprocessing.context.BaseContext:
    """The grid's worker processes: fresh interpreters, never forks of the caller.

    Forking copies a process whose other threads (an HTTP server's, a gRPC channel's,
    pyarrow's pool) may hold a lock or be half way through freeing memory, and the child
    can then hang or crash at its first allocation: a test process that had run such
    threads lost a forked replay to a segfault in the garbage collector. Spawned rather
    than started by a fork server so that they stay this process's children and their
    CPU time counts in its ``RUSAGE_CHILDREN`` (``lorafleet capacity`` reports it)."""
    return multiprocessing.get_context("spawn")


def replay_grid(
    job: GridJob,
    catalog: Catalog,
    shapes: Sequence[Shape],
    *,
    jobs: int = 2,
    kv_tokens: Callable[[Shape], int | None] | None = None,
) -> list[ShapeResult]:
    """Replay every shape, ``jobs`` processes at a time (each worker gets the job once)."""
    if jobs <= 1 or len(shapes) <= 1:
        _share(job, catalog)
        try:
            results = [_child(shape) for shape in shapes]
        finally:
            _SHARED.clear()
    else:
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(shapes)),
            mp_context=pool_context(),
            initializer=_share,
            initargs=(job, catalog),
        ) as pool:
            results = list(pool.map(_child, shapes))
    if kv_tokens is None:
        return results
    own = job.fleet.pools[0].pods[0]
    own_tokens = kv_tokens(
        Shape(pods=len(job.fleet.pools[0].pods), max_loras=own.max_loras, max_cpu_loras=0)
    )
    return [
        replace(
            result,
            kv_tokens=(tokens := kv_tokens(result.shape)),
            kv_headroom=(tokens / own_tokens) if tokens is not None and own_tokens else None,
        )
        for result in results
    ]


def _cost(result: ShapeResult) -> tuple[int, int, int]:
    shape = result.shape
    return (shape.pods, shape.max_loras, shape.max_cpu_loras)


def recommend(
    results: Sequence[ShapeResult],
    *,
    target_hit: float,
    target_ttft_p95_ms: float | None = None,
) -> Recommendation:
    """The cheapest shape meeting the targets, or the best found and why none did."""
    if not results:
        raise InputError([Problem(source="capacity", message="the grid has no shapes")])
    meeting = [
        result
        for result in results
        if result.gpu_hit_rate >= target_hit
        and (target_ttft_p95_ms is None or result.ttft_p95_ms <= target_ttft_p95_ms)
    ]
    targets = f"GPU hits >= {target_hit:.1%}" + (
        f" and TTFT p95 <= {target_ttft_p95_ms:.0f} ms" if target_ttft_p95_ms is not None else ""
    )
    if meeting:
        best = min(meeting, key=_cost)
        return Recommendation(
            result=best,
            met=True,
            reason=f"the fewest pods, then GPU slots, then host slots with {targets}",
        )
    best = max(results, key=lambda r: (r.gpu_hit_rate, -r.ttft_p95_ms, [-c for c in _cost(r)]))
    return Recommendation(
        result=best,
        met=False,
        reason=f"no shape in the grid meets {targets}; this is the best found",
    )
