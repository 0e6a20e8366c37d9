"""``lorafleet summary``: what a scenario holds, its fleet, and the shape of its demand."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from placement.cli.app import app, out, report_errors
from placement.domain import AdapterId, Catalog, Fleet
from placement.inputs import load_catalog, load_fleet, load_request_log

SPARK = " ▁▂▃▄▅▆▇█"
DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "data" / "war-story"


def _sparkline(values: list[float]) -> str:
    top = max(values) or 1.0
    return "".join(SPARK[round(v / top * (len(SPARK) - 1))] for v in values)


def fleet_table(fleet: Fleet) -> Table:
    table = Table(title="Fleet", title_justify="left")
    for column in ("pool", "engine", "base model", "pods", "GPU slots", "host slots", "max rank"):
        table.add_column(column)
    for pool in fleet.pools:
        table.add_row(
            pool.name,
            pool.engine.value,
            pool.base_model,
            str(len(pool.pods)),
            str(sum(pod.max_loras for pod in pool.pods)),
            str(sum(pod.max_cpu_loras for pod in pool.pods)),
            str(pool.max_lora_rank),
        )
    return table


def demand_table(catalog: Catalog, counts: pd.DataFrame, *, top: int = 10) -> Table:
    """Top adapters by requests, with their hourly profile over the log as a sparkline."""
    by_name = catalog.by_name()
    total = counts["requests"].sum()
    per_adapter = (
        counts.groupby("adapter", observed=True)["requests"].sum().sort_values(ascending=False)
    )
    hours = counts.assign(hour=counts["ts"].dt.hour)
    table = Table(
        title=f"Demand: {int(total):,} requests, top {top} adapters", title_justify="left"
    )
    for column in ("adapter", "rank", "MB", "share", "profile by hour of day (UTC)"):
        table.add_column(column)
    for name, requests in per_adapter.head(top).items():
        adapter = by_name.get(AdapterId(str(name)))
        profile = hours[hours["adapter"] == name].groupby("hour")["requests"].sum()
        profile = profile.reindex(range(24), fill_value=0)
        table.add_row(
            str(name),
            str(adapter.rank) if adapter else "?",
            f"{adapter.size_bytes / 1e6:.0f}" if adapter else "?",
            f"{requests / total:.1%}",
            _sparkline([float(v) for v in profile]),
        )
    return table


def print_summary(folder: Path, console: Console) -> None:
    fleet = load_fleet(folder / "fleet.yaml")
    catalog = load_catalog(folder / "catalog.yaml", fleet=fleet)
    log = load_request_log(folder / "requests.parquet")
    counts = log.counts(3600)
    first, last = log.frame["ts"].iloc[0], log.frame["ts"].iloc[-1]
    span = f"{first:%a %Y-%m-%d %H:%M} to {last:%a %Y-%m-%d %H:%M} UTC"
    console.print(
        f"[bold]{folder.name}[/]: {len(catalog.adapters)} adapters, "
        f"{len(fleet.pods)} pods, log {span}"
    )
    console.print(fleet_table(fleet))
    console.print(demand_table(catalog, counts))
    daily = counts.groupby(counts["ts"].dt.hour)["requests"].sum().reindex(range(24), fill_value=0)
    console.print(f"all adapters by hour (UTC): {_sparkline([float(v) for v in daily])}")


@app.command()
@report_errors
def summary(
    scenario: Annotated[
        Path, typer.Argument(help="a scenario folder under data/")
    ] = DEFAULT_SCENARIO,
) -> None:
    """Print a scenario's catalog, fleet and demand summary (top adapters, daily profile)."""
    print_summary(scenario, out())
