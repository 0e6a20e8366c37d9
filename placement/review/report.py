"""The plan review as one self-contained HTML page: tables, and plots as inline PNGs.

Owns the page ``lorafleet review --html`` writes: the summary and solver quality, an
adapter-by-pod placement heatmap, per-pod GPU and host bytes against budget, the top
adapters' forecast (or history) with the plan's preload times marked, the hit rate
before and after from a replay, SLO attainment per tenant in those replays, and the
per-pod and per-adapter tables. A section whose inputs are absent says so instead of
drawing. CSS is inline; plots are PNGs in ``data:`` URIs drawn with matplotlib's object
API (``Figure``, the Agg canvas), so the file opens anywhere without network access.

Returns a string; writing the file is the caller's.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from placement.domain import AdapterId, Tier
from placement.plan import Plan
from placement.review.diff import PlanReview, human_bytes
from placement.review.replay import SHOWN, ReplayComparison
from placement.review.slo import ATTAINMENT_HEADER, attainment_rows

MAX_HEATMAP_ADAPTERS = 60
#: matplotlib's date axis counts days since 1970-01-01 (its default epoch).
_DAY_S = 86_400.0
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;
color:#1d232a;line-height:1.4}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #d0d7de;padding-bottom:.2em;
margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #d0d7de;padding:.25em .5em;text-align:left;vertical-align:top}
th{background:#f3f5f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.4em .8em}
.warn{color:#b42318}.up{color:#1a7f37}.down{color:#b42318}
img{max-width:100%}
"""


def _png(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{encoded}">'


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="num">{html.escape(c)}</td>'
            if i in numeric
            else f"<td>{html.escape(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def heatmap_section(plan: Plan, review: PlanReview) -> str:
    pods = sorted(plan.pods)
    placed = plan.placement()
    adapters = [r.adapter for r in review.adapters if r.tier is not Tier.COLD]
    if not pods or not adapters:
        return _note("The plan places no adapter on any pod: nothing to draw.")
    shown = adapters[:MAX_HEATMAP_ADAPTERS]
    grid = np.array([[_cell(placed[p].get(a)) for p in pods] for a in shown], dtype=float)
    figure = Figure(figsize=(max(4.0, 0.5 * len(pods) + 3), max(3.0, 0.22 * len(shown) + 1)))
    axes = figure.add_subplot()
    axes.imshow(grid, aspect="auto", cmap="YlOrRd", vmin=0, vmax=2, interpolation="nearest")
    axes.set_xticks(range(len(pods)), pods, rotation=45, ha="right", fontsize=8)
    axes.set_yticks(range(len(shown)), shown, fontsize=7)
    axes.set_title("placement: dark = hot (GPU), light = warm (host RAM)", fontsize=9)
    more = len(adapters) - len(shown)
    extra = _note(f"{more} more placed adapters not drawn.") if more > 0 else ""
    return _png(figure) + extra


def _cell(tier: Tier | None) -> float:
    return {Tier.HOT: 2.0, Tier.WARM: 1.0}.get(tier, 0.0) if tier is not None else 0.0


def budget_section(review: PlanReview) -> str:
    pods = [p for p in review.pods if p.hot or p.warm or p.budget is not None]
    if not pods:
        return _note("No pods in the plan.")
    names = [str(p.pod) for p in pods]
    figure = Figure(figsize=(10, max(2.5, 0.35 * len(pods) + 1)))
    for index, (title, used, limit) in enumerate(
        (
            ("GPU adapter bytes (MiB)", [p.hbm_bytes_used for p in pods], "hbm_bytes"),
            ("host adapter bytes (MiB)", [p.host_bytes_used for p in pods], "host_bytes"),
        )
    ):
        axes = figure.add_subplot(1, 2, index + 1)
        rows = np.arange(len(pods))
        axes.barh(rows, np.array(used) / 2**20, color="#d9480f", label="used")
        budgets = [getattr(p.budget, limit) / 2**20 if p.budget else np.nan for p in pods]
        axes.scatter(budgets, rows, marker="|", s=300, color="#1d232a", label="budget")
        axes.set_yticks(rows, names if index == 0 else [""] * len(names), fontsize=8)
        axes.invert_yaxis()
        axes.set_title(title, fontsize=9)
        axes.legend(fontsize=7, loc="lower right")
    note = "" if any(p.budget for p in pods) else _note("No --fleet given: budgets not drawn.")
    return _png(figure) + note


def _top_adapters(frame: pd.DataFrame, column: str, top: int) -> list[str]:
    totals = frame.groupby("adapter")[column].sum().sort_values(ascending=False)
    return [str(a) for a in totals.index[:top]]


def curves_section(
    plan: Plan, *, forecast: pd.DataFrame | None, history: pd.DataFrame | None, top: int
) -> str:
    """Forecast mean and q90 band (or, without a forecast, history) per top adapter,
    with the plan's preloads for that adapter as vertical lines."""
    if forecast is None and history is None:
        return _note(
            "No --forecast or --log given: forecast curves and preload times are not drawn."
        )
    source = forecast if forecast is not None else history
    assert source is not None
    column = "mean" if forecast is not None else "requests"
    names = _top_adapters(source, column, top)
    if not names:
        return _note("The forecast or log has no rows.")
    columns = 2
    rows = (len(names) + columns - 1) // columns
    figure = Figure(figsize=(11, 2.4 * rows))
    for index, name in enumerate(names):
        axes = figure.add_subplot(rows, columns, index + 1)
        _draw_adapter(axes, name, forecast=forecast, history=history)
        for preload in plan.preloads:
            if preload.adapter == AdapterId(name):
                axes.axvline(preload.at.timestamp() / _DAY_S, color="#1a7f37", linestyle="--", lw=1)
        axes.set_title(f"{name} ({plan.tier_of(AdapterId(name)).value})", fontsize=9)
        axes.tick_params(labelsize=7)
    figure.autofmt_xdate()
    legend = "requests per bucket; dashed green lines: the plan's preload times"
    return _png(figure) + f"<p>{html.escape(legend)}</p>"


def _draw_adapter(
    axes: Axes, name: str, *, forecast: pd.DataFrame | None, history: pd.DataFrame | None
) -> None:
    if history is not None:
        past = history.loc[history["adapter"] == name].sort_values("ts")
        axes.plot(past["ts"], past["requests"], color="#57606a", lw=1, label="history")
    if forecast is not None:
        ahead = forecast.loc[forecast["adapter"] == name].sort_values("ts")
        axes.plot(ahead["ts"], ahead["mean"], color="#d9480f", lw=1.5, label="forecast mean")
        if "q90" in ahead.columns:
            axes.fill_between(ahead["ts"], ahead["mean"], ahead["q90"], color="#d9480f", alpha=0.2)
    axes.legend(fontsize=6, loc="upper left")


def replay_section(replay: ReplayComparison | None, reason: str | None) -> str:
    if replay is None:
        return _note(reason or "No replay.")
    figure = Figure(figsize=(5, 2.5))
    axes = figure.add_subplot()
    values = [float(replay.before["gpu_hit_rate"]), float(replay.after["gpu_hit_rate"])]
    axes.bar(["before", "after"], values, color=["#8c959f", "#d9480f"])
    axes.set_ylim(0, 1)
    axes.axhline(0.9, color="#1a7f37", linestyle="--", lw=1)
    axes.set_ylabel("GPU hit rate", fontsize=8)
    axes.tick_params(labelsize=7)
    rows = [
        [label, f"{replay.before.get(key, 0)}", f"{replay.after.get(key, 0)}"]
        for key, label in SHOWN
    ]
    header = ["", replay.before_label, replay.after_label]
    caption = (
        f"Replay of {replay.requests} requests, {replay.span} (simulated fleet): before is "
        f"{replay.before_label}, after is {replay.after_label}; dashed line: the 90% target."
    )
    return _png(figure) + f"<p>{html.escape(caption)}</p>" + _table(header, rows, {1, 2})


def slo_section(replay: ReplayComparison | None, reason: str | None) -> str:
    """Per tenant, before and after: GPU share against the promise, TTFT p95 against
    the tenant's SLO."""
    if replay is None:
        return _note(reason or "No replay.")
    if not replay.after_tenants:
        return _note("The replay has no requests: no tenant to report.")
    missed = [row.tenant for row in replay.after_tenants if not row.gpu_met]
    target = replay.after_tenants[0].gpu_target
    caption = (
        f"Share of each tenant's adapter-bearing requests served from the GPU against the "
        f"{target:.0%} promise, and TTFT p95 against the tightest slo_ttft_ms of its "
        "adapters, in the same replays. "
        + (f"Promise missed after: {', '.join(missed)}." if missed else "Promise met by all.")
    )
    parts = [f"<p>{html.escape(caption)}</p>"]
    for label, rows in (
        (replay.before_label, replay.before_tenants),
        (replay.after_label, replay.after_tenants),
    ):
        parts.append(f"<h3>{html.escape(label)}</h3>")
        parts.append(_table(ATTAINMENT_HEADER, attainment_rows(rows), {1, 2, 3, 4}))
    return "".join(parts)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def summary_section(review: PlanReview) -> str:
    solver = review.solver
    before = review.before_predicted or {}
    rows = [
        ["plan", review.plan_id],
        ["compared with", review.against_id or "(nothing: every registration is a load)"],
        ["tiers", ", ".join(f"{t.value} {n}" for t, n in review.tiers().items())],
        ["loads / unloads", f"{review.loads} / {review.unloads}"],
        ["bytes moved", human_bytes(review.bytes_moved)],
        [
            "predicted GPU hit rate",
            f"{_percent(before.get('gpu_hit_rate'))} -> "
            f"{_percent(review.predicted.get('gpu_hit_rate'))}",
        ],
        ["expected delay (ms/request)", f"{review.predicted.get('expected_delay_ms', 0):.3g}"],
        [
            "solver",
            f"{solver.status}, objective {solver.objective:.4g}, bound {solver.bound:.4g}, "
            f"gap {solver.gap:.2%}, {solver.wall_s:.2f} s",
        ],
    ]
    warnings = "".join(f'<p class="warn">{html.escape(w)}</p>' for w in review.warnings)
    return _table(["", ""], rows, set()) + warnings


def pods_table(review: PlanReview) -> str:
    rows = []
    for pod in review.pods:
        budget = pod.budget
        rows.append(
            [
                str(pod.pod),
                f"{len(pod.hot)}/{budget.slots}" if budget else str(len(pod.hot)),
                f"{len(pod.hot) + len(pod.warm)}/{budget.cpu_slots}"
                if budget
                else str(len(pod.warm)),
                ", ".join(pod.loads) or "-",
                ", ".join(pod.unloads) or "-",
                ", ".join(pod.promoted) or "-",
                human_bytes(pod.bytes_moved),
                f"{pod.expected_rps:.3g}/{budget.capacity_rps:.3g}"
                if budget
                else f"{pod.expected_rps:.3g}",
            ]
        )
    header = ["pod", "GPU slots", "registered", "loads", "unloads", "to GPU", "moved", "rps"]
    return _table(header, rows, {1, 2, 6, 7})


def adapters_table(review: PlanReview) -> str:
    rows = [
        [
            str(a.adapter),
            a.tier.value if a.before in (None, a.tier) else f"{a.before.value} -> {a.tier.value}",
            ", ".join(f"{p} {w:.0%}" for p, w in sorted(a.pods.items())) or "-",
            "; ".join(a.reasons) or "-",
            a.why,
        ]
        for a in review.adapters
    ]
    return _table(["adapter", "tier", "pods (share)", "rules", "why"], rows, set())


def render_html(
    review: PlanReview,
    plan: Plan,
    *,
    forecast: pd.DataFrame | None = None,
    history: pd.DataFrame | None = None,
    replay: ReplayComparison | None = None,
    replay_note: str | None = None,
    top: int = 8,
) -> str:
    sections: Mapping[str, str] = {
        "Summary": summary_section(review),
        "Placement": heatmap_section(plan, review),
        "GPU and host bytes per pod": budget_section(review),
        "Top adapters: forecast and preloads": curves_section(
            plan, forecast=forecast, history=history, top=top
        ),
        "Hit rate before and after (replay of the last day)": replay_section(replay, replay_note),
        "SLO attainment per tenant (same replays)": slo_section(replay, replay_note),
        "Per pod": pods_table(review),
        "Per adapter": adapters_table(review),
    }
    body = "".join(f"<h2>{html.escape(t)}</h2>{content}" for t, content in sections.items())
    title = html.escape(f"lorafleet plan review: {review.plan_id}")
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{_CSS}</style></head><body><h1>{title}</h1>{body}</body></html>\n"
    )
