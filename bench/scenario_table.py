"""Every scenario against its claim: one table of policies, figures and the claims.

For each scenario in ``data/`` (code-assistant, legal-research, saas-50, war-story) and
ServeGen m-mid as ``bench/replay_servegen.py`` builds it, replays round-robin, EPP,
llm-d, bounded, lorafleet and the oracle as ``lorafleet replay`` does by default (its
settings, its CP-SAT planning, and the scenario's ``events.parquet`` with its
``pipelines.yaml`` where it has one, as ``--events``/``--pipelines`` deliver them), and
prints one row per scenario and policy: GPU hits, loads, loads/pod/s, TTFT p50/p95,
the figure the llm-d article's claim about that workload is about, the claim, and
whether it holds. A claim holds when the figure is within 30% of it ("about"), at
most 30% above it ("at most"), or at least it ("at least": a hit rate); a count of
pods must hold exactly.

Then the war story's two fixes (``war_story_windows``: 8 slots per pod; the top 10
production adapters pinned) as what-if runs of EPP and lorafleet, beside the unfixed
runs, in Thursday's windows 08:00-10:15 and 14:30-15:30 (EDT).

Runs are spread over ``--jobs`` processes; each loads a scenario once.

    .venv/bin/python bench/scenario_table.py [--scenario NAME ...] [--jobs 2] [--markdown]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import war_story_windows as ws

from placement.cli.replay_cmds import replay_events
from placement.domain import Catalog, Fleet, Pipelines
from placement.inputs import load_catalog, load_fleet
from placement.inputs.pipelines import load_pipelines
from placement.inputs.request_log import load_request_log
from placement.settings import Settings
from placement.sim.engine import GPU_HIT, REJECTED, FleetReplay
from placement.sim.events import EventController, SimEvent
from placement.sim.replay import ReplayResult, run_policy
from placement.sim.routers import PLANNED
from placement.sim.wiring import replay_planning
from placement.sim.workload import SimWorkload, workload_from_log

DATA = Path("data")
SERVEGEN = "servegen-m-mid"
SCENARIOS = ("code-assistant", "legal-research", "saas-50", "war-story", SERVEGEN)
POLICIES = ("round-robin", "epp", "llm-d", "bounded", "lorafleet", "oracle")
AFFINITY = ("epp", "llm-d", "bounded", "lorafleet", "oracle")
REACTIVE = ("round-robin", "epp", "llm-d", "bounded")
WAR_STORY = "war-story"
FIXES = ("8 slots", "top 10 pinned")
FIXED_POLICIES = ("epp", "lorafleet")
BEFORE, CASCADE = "before 08:00-10:15", "cascade 14:30-15:30"
FIRST = "first_request_ttft_p95_ms"


# --- the inputs ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """One scenario as ``lorafleet replay`` reads it."""

    directory: Path | None
    workload: SimWorkload
    catalog: Catalog
    fleet: Fleet
    events: tuple[SimEvent, ...] = ()
    controller: EventController | None = None


def read_scenario(directory: Path, settings: Settings) -> Inputs:
    """A scenario folder: fleet, catalog, request log and, where present, events."""
    fleet = load_fleet(directory / "fleet.yaml")
    catalog = load_catalog(directory / "catalog.yaml", fleet=fleet)
    log = load_request_log(directory / "requests.parquet")
    workload = workload_from_log(log, catalog, bucket_s=settings.forecast.bucket_s)
    events_path = directory / "events.parquet"
    if not events_path.exists():
        return Inputs(directory=directory, workload=workload, catalog=catalog, fleet=fleet)
    pipelines_path = directory / "pipelines.yaml"
    pipelines = (
        load_pipelines(pipelines_path, catalog=catalog) if pipelines_path.exists() else Pipelines()
    )
    events, controller = replay_events(
        events_path, workload, catalog=catalog, fleet=fleet, pipelines=pipelines, settings=settings
    )
    return Inputs(
        directory=directory,
        workload=workload,
        catalog=catalog,
        fleet=fleet,
        events=tuple(events),
        controller=controller,
    )


@functools.lru_cache(maxsize=2)
def scenario_inputs(name: str, data: Path) -> Inputs:
    """Two scenarios at most per process: the war story's log is 6.3 M requests."""
    if name == SERVEGEN:
        from replay_servegen import build  # reads ../shared/traces

        workload, catalog, fleet = build(2, 4.0, 0)
        return Inputs(directory=None, workload=workload, catalog=catalog, fleet=fleet)
    return read_scenario(data / name, Settings())


# --- one run ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Task:
    scenario: str
    policy: str
    fix: str = ""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One run's figures, plain values (they cross a process boundary)."""

    scenario: str
    policy: str
    fix: str
    metrics: dict[str, float]
    events: dict[str, float] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


def variant(
    inputs: Inputs, fix: str, settings: Settings, workdir: Path
) -> tuple[Fleet, Catalog, Settings, type[FleetReplay]]:
    """The fleet, catalog, settings and replay of a fix ("": the scenario as it is)."""
    if fix == "":
        return inputs.fleet, inputs.catalog, settings, FleetReplay
    if fix == "8 slots":
        fleet, tuned = ws.eight_slots(inputs.fleet, settings)
        return fleet, inputs.catalog, tuned, FleetReplay
    assert fix == "top 10 pinned" and inputs.directory is not None
    top = ws.top_production(inputs.workload, before=ws.thursday("00:00"))
    pins = ws.pin_plan(top, [str(pod.name) for pod in inputs.fleet.pods])
    path = ws.pinned_catalog(inputs.directory / "catalog.yaml", pins, workdir)
    catalog = load_catalog(path, fleet=inputs.fleet)
    return inputs.fleet, catalog, settings, ws.pinned_replay(pins)


def run_task(task: Task, data: Path = DATA) -> Row:
    inputs = scenario_inputs(task.scenario, data)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        fleet, catalog, settings, replay_type = variant(inputs, task.fix, Settings(), Path(workdir))
    planning = (
        replay_planning(catalog, fleet, settings=settings) if task.policy in PLANNED else None
    )
    result = run_policy(
        task.policy,
        inputs.workload,
        fleet,
        settings=settings,
        planning=planning,
        replay_type=replay_type,
        events=inputs.events,
        controller=inputs.controller,
    )
    figures = scenario_figures(task, inputs.workload, result, settings)
    return Row(
        scenario=task.scenario,
        policy=task.policy,
        fix=task.fix,
        metrics=flat(result.metrics),
        events=flat(result.event_figures or {}),
        figures=figures,
        wall_s=time.perf_counter() - began,
    )


def flat(figures: Mapping[str, object], prefix: str = "") -> dict[str, float]:
    """Numbers of a figures mapping, nested ones (per kind, per tenant) as ``a.b`` keys."""
    out: dict[str, float] = {}
    for key, value in figures.items():
        if isinstance(value, Mapping):
            out.update(flat(value, f"{prefix}{key}."))
        elif isinstance(value, int | float):
            out[f"{prefix}{key}"] = float(value)
    return out


def top_traffic(
    workload: SimWorkload, result: ReplayResult, *, count: int = 10
) -> dict[str, float]:
    """The ``count`` busiest adapters: their share of requests, of GPU hits among them,
    and how few pods carry 90% of their served requests."""
    adapters = np.asarray(workload.adapters)
    names, counts = np.unique(adapters, return_counts=True)
    top = names[np.argsort(-counts, kind="stable")[:count]]
    mine = np.isin(adapters, top)
    outcome = np.asarray(result.log.outcome)[mine]
    served = outcome != REJECTED
    pods = np.asarray(result.log.pod)[mine][served]
    per_pod = np.sort(np.bincount(pods, minlength=len(result.pod_ids)))[::-1]
    carry = int(np.searchsorted(np.cumsum(per_pod), 0.9 * per_pod.sum()) + 1)
    return {
        "top10_share": float(mine.mean()),
        "top10_hit": float(np.mean(outcome[served] == GPU_HIT)) if served.any() else 0.0,
        "top10_pods": float(carry),
    }


def scenario_figures(
    task: Task, workload: SimWorkload, result: ReplayResult, settings: Settings
) -> dict[str, float]:
    figures = {"miss_share": 1.0 - float(result.metrics["gpu_hit_rate"])}
    if task.scenario == "saas-50":
        figures.update(top_traffic(workload, result))
    if task.scenario == WAR_STORY:
        pods = len(result.pod_ids)
        figures.update(
            ws.article_figures(
                workload,
                result.log,
                pods=pods,
                prefill_ms_per_token=settings.sim.prefill_ms_per_token,
            )
        )
        for window in ws.article_windows():
            if window.name in (BEFORE, CASCADE):
                start_s, end_s = ws.window_seconds(workload, window)
                seen = ws.request_window(
                    workload, result.log, pods=pods, start_s=start_s, end_s=end_s
                )
                figures.update({f"{window.name}|{key}": value for key, value in seen.items()})
    return figures


# --- the claims ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Check:
    """One figure of a claim: ``rule`` is "about", "at most" or "at least"."""

    label: str
    key: str
    claim: float
    rule: str
    unit: str = ""
    slack: float = 0.3

    def holds(self, measured: float) -> bool:
        if self.rule == "at least":
            return measured >= self.claim
        if self.rule == "at most":
            return measured <= self.claim * (1.0 + self.slack)
        return abs(measured - self.claim) <= self.slack * self.claim

    def show(self, value: float) -> str:
        if self.unit == "%":
            return f"{value:.1%}"
        if self.unit == "ms":
            return f"{value:,.0f} ms"
        return f"{value:.3g}{self.unit}"


@dataclass(frozen=True, kw_only=True)
class Claim:
    scenario: str
    policies: tuple[str, ...]
    words: str
    checks: tuple[Check, ...]


def _war_story_checks() -> tuple[Check, ...]:
    rules = {"hit": ("at least", "%"), "swaps": ("about", "/s/pod"), "ttft_p95_ms": ("about", "ms")}
    rules["critical_pods"] = ("about", " pods")
    return tuple(
        Check(
            label=words,
            key=f"{window}|{key}",
            claim=value,
            rule=rules[key][0],
            unit=rules[key][1],
        )
        for window, key, value, words in ws.ARTICLE
        if key in rules
    )


CLAIMS = (
    Claim(
        scenario="code-assistant",
        policies=("round-robin",),
        words="round-robin: swaps on 45% of requests, p99 1.1 s",
        checks=(
            Check(label="swaps", key="miss_share", claim=0.45, rule="about", unit="%"),
            Check(label="p99", key="ttft_p99_ms", claim=1100.0, rule="about", unit="ms"),
        ),
    ),
    Claim(
        scenario="code-assistant",
        policies=AFFINITY,
        words="adapter affinity: swaps on 7% of requests, p99 320 ms",
        checks=(
            Check(label="swaps", key="miss_share", claim=0.07, rule="at most", unit="%"),
            Check(label="p99", key="ttft_p99_ms", claim=320.0, rule="at most", unit="ms"),
        ),
    ),
    Claim(
        scenario="legal-research",
        policies=REACTIVE,
        words="no preloading: the first query after a 9 AM login waits 1.2 s",
        checks=(
            Check(
                label="first p95",
                key="first_request_ttft_p95_ms",
                claim=1200.0,
                rule="about",
                unit="ms",
            ),
        ),
    ),
    Claim(
        scenario="legal-research",
        policies=("lorafleet", "oracle"),
        words="preloading at 9 AM: the first query 180 ms, the session's under 200 ms",
        checks=(
            Check(
                label="first p95",
                key="first_request_ttft_p95_ms",
                claim=180.0,
                rule="at most",
                unit="ms",
            ),
            Check(
                label="p95", key="ttft_p95_ms", claim=200.0, rule="at most", unit="ms", slack=0.0
            ),
        ),
    ),
    Claim(
        scenario="saas-50",
        policies=("round-robin",),
        words="round-robin: 84% of requests need a swap",
        checks=(Check(label="swaps", key="miss_share", claim=0.84, rule="about", unit="%"),),
    ),
    Claim(
        scenario="saas-50",
        policies=AFFINITY,
        words="the top 10 customers (70% of traffic) pinned on 4 pods",
        checks=(
            Check(label="top-10 share", key="top10_share", claim=0.70, rule="about", unit="%"),
            Check(
                label="pods with 90% of top 10",
                key="top10_pods",
                claim=4.0,
                rule="at most",
                slack=0.0,
            ),
            Check(label="top-10 GPU hits", key="top10_hit", claim=0.99, rule="at least", unit="%"),
        ),
    ),
    Claim(
        scenario=WAR_STORY,
        policies=("epp",),
        words="the article's EPP timeline (residency left out: see the calibration)",
        checks=_war_story_checks(),
    ),
)


def claims_for(scenario: str, policy: str) -> list[Claim]:
    return [c for c in CLAIMS if c.scenario == scenario and policy in c.policies]


def value_of(row: Row, key: str) -> float | None:
    """A figure of the row: scenario figures, then event figures, then the metrics."""
    for source in (row.figures, row.events, row.metrics):
        if key in source:
            return source[key]
    return None


def judge(row: Row) -> tuple[str, str]:
    """(the claim with each figure measured, whether it holds: yes, no or k of n)."""
    claims = claims_for(row.scenario, row.policy)
    if not claims:
        if row.scenario == WAR_STORY:
            return "(the article's figures are EPP's)", "-"
        return "(no claim for this policy)", "-"
    words, held, total = [], 0, 0
    for claim in claims:
        parts = []
        for check in claim.checks:
            measured = value_of(row, check.key)
            if measured is None:
                parts.append(f"{check.label}: not measured")
                continue
            ok = check.holds(measured)
            held, total = held + ok, total + 1
            mark = "holds" if ok else "fails"
            parts.append(
                f"{check.label} {check.rule} {check.show(check.claim)}:"
                f" {check.show(measured)} {mark}"
            )
        words.append(f"{claim.words} [{'; '.join(parts)}]")
    verdict = "yes" if held == total else "no" if held == 0 else f"{held} of {total}"
    return " ".join(words), verdict


# --- the tables ---------------------------------------------------------------------


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


# --- the run ------------------------------------------------------------------------


def tasks_for(scenarios: Sequence[str]) -> list[Task]:
    """Every run, in the order they are worth having when a busy machine cannot finish:
    the small scenarios, EPP on the war story with its fixes, saas-50, lorafleet on the
    war story with its fixes, ServeGen, then the war story's other policies."""
    tasks = [Task(scenario=name, policy=policy) for name in scenarios for policy in POLICIES]
    if WAR_STORY in scenarios:
        tasks += [
            Task(scenario=WAR_STORY, policy=p, fix=fix) for p in FIXED_POLICIES for fix in FIXES
        ]

    def rank(task: Task) -> tuple[int, int]:
        if task.scenario == WAR_STORY:
            stage = 2 if task.policy == "epp" else 4 if task.policy == "lorafleet" else 6
        else:
            stage = {"legal-research": 0, "code-assistant": 1, "saas-50": 3, SERVEGEN: 5}[
                task.scenario
            ]
        return stage, POLICIES.index(task.policy)

    return sorted(tasks, key=rank)


def run_all(
    tasks: Sequence[Task], *, data: Path, jobs: int, rows_path: Path | None = None
) -> list[Row]:
    """The runs, in ``jobs`` processes (1: here); rows come back in task order. With
    ``rows_path`` each row is appended there as it comes (JSON lines), and the tasks
    already there are not run again: a long run that stops can go on."""
    done = read_rows(rows_path) if rows_path is not None and rows_path.exists() else []
    have = {(row.scenario, row.policy, row.fix): row for row in done}
    todo = [task for task in tasks if (task.scenario, task.policy, task.fix) not in have]
    task_run: Callable[[Task], Row] = functools.partial(run_task, data=data)
    if jobs <= 1:
        fresh = [_noted(task_run(task), rows_path) for task in todo]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            fresh = [_noted(row, rows_path) for row in pool.map(task_run, todo)]
    have.update({(row.scenario, row.policy, row.fix): row for row in fresh})
    return [have[(task.scenario, task.policy, task.fix)] for task in tasks]


def _noted(row: Row, rows_path: Path | None) -> Row:
    fix = f" ({row.fix})" if row.fix else ""
    print(f"  {row.scenario} {row.policy}{fix}: {row.wall_s:.0f} s", file=sys.stderr)
    if rows_path is not None:
        with rows_path.open("a") as rows_file:
            rows_file.write(json.dumps(asdict(row)) + "\n")
    return row


def read_rows(path: Path) -> list[Row]:
    return [Row(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def table(rows: Sequence[Row], *, markdown: bool) -> str:
    """The scenario table, then (with the war story) its fixes beside the unfixed runs."""
    main = [row for row in rows if not row.fix]
    main.sort(key=lambda r: (SCENARIOS.index(r.scenario), POLICIES.index(r.policy)))
    parts = [main_table(main, markdown=markdown)]
    fixes = [r for r in rows if r.scenario == WAR_STORY and r.policy in FIXED_POLICIES]
    if any(row.fix for row in fixes):
        fixes.sort(key=lambda r: (FIXED_POLICIES.index(r.policy), ("", *FIXES).index(r.fix)))
        parts.append(
            "The war story's fixes (Thursday, EDT; the same 3-day log replayed whole):\n\n"
            + fixes_table(fixes, markdown=markdown)
        )
    return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--rows", type=Path, default=None, help="JSON lines of finished runs: kept, and resumed"
    )
    args = parser.parse_args(argv)
    scenarios = args.scenario or list(SCENARIOS)
    kept = len(read_rows(args.rows)) if args.rows is not None and args.rows.exists() else 0
    began = time.perf_counter()
    rows = run_all(tasks_for(scenarios), data=args.data, jobs=args.jobs, rows_path=args.rows)
    print(table(rows, markdown=args.markdown))
    wall_s = time.perf_counter() - began
    ran = f"{len(rows)} runs" + (f" ({kept} read from {args.rows})" if kept else "")
    print(f"\n{ran} in {wall_s:.0f} s wall time ({args.jobs} jobs)")


if __name__ == "__main__":
    main()
