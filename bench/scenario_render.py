"""The scenario table's text: the main table, issue 17's targets and the war story's
fixes, rendered as aligned text or Markdown from rows (``scenario_claims.Row``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from bench.scenario_claims import (
    POLICIES,
    SERVEGEN,
    WAR_STORY,
    Row,
    event_targets,
    gap_figures,
    judge,
    share,
)

BEFORE, CASCADE = "before 08:00-10:15", "cascade 14:30-15:30"
FIRST = "first_request_ttft_p95_ms"
SCENARIOS = ("code-assistant", "legal-research", "saas-50", "war-story", SERVEGEN)
FIXES = ("8 slots", "top 10 pinned")
FIXED_POLICIES = ("epp", "lorafleet")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def login_figure(e: Mapping[str, float]) -> str:
    """The first request after each login, each tenant's login surges, the cold loads."""
    surges = [
        f"{key.split('.', 1)[1]} {value:,.0f} ms"
        for key, value in e.items()
        if key.startswith("login_surge_ttft_p95_ms.")
    ]
    cold = e.get("cold_loads_on_critical_path")
    return (
        f"first request after a login: p95 {_ms(e.get(FIRST))} ms,"
        f" on GPU {e.get('first_request_gpu_share', 0.0):.0%} of {e.get('count', 0):.0f}"
        + (f"; login surge p95: {', '.join(surges)}" if surges else "")
        + (f"; cold loads on the critical path {cold:,.0f}" if cold is not None else "")
        + f"; preloads {e.get('preloads', 0):,.0f}"
    )


def scenario_figure(row: Row) -> str:
    """The figure the scenario's claim is about, in words."""
    f = row.figures
    if row.scenario == "legal-research":
        return login_figure(row.events)
    if row.scenario == "saas-50":
        return (
            f"swaps {f['miss_share']:.1%}; top 10: {f['top10_share']:.0%} of requests,"
            f" {f['top10_hit']:.1%} GPU hits, 90% on {f['top10_pods']:.0f} pods"
        )
    if row.scenario == WAR_STORY:
        shed = row.metrics.get("shed", 0.0) / max(row.metrics["requests"], 1.0)
        return "; ".join(
            [
                f"{window.split()[-1]}: {f[window + '|hit']:.1%} hits,"
                f" {f[window + '|swaps']:.3f} swaps/s/pod,"
                f" p95 {_ms(f[window + '|ttft_p95_ms'])} ms"
                for window in (BEFORE, CASCADE)
            ]
            + [f"shed {shed:.2%} of the run"]
        )
    p99 = f" p99 {_ms(row.metrics.get('ttft_p99_ms'))} ms" if row.scenario != SERVEGEN else ""
    return f"swaps {f['miss_share']:.1%}{p99}"


def render(header: Sequence[str], lines: Iterable[Sequence[str]], *, markdown: bool) -> str:
    rows = [list(header), *[list(line) for line in lines]]
    if markdown:
        out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(cells) + " |" for cells in rows[1:]]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def main_table(rows: Sequence[Row], *, markdown: bool) -> str:
    header = (
        "scenario", "policy", "GPU hits", "loads", "loads/pod/s", "TTFT p50/p95 ms",
        "figure", "the seed's claim", "holds",
    )  # fmt: skip
    lines = []
    for row in rows:
        m = row.metrics
        claim, verdict = judge(row)
        lines.append(
            (
                row.scenario,
                row.policy,
                f"{m['gpu_hit_rate']:.1%}",
                f"{m['loads']:,.0f}",
                f"{m['loads_per_pod_s']:.4f}",
                f"{_ms(m['ttft_p50_ms'])} / {_ms(m['ttft_p95_ms'])}",
                scenario_figure(row),
                claim,
                verdict,
            )
        )
    return render(header, lines, markdown=markdown)


def targets_table(rows: Sequence[Row], *, markdown: bool) -> str:
    """Issue 17's targets per scenario: lorafleet against the best reactive policy
    and the oracle, and the event targets where the scenario has events."""
    header = (
        "scenario", "best reactive", "loads gap closed", "TTFT p95 gap closed",
        "GPU hits below the oracle", "events (lorafleet)", "holds",
    )  # fmt: skip
    mine = {(row.scenario, row.policy): row for row in rows if not row.fix}
    lines = [
        (
            g.scenario,
            g.reactive,
            share(g.loads_closed),
            share(g.p95_closed),
            f"{100 * g.hits_below_oracle:.1f} pts",
            event_targets(mine[(g.scenario, "lorafleet")]),
            g.verdict(),
        )
        for g in gap_figures(rows)
    ]
    return render(header, lines, markdown=markdown)


def fixes_table(rows: Sequence[Row], *, markdown: bool) -> str:
    header = ["policy", "fix"]
    for window in (BEFORE, CASCADE):
        span = window.split()[-1]
        header += [f"{span} GPU hits", f"{span} swaps/s/pod", f"{span} TTFT p95 ms"]
    lines = []
    for row in rows:
        cells = [row.policy, row.fix or "none (as shipped)"]
        for window in (BEFORE, CASCADE):
            f = row.figures
            cells += [
                f"{f[window + '|hit']:.1%}",
                f"{f[window + '|swaps']:.3f}",
                _ms(f[window + "|ttft_p95_ms"]),
            ]
        lines.append(cells)
    return render(header, lines, markdown=markdown)


def table(rows: Sequence[Row], *, markdown: bool) -> str:
    """The scenario table, then (with the war story) its fixes beside the unfixed runs."""
    main = [row for row in rows if not row.fix]
    main.sort(key=lambda r: (SCENARIOS.index(r.scenario), POLICIES.index(r.policy)))
    parts = [main_table(main, markdown=markdown)]
    if gap_figures(main):
        parts.append(
            "lorafleet against issue 17's targets (the gap from the best reactive policy"
            " to the oracle; at least half closed, hits within 1 point):\n\n"
            + targets_table(main, markdown=markdown)
        )
    fixes = [r for r in rows if r.scenario == WAR_STORY and r.policy in FIXED_POLICIES]
    if any(row.fix for row in fixes):
        fixes.sort(key=lambda r: (FIXED_POLICIES.index(r.policy), ("", *FIXES).index(r.fix)))
        parts.append(
            "The war story's fixes (Thursday, EDT; the same 3-day log replayed whole):\n\n"
            + fixes_table(fixes, markdown=markdown)
        )
    return "\n\n".join(parts)
