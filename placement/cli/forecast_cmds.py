"""``lorafleet forecast`` and ``lorafleet backtest``: demand forecasts from a request log.

``forecast`` uses only the history before ``--at``, writes the forecast Parquet
(``ts, adapter, mean, q50, q90, q99, p_nonzero``), prints the top adapters with their
peaks and the preload schedule, and can plot history, forecast and band.
``backtest`` scores the models at the controller's horizons (1 h and 24 h).

Owns parsing, files and printing; the forecasting is ``placement.forecast.forecaster``'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer
from rich.table import Table

from models.backtest import BacktestReport, backtest, rolling_origins
from models.base import Forecaster
from models.registry import forecaster_named
from models.series import CountPanel, SeriesError, build_panel
from placement.cli.app import app, err, out, print_labelled, report_errors
from placement.cli.request_logs import LOG_HELP, read_log
from placement.errors import ForecastError, InputError, Problem
from placement.forecast.forecaster import (
    Forecast,
    forecast_demand,
    lead_times_s,
    preloads,
    timezones_of,
)
from placement.inputs import load_catalog
from placement.inputs.files import write_through
from placement.inputs.request_log import RequestLog, empty_log_problem
from placement.settings import Settings

_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86_400}
DEFAULT_BACKTEST_MODELS = (
    "persistence,seasonal-naive-day,median-7d,ewma,level-profile,profile-7d,global-gbm,auto"
)


def parse_duration_s(text: str, *, option: str) -> int:
    """``600``, ``600s``, ``10m``, ``1h``, ``1d`` → seconds; InputError names the option."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*", text)
    seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"] if match else 0.0
    if seconds <= 0:
        raise InputError(
            [Problem(source=option, message=f"not a positive duration: {text!r} (e.g. 10m, 24h)")]
        )
    return int(seconds)


def _seconds(text: str | None, *, option: str, default_s: int) -> int:
    """An option's duration, or the settings tree's default when it is not given."""
    return default_s if text is None else parse_duration_s(text, option=option)


def parse_time(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            [Problem(source="--at", message=f"not an ISO 8601 time: {text!r}")]
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _history_frame(log: RequestLog, bucket_s: int) -> pd.DataFrame:
    return log.counts(bucket_s) if log.aggregated else log.frame


@app.command()
@report_errors
def forecast(
    log: Annotated[Path, typer.Option(help=LOG_HELP)],
    at: Annotated[str, typer.Option(help="forecast origin, ISO 8601 (UTC if no zone)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="forecast Parquet to write")],
    horizon: Annotated[
        str | None, typer.Option(help="how far ahead, e.g. 24h; default: forecast.horizon_s")
    ] = None,
    bucket: Annotated[
        str | None, typer.Option(help="bucket width, e.g. 10m; default: forecast.bucket_s")
    ] = None,
    catalog: Annotated[Path | None, typer.Option(help="catalog.yaml: zones, sizes")] = None,
    model: Annotated[str, typer.Option(help="auto, global-gbm, profile-7d, ...")] = "auto",
    plot: Annotated[Path | None, typer.Option(help="PNG of the top adapters")] = None,
    top: Annotated[int, typer.Option(help="adapters to show")] = 10,
) -> None:
    """Forecast each adapter's requests per bucket after --at from the history before it."""
    settings = Settings()
    horizon_s = _seconds(horizon, option="--horizon", default_s=settings.forecast.horizon_s)
    bucket_s = _seconds(bucket, option="--bucket", default_s=settings.forecast.bucket_s)
    moment = parse_time(at)
    parsed_catalog = load_catalog(catalog) if catalog is not None else None
    request_log = read_log(log)
    if request_log.frame.empty:
        raise InputError([empty_log_problem(log)])
    result = forecast_demand(
        _history_frame(request_log, bucket_s),
        at=moment,
        horizon_s=horizon_s,
        bucket_s=bucket_s,
        timezones=timezones_of(parsed_catalog) if parsed_catalog else None,
        adapters=[str(a.name) for a in parsed_catalog.adapters] if parsed_catalog else (),
        model=model,
    )
    for note in request_log.notes:
        print_labelled(err(), "yellow", "note", f"{log}: {note}")
    output.parent.mkdir(parents=True, exist_ok=True)
    write_through(output, lambda temporary: result.frame.to_parquet(temporary, index=False))
    leads = (
        lead_times_s(
            parsed_catalog,
            load_cost=settings.load_cost,
            minimum_s=settings.forecast.preload_lead_s,
        )
        if parsed_catalog
        else None
    )
    print_forecast(result, top=top, leads_s=leads, settings=settings)
    if plot is not None:
        plot_forecast(result, plot, top=min(top, 6))
        out().print(f"wrote {plot}", highlight=False)
    out().print(f"wrote {output} ({len(result.frame)} rows)", highlight=False)


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M")


def print_forecast(
    result: Forecast, *, top: int, leads_s: dict[str, int] | None, settings: Settings
) -> None:
    console = out()
    history_days = result.history.n_buckets * result.bucket_s / 86_400
    console.print(
        f"forecast from {result.origin:%Y-%m-%d %H:%M} UTC, {result.result.horizon} buckets of "
        f"{result.bucket_s // 60} min, {len(result.result.adapters)} adapters, "
        f"{history_days:.1f} days of history",
        highlight=False,
    )
    for note in result.notes:
        print_labelled(err(), "yellow", "note", note)
    console.print(_top_table(result, top))
    schedule = preloads(result, settings=settings.forecast, leads_s=leads_s)
    table = Table(title=f"preload schedule ({len(schedule)} rises into the hot tier)")
    for column in ("load at (UTC)", "hot from", "adapter", "expected", "P(any)", "lead"):
        table.add_column(
            column, justify="right" if column in ("expected", "P(any)", "lead") else "left"
        )
    width = min(40, max((len(item.adapter) for item in schedule), default=7))
    table.columns[2].min_width = width
    for item in schedule[: max(top, 10)]:
        lead_min = (item.needed_at_s - item.load_at_s) / 60
        table.add_row(
            _stamp(item.load_at_s),
            _stamp(item.needed_at_s),
            item.adapter,
            f"{item.expected_requests:,.1f}",
            f"{item.p_nonzero:.2f}",
            f"{lead_min:.0f} min" + (" (late)" if "late" in item.reason else ""),
        )
    console.print(table)


def _top_table(result: Forecast, top: int) -> Table:
    forecast_result = result.result
    totals = forecast_result.mean.sum(axis=0)
    order = np.argsort(-totals, kind="stable")[:top]
    table = Table(title=f"top {len(order)} adapters by expected requests")
    for column in (
        "adapter",
        "model",
        "expected",
        "peak mean",
        "peak at (UTC)",
        "q90 at peak",
        "max P(any)",
    ):
        left = column in ("adapter", "model")
        width = (
            min(40, max(len(a) for a in forecast_result.adapters)) if column == "adapter" else None
        )
        table.add_column(
            column, justify="left" if left else "right", overflow="fold", min_width=width
        )
    for column in order:
        peak = int(np.argmax(forecast_result.mean[:, column]))
        table.add_row(
            forecast_result.adapters[column],
            forecast_result.model[column],
            f"{totals[column]:,.0f}",
            f"{forecast_result.mean[peak, column]:,.1f}",
            _stamp(forecast_result.origin_s + peak * forecast_result.bucket_s),
            f"{forecast_result.q90[peak, column]:,.1f}",
            f"{forecast_result.p_nonzero[:, column].max():.2f}",
        )
    return table


def plot_forecast(result: Forecast, path: Path, *, top: int) -> None:
    """History (last 3 days), forecast mean and the q50-q90 band of the top adapters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    forecast_result, history = result.result, result.history
    order = np.argsort(-forecast_result.mean.sum(axis=0), kind="stable")[:top]
    figure, axes = plt.subplots(
        max(1, len(order)), 1, figsize=(10, 2.4 * max(1, len(order))), squeeze=False
    )
    back = min(history.n_buckets, 3 * history.per_day())
    past = pd.to_datetime(
        history.bucket_starts_s(first=history.n_buckets - back), unit="s", utc=True
    )
    ahead = pd.to_datetime(
        forecast_result.origin_s + np.arange(forecast_result.horizon) * forecast_result.bucket_s,
        unit="s",
        utc=True,
    )
    for axis, column in zip(axes[:, 0], order, strict=False):
        axis.plot(past, history.counts[-back:, column], color="0.4", lw=0.8, label="history")
        axis.plot(ahead, forecast_result.mean[:, column], color="tab:blue", lw=1.2, label="mean")
        axis.fill_between(
            ahead,
            forecast_result.q50[:, column],
            forecast_result.q90[:, column],
            color="tab:blue",
            alpha=0.25,
            label="q50-q90",
        )
        axis.set_title(forecast_result.adapters[column], fontsize=9)
        axis.set_ylabel(f"req / {result.bucket_s // 60} min", fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    try:
        kind = path.suffix.lstrip(".").lower() or "png"
        write_through(path, lambda temporary: figure.savefig(temporary, dpi=90, format=kind))
    except OSError as exc:
        raise InputError(
            [Problem(source=str(path), message=f"cannot write the plot: {exc}")]
        ) from None
    finally:
        plt.close(figure)


@app.command("backtest")
@report_errors
def backtest_command(
    log: Annotated[Path, typer.Option(help=LOG_HELP)],
    bucket: Annotated[
        str | None, typer.Option(help="bucket width, e.g. 10m; default: forecast.bucket_s")
    ] = None,
    models: Annotated[
        str, typer.Option(help="comma-separated model names")
    ] = DEFAULT_BACKTEST_MODELS,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of tables")] = False,
) -> None:
    """Rolling-origin backtest at 1 h (persistence's horizon) and 24 h (yesterday's)."""
    bucket_s = _seconds(bucket, option="--bucket", default_s=Settings().forecast.bucket_s)
    request_log = read_log(log)
    if request_log.frame.empty:  # a bad input as in forecast and plan: exit 2, not 1
        raise InputError([empty_log_problem(log)])
    frame = _history_frame(request_log, bucket_s)
    try:
        forecasters = [forecaster_named(name.strip()) for name in models.split(",") if name.strip()]
    except KeyError as exc:
        raise InputError([Problem(source="--models", message=str(exc.args[0]))]) from None
    end_s = int(pd.Timestamp(frame["ts"].max()).timestamp()) + bucket_s
    try:
        panel = build_panel(frame, bucket_s=bucket_s, end_s=end_s)
    except SeriesError as exc:
        raise ForecastError(f"{log}: {exc}") from None
    per_day = panel.per_day()
    days = panel.n_buckets // per_day
    if days < 2:
        raise ForecastError(
            f"{log}: the log covers {panel.n_buckets * bucket_s / 86_400:.1f} days; "
            "a backtest needs at least 2 (one to learn from, one to score)"
        )
    reports = _run_backtests(panel, forecasters, days=days)
    if as_json:
        out().print_json(json.dumps({"horizons": [_report_dict(r) for r in reports]}))
        return
    for report in reports:
        out().print(_report_table(report))
        for note in report.notes:
            print_labelled(err(), "yellow", "note", note)


def _run_backtests(
    panel: CountPanel, forecasters: Sequence[Forecaster], *, days: int
) -> list[BacktestReport]:
    per_day = panel.per_day()
    day_origins = rolling_origins(
        panel, first=(days - min(4, days - 1)) * per_day, every=per_day, count=4
    )
    hour = max(1, 3600 // panel.bucket_s)
    hour_origins = rolling_origins(
        panel,
        first=(days - min(3, days - 1)) * per_day,
        every=max(1, 4 * hour),
        count=6 * min(3, days - 1),
    )
    return [
        backtest(panel, forecasters, origins=hour_origins, horizon=hour, refit_every=per_day),
        backtest(panel, forecasters, origins=day_origins, horizon=per_day, refit_every=per_day),
    ]


def _report_dict(report: BacktestReport) -> dict[str, object]:
    return {
        "horizon_s": report.horizon_buckets * report.bucket_s,
        "origins": [_stamp(s) for s in report.origins_s],
        "major_adapters": list(report.major_adapters),
        "best": report.best() if report.models else None,
        "models": [
            {"model": m.model, "overall": asdict(m.overall), "major": asdict(m.major)}
            for m in report.models
        ],
        "notes": list(report.notes),
    }


def _report_table(report: BacktestReport) -> Table:
    hours = report.horizon_buckets * report.bucket_s / 3600
    table = Table(
        title=(
            f"{hours:g} h ahead: {len(report.origins_s)} origins; adapters with >=1% of traffic "
            f"({len(report.major_adapters)}) / all"
        )
    )
    for column in (
        "model",
        "MAE/persistence",
        "MAE/yesterday",
        "MASE",
        "wMAPE",
        "pinball q90",
        "q90 coverage",
    ):
        table.add_column(column, justify="left" if column == "model" else "right")
    for m in report.models:
        pair = (m.major, m.overall)
        table.add_row(
            m.model,
            *(
                " / ".join(f"{getattr(s, key):.3f}" for s in pair)
                for key in ("mae_vs_persistence", "mae_vs_yesterday", "mase", "wmape")
            ),
            " / ".join(f"{s.pinball_90:.2f}" for s in pair),
            " / ".join(f"{s.coverage_90:.2f}" for s in pair),
        )
    return table
