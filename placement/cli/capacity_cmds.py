"""``lorafleet capacity``: replay a grid of fleet shapes and name the cheapest meeting a target."""

from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.table import Table

from placement.cli.app import app, err, out, report_errors
from placement.cli.replay_cmds import (
    figures_window,
    parse_moment,
    replay_events,
    with_load_admission,
)
from placement.cli.request_logs import LOG_HELP, read_log
from placement.cli.size_cmds import base_model
from placement.domain import Catalog, Fleet, Pipelines
from placement.errors import InputError, Problem
from placement.inputs import load_catalog, load_fleet, parse_bytes
from placement.inputs.pipelines import load_pipelines
from placement.inputs.request_log import RequestLog
from placement.ledgers import gpu_bytes, ledgers
from placement.settings import Settings
from placement.sim.capacity import (
    GridJob,
    Recommendation,
    Shape,
    ShapeResult,
    default_grid,
    past_counts,
    recommend,
    replay_grid,
)
from placement.sim.events import SimEvent
from placement.sim.routers import POLICIES
from placement.sim.wiring import PLANNERS
from placement.sim.workload import SimWorkload, workload_from_log
from placement.sizing import SizingError


def _integers(option: str, text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise InputError(
            [Problem(source=option, message=f"expected whole numbers like 4,8,12, got {text!r}")]
        ) from None
    if not values or values[0] < 1:
        raise InputError([Problem(source=option, message=f"expected numbers >= 1, got {text!r}")])
    return values


def _grid(fleet: Fleet, slots: str | None, pods: str | None, host: str | None) -> list[Shape]:
    shapes = default_grid(fleet)
    slot_values = _integers("--slots", slots) or sorted({s.max_loras for s in shapes})
    pod_values = _integers("--pods", pods) or sorted({s.pods for s in shapes})
    host_values = _integers("--host-slots", host)
    template = fleet.pools[0].pods[0]
    return [
        Shape(pods=n, max_loras=s, max_cpu_loras=max(h, s))
        for n in pod_values
        for s in slot_values
        for h in (host_values or [max(template.max_cpu_loras, template.max_loras)])
    ]


def _span(text: str, option: str) -> pd.Timedelta:
    try:
        span = pd.Timedelta(text)
    except ValueError as exc:
        raise InputError([Problem(source=option, message=f"{text!r}: {exc}")]) from None
    if span < pd.Timedelta(0):
        raise InputError([Problem(source=option, message=f"{text!r} is negative")])
    return span


def split_log(
    log: RequestLog, start: str | None, end: str | None, *, history: str, warmup: str
) -> tuple[RequestLog, RequestLog | None]:
    """The requests replayed (from ``warmup`` before ``start`` to ``end``) and the log
    before them that the forecaster sees as counts (``history`` before ``start`` on)."""
    if start is None:
        return log, None
    back = _span(history, "--history")
    lead = min(_span(warmup, "--warmup"), back)
    first = parse_moment(start, "--from")
    hi = parse_moment(end, "--to") if end is not None else None
    ts = log.frame["ts"]
    keep = ts >= first - lead if hi is None else (ts >= first - lead) & (ts < hi)
    before = (ts >= first - back) & (ts < first - lead)
    replayed = replace(log, frame=log.frame.loc[keep].reset_index(drop=True))
    if not before.any():
        return replayed, None
    return replayed, replace(log, frame=log.frame.loc[before].reset_index(drop=True))


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the grid's replays)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _kv_tokens(
    fleet: Fleet, gpu: str | None, quant: str, config: Path | None
) -> dict[int, int | None]:
    if gpu is None:
        return {}
    pool = fleet.pools[0]
    try:
        model = base_model(None if config is not None else pool.base_model, config)
    except SizingError as exc:
        source = "--config" if config is not None else "--gpu"
        raise InputError([Problem(source=source, message=str(exc))]) from None
    try:
        device = parse_bytes(gpu)
    except ValueError:
        try:
            device = gpu_bytes(gpu)
        except SizingError as exc:
            message = str(exc).replace("give --gpu-bytes, e.g. 80GiB", "give --gpu 80GiB")
            raise InputError([Problem(source="--gpu", message=message)]) from None
    found: dict[int, int | None] = {}
    for slots in range(1, 129):
        try:
            found[slots] = ledgers(
                model,
                device_bytes=device,
                quant=quant,
                max_loras=slots,
                max_lora_rank=pool.max_lora_rank,
            ).kv_tokens
        except SizingError:
            found[slots] = None
    return found


def _table(results: list[ShapeResult], chosen: Shape) -> Table:
    table = Table(title="Fleet shapes", title_justify="left")
    for header in ("pods", "GPU slots", "host slots", "GPU hit", "TTFT p95", "loads/pod/s", "KV"):
        table.add_column(header, justify="right")
    for result in sorted(results, key=lambda r: r.shape):
        mark = " *" if result.shape == chosen else ""
        table.add_row(
            f"{result.shape.pods}{mark}",
            str(result.shape.max_loras),
            str(result.shape.max_cpu_loras),
            f"{result.gpu_hit_rate:.2%}",
            f"{result.ttft_p95_ms:.0f} ms",
            f"{result.loads_per_pod_s:.4f}",
            "" if result.kv_tokens is None else f"{result.kv_tokens:,} tok",
        )
    return table


def _plot(results: list[ShapeResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for pods in sorted({r.shape.pods for r in results}):
        rows = sorted((r for r in results if r.shape.pods == pods), key=lambda r: r.shape)
        axes.plot(
            [r.shape.max_loras for r in rows],
            [100 * r.gpu_hit_rate for r in rows],
            marker="o",
            label=f"{pods} pods",
        )
    axes.set_xlabel("GPU slots per pod (max_loras)")
    axes.set_ylabel("GPU hit rate (%)")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _check_choices(*, target_hit: float, policy: str, planner: str) -> None:
    if not 0.0 < target_hit <= 1.0:
        raise InputError([Problem(source="--target-hit", message="give a share in (0, 1]")])
    if policy not in POLICIES:
        raise InputError(
            [Problem(source="--policy", message=f"unknown {policy!r}; one of {POLICIES}")]
        )
    if planner not in PLANNERS:
        raise InputError(
            [Problem(source="--planner", message=f"unknown {planner!r}; one of {PLANNERS}")]
        )


def _delivered_events(
    events: Path | None,
    workload: SimWorkload,
    *,
    catalog: Catalog,
    fleet: Fleet,
    pipelines: Pipelines | None,
    settings: Settings,
) -> tuple[SimEvent, ...]:
    """``--events`` as every shape's replay delivers them; none without it."""
    if events is None:
        return ()
    found, _ = replay_events(
        events, workload, catalog=catalog, fleet=fleet, pipelines=pipelines, settings=settings
    )
    return tuple(found)


@dataclass(frozen=True, kw_only=True)
class _Stopwatch:
    """The grid's wall and CPU seconds since it started."""

    started_s: float
    cpu_started_s: float

    @classmethod
    def start(cls) -> _Stopwatch:
        return cls(started_s=time.monotonic(), cpu_started_s=_cpu_s())

    def wall_s(self) -> float:
        return time.monotonic() - self.started_s

    def cpu_s(self) -> float:
        return _cpu_s() - self.cpu_started_s


def _print_json(
    chosen: Recommendation, results: list[ShapeResult], *, policy: str, stopwatch: _Stopwatch
) -> None:
    payload = {
        "recommended": chosen.result.as_dict(),
        "met": chosen.met,
        "reason": chosen.reason,
        "policy": policy,
        "grid": [result.as_dict() for result in sorted(results, key=lambda r: r.shape)],
        "wall_s": round(stopwatch.wall_s(), 1),
        # The replays' CPU time: the grid's wall time on idle cores is about this
        # divided by --jobs, whatever else the machine was running.
        "cpu_s": round(stopwatch.cpu_s(), 1),
    }
    out().print_json(json.dumps(payload))


def _print_verdict(
    chosen: Recommendation, results: list[ShapeResult], *, stopwatch: _Stopwatch
) -> None:
    """The grid's table, the shape chosen and why, then (on stderr) the time it took."""
    out().print(_table(results, chosen.result.shape))
    shape = chosen.result.shape
    verdict = "recommended" if chosen.met else "best found (no shape met the targets)"
    out().print(
        f"{verdict}: {shape.pods} pods x {shape.max_loras} GPU slots, "
        f"{shape.max_cpu_loras} host slots: {chosen.result.gpu_hit_rate:.2%} GPU hits, "
        f"TTFT p95 {chosen.result.ttft_p95_ms:.0f} ms ({chosen.reason})"
    )
    err().print(
        f"{len(results)} shapes replayed in {stopwatch.wall_s():.0f} s"
        f" ({stopwatch.cpu_s():.0f} CPU s)"
    )


# Past 80 lines for its option declarations alone (each flag's name, default and help
# in one place, as ``--help`` shows them); the body is a few named calls.
@app.command()
@report_errors
def capacity(
    catalog: Annotated[Path, typer.Option(help="catalog.yaml")],
    fleet: Annotated[Path, typer.Option(help="fleet.yaml (one pool: the shape to vary)")],
    log: Annotated[Path, typer.Option(help=LOG_HELP)],
    target_hit: Annotated[float, typer.Option(help="GPU hit rate to meet, e.g. 0.97")],
    target_ttft_p95: Annotated[
        float | None, typer.Option("--target-ttft-p95", help="TTFT p95 to meet, ms")
    ] = None,
    slots: Annotated[str | None, typer.Option(help="GPU slots per pod to try, e.g. 4,6,8")] = None,
    pods: Annotated[str | None, typer.Option(help="pods to try, e.g. 8,10,12")] = None,
    host_slots: Annotated[str | None, typer.Option(help="host slots per pod to try")] = None,
    grid_policy: Annotated[
        str, typer.Option("--policy", help=f"policy: {', '.join(POLICIES)}")
    ] = "lorafleet",
    planner: Annotated[str, typer.Option(help=f"lorafleet's planner: {', '.join(PLANNERS)}")] = (
        "greedy"
    ),
    window_from: Annotated[
        str | None, typer.Option("--from", help="figures from this time (ISO, with offset)")
    ] = None,
    window_to: Annotated[
        str | None, typer.Option("--to", help="figures up to this time (ISO, with offset)")
    ] = None,
    history: Annotated[
        str, typer.Option(help="with --from: the log the forecaster sees before it, e.g. 7D")
    ] = "7D",
    warmup: Annotated[
        str, typer.Option(help="with --from: the part of --history replayed, e.g. 1h")
    ] = "1h",
    events: Annotated[
        Path | None, typer.Option(help="event log delivered to lorafleet's controller")
    ] = None,
    pipelines: Annotated[
        Path | None, typer.Option(help="pipelines.yaml, for the events' pipeline triggers")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option(help="GPU (h100-80gb) or its bytes (80GiB): slots in KV tokens")
    ] = None,
    quant: Annotated[str, typer.Option(help="base weights' quantisation, with --gpu")] = "fp16",
    config: Annotated[
        Path | None,
        typer.Option(help="with --gpu: the base model's config.json, when it is not built in"),
    ] = None,
    load_admission: Annotated[
        str | None,
        typer.Option(
            help="how a pod admits around a load (sim.load_admission): drain (the default)"
            " or vllm (vLLM's and current SGLang's scheduler: no drain); see replay --help"
        ),
    ] = None,
    jobs: Annotated[int, typer.Option(help="replays run at once")] = 2,
    plot: Annotated[Path | None, typer.Option(help="write hit rate vs slots and pods (PNG)")] = (
        None
    ),
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Replay a grid of fleet shapes; name the cheapest meeting the targets."""
    _check_choices(target_hit=target_hit, policy=grid_policy, planner=planner)
    settings = with_load_admission(Settings(), load_admission)
    parsed_fleet = load_fleet(fleet)
    parsed_catalog = load_catalog(catalog, fleet=parsed_fleet)
    shapes = _grid(parsed_fleet, slots, pods, host_slots)
    kv = _kv_tokens(parsed_fleet, gpu, quant, config)
    replayed, before = split_log(
        read_log(log), window_from, window_to, history=history, warmup=warmup
    )
    bucket_s = settings.forecast.bucket_s
    workload = workload_from_log(replayed, parsed_catalog, bucket_s=bucket_s)
    parsed_pipelines = (
        load_pipelines(pipelines, catalog=parsed_catalog) if pipelines is not None else None
    )
    delivered = _delivered_events(
        events,
        workload,
        catalog=parsed_catalog,
        fleet=parsed_fleet,
        pipelines=parsed_pipelines,
        settings=settings,
    )
    job = GridJob(
        workload=workload,
        fleet=parsed_fleet,
        settings=settings,
        policy=grid_policy,
        planner=planner,
        window_s=figures_window(workload, window_from, window_to),
        past=None if before is None else past_counts(before, bucket_s),
        events=delivered,
        pipelines=parsed_pipelines,
    )
    stopwatch = _Stopwatch.start()
    results = replay_grid(
        job,
        parsed_catalog,
        shapes,
        jobs=max(1, jobs),
        kv_tokens=(lambda shape: kv.get(shape.max_loras)) if kv else None,
    )
    chosen = recommend(results, target_hit=target_hit, target_ttft_p95_ms=target_ttft_p95)
    if plot is not None:
        _plot(results, plot)
    if as_json:
        _print_json(chosen, results, policy=grid_policy, stopwatch=stopwatch)
        return
    _print_verdict(chosen, results, stopwatch=stopwatch)
