"""``lorafleet recommend pins``: the adapters worth pinning per pool, checked by replay."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer
import yaml
from rich.table import Table

from placement.cli.app import app, err, out, report_errors
from placement.cli.capacity_cmds import split_log
from placement.cli.replay_cmds import figures_window, parse_moment
from placement.cli.request_logs import LOG_HELP, read_log
from placement.domain import Catalog, Fleet
from placement.errors import InputError, Problem
from placement.forecast.pins import PinRules, PoolPins, recommend_pins
from placement.inputs import load_catalog, load_fleet
from placement.inputs.request_log import RequestLog
from placement.settings import Settings
from placement.sim.capacity import PastHistory, past_counts
from placement.sim.engine import GPU_HIT
from placement.sim.replay import run_policy
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload, workload_from_log

recommend = typer.Typer(help="Recommendations from request logs.", no_args_is_help=True)
app.add_typer(recommend, name="recommend")


def pinned_catalog_yaml(catalog_path: Path, pools: list[PoolPins]) -> str:
    """The catalog file with each recommended pin pinned on its pods, by name."""
    raw = yaml.safe_load(catalog_path.read_text())
    pins = {pin.adapter: pin for pool in pools for pin in pool.pins}
    pods = {name: pin.pods for name, pin in pins.items()}
    for entry in raw.get("adapters", []):
        if isinstance(entry, dict) and entry.get("name") in pods:
            named = list(pins[entry["name"]].pod_ids)
            entry["pinned"] = named or True
            entry["min_replicas"] = pods[entry["name"]]
            entry["max_replicas"] = max(int(entry.get("max_replicas", 0)), pods[entry["name"]])
    return yaml.safe_dump(raw, sort_keys=False)


def _check(
    workload: SimWorkload,
    fleet: Fleet,
    catalogs: dict[str, Catalog],
    pinned: set[str],
    window_s: tuple[float, float] | None,
    planner: str,
    past: RequestLog | None,
) -> dict[str, dict[str, float]]:
    """lorafleet replayed with each catalog: hit rates overall and of the unpinned rest."""
    settings = Settings()
    arrival = np.asarray(workload.arrival_s)
    lo, hi = window_s or (0.0, float("inf"))
    in_window = (arrival >= lo) & (arrival < hi)
    rest = in_window & ~np.isin(np.asarray(workload.adapters), sorted(pinned))
    figures = {}
    for label, catalog in catalogs.items():
        planning = replay_planning(catalog, fleet, settings=settings, planner=planner)
        if past is not None:
            planning = replace(planning, forecaster=PastHistory(planning.forecaster, past))
        result = run_policy(
            "lorafleet", workload, fleet, settings=settings, planning=planning, window_s=window_s
        )
        hits = np.asarray(result.log.outcome) == GPU_HIT
        figures[label] = {
            "gpu_hit_rate": float(result.metrics["gpu_hit_rate"]),
            "ttft_p95_ms": float(result.metrics["ttft_p95_ms"]),
            "loads": float(result.metrics["loads"]),
            "unpinned_gpu_hit_rate": float(hits[rest].mean()) if rest.any() else float("nan"),
        }
    return figures


def _check_rules(*, max_pins: int, min_share: float, pods_per_pin: int) -> None:
    if max_pins < 0 or not 0.0 <= min_share < 1.0:
        raise InputError(
            [Problem(source="--max-pins/--min-share", message="give max_pins >= 0, share < 1")]
        )
    if pods_per_pin < 0:
        raise InputError([Problem(source="--pods-per-pin", message="give 0 or more pods")])


def _hourly_until(request_log: RequestLog, end: pd.Timestamp | None) -> pd.DataFrame:
    """The log's hourly counts before ``end`` (``--until``; None: all of them)."""
    hourly = request_log.counts(3600)
    if end is not None:
        hourly = hourly[hourly["ts"] < end]
    if hourly.empty:
        raise InputError([Problem(source="--until", message="no request before that time")])
    return hourly


def _pins_report(pools: list[PoolPins], end: pd.Timestamp | None) -> dict[str, object]:
    """The pins per pool as ``--json`` prints them."""
    return {
        "pools": [
            {
                "pool": pool.pool,
                "pins": [
                    {
                        "adapter": pin.adapter,
                        "pods": pin.pods,
                        "pod_ids": list(pin.pod_ids),
                        "share": round(pin.share, 4),
                        "active_share": round(pin.active_share, 3),
                        "peak_rps": round(pin.peak_rps, 3),
                    }
                    for pin in pool.pins
                ],
                "pinned_share": round(pool.pinned_share, 4),
                "pinned_slots": pool.pinned_slots,
                "slots": pool.slots,
                "passed_over": dict(pool.passed_over),
            }
            for pool in pools
        ],
        "history_until": None if end is None else end.isoformat(),
    }


def _catalog_from(text: str, fleet: Fleet) -> Catalog:
    """The catalog with the pins, parsed as a file is (through one)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "catalog.yaml"
        path.write_text(text)
        return load_catalog(path, fleet=fleet)


def _check_pins(
    request_log: RequestLog,
    pools: list[PoolPins],
    *,
    catalog: Catalog,
    pinned_text: str,
    fleet: Fleet,
    window: tuple[str, str | None],
    history: str,
    warmup: str,
    planner: str,
) -> dict[str, dict[str, float]]:
    """``--check-from``/``--check-to``: lorafleet replayed without and with the pins
    (``pinned_text``: the catalog with them)."""
    pinned = {pin.adapter for pool in pools for pin in pool.pins}
    with_pins = _catalog_from(pinned_text, fleet)
    check_from, check_to = window
    settings = Settings()
    replayed, before = split_log(request_log, check_from, check_to, history=history, warmup=warmup)
    workload = workload_from_log(replayed, catalog, bucket_s=settings.forecast.bucket_s)
    figures_s = figures_window(workload, check_from, check_to)
    err().print("replaying lorafleet without and with the pins ...")
    return _check(
        workload,
        fleet,
        {"without": catalog, "with": with_pins},
        pinned,
        figures_s,
        planner,
        None if before is None else past_counts(before, settings.forecast.bucket_s),
    )


def _print_pins(pools: list[PoolPins], report: dict[str, object]) -> None:
    """A table per pool, what it carries and what was passed over; then the check."""
    for pool in pools:
        table = Table(title=f"Pins for pool {pool.pool}", title_justify="left")
        for header in ("adapter", "pods", "share", "active", "peak req/s"):
            table.add_column(header)
        for pin in pool.pins:
            table.add_row(
                pin.adapter,
                ", ".join(pin.pod_ids) or str(pin.pods),
                f"{pin.share:.1%}",
                f"{pin.active_share:.0%}",
                f"{pin.peak_rps:.2f}",
            )
        out().print(table)
        out().print(
            f"{len(pool.pins)} pins carry {pool.pinned_share:.1%} of the pool's requests on "
            f"{pool.pinned_slots} of {pool.slots} GPU slots"
        )
        for name, why in pool.passed_over.items():
            out().print(f"  not pinned: {name} ({why})")
    if "check" in report:
        out().print_json(json.dumps(report["check"]))


@recommend.command("pins")
@report_errors
def pins(
    catalog: Annotated[Path, typer.Option(help="catalog.yaml")],
    fleet: Annotated[Path, typer.Option(help="fleet.yaml")],
    log: Annotated[Path, typer.Option(help=LOG_HELP)],
    until: Annotated[
        str | None, typer.Option(help="use the log before this time (ISO, with offset)")
    ] = None,
    max_pins: Annotated[int, typer.Option(help="pins per pool at most")] = PinRules.max_pins,
    min_share: Annotated[
        float, typer.Option(help="a pin's share of its pool's requests at least")
    ] = PinRules.min_share,
    check_from: Annotated[
        str | None, typer.Option(help="replay with and without the pins from this time")
    ] = None,
    check_to: Annotated[str | None, typer.Option(help="... to this time")] = None,
    history: Annotated[
        str, typer.Option(help="with --check-from: the log the forecaster sees before it")
    ] = "7D",
    warmup: Annotated[
        str, typer.Option(help="with --check-from: the part of --history replayed, e.g. 1h")
    ] = "1h",
    pods_per_pin: Annotated[
        int, typer.Option(help="pods each pin is held on (0: enough to carry its peak hour)")
    ] = 1,
    planner: Annotated[str, typer.Option(help="lorafleet's planner in the check")] = "greedy",
    write_catalog: Annotated[
        Path | None, typer.Option(help="write the catalog with the pins here")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The adapters worth pinning per pool (heavy, steady, production), and their pods."""
    _check_rules(max_pins=max_pins, min_share=min_share, pods_per_pin=pods_per_pin)
    parsed_fleet = load_fleet(fleet)
    parsed_catalog = load_catalog(catalog, fleet=parsed_fleet)
    request_log = read_log(log)
    end = parse_moment(until, "--until") if until is not None else None
    pools = recommend_pins(
        _hourly_until(request_log, end),
        parsed_catalog,
        parsed_fleet,
        PinRules(max_pins=max_pins, min_share=min_share, pods_per_pin=pods_per_pin or None),
    )
    text = pinned_catalog_yaml(catalog, pools)
    if write_catalog is not None:
        write_catalog.write_text(text)
    report = _pins_report(pools, end)
    if check_from is not None:
        report["check"] = _check_pins(
            request_log,
            pools,
            catalog=parsed_catalog,
            pinned_text=text,
            fleet=parsed_fleet,
            window=(check_from, check_to),
            history=history,
            warmup=warmup,
            planner=planner,
        )
    if as_json:
        out().print_json(json.dumps(report))
        return
    _print_pins(pools, report)
