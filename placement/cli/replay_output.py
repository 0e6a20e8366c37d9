"""What ``lorafleet replay`` prints and writes: the table of every policy, the lines
per class and after pod losses, the ``--json`` payload and the ``--out-log`` frame.

Formats results it is given; must not replay anything (``replay_cmds`` does).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rich.table import Table

from placement.cli.app import out
from placement.sim.engine import COLD_LOAD, CPU_HIT, GPU_HIT
from placement.sim.replay import AFTER_POD_LOSS_S, ReplayResult
from placement.sim.workload import SimWorkload

#: The table's columns: (metric key, header, format).
COLUMNS = (
    ("requests", "requests", "{:,}"),
    ("gpu_hit_rate", "GPU hit", "{:.1%}"),
    ("cpu_hit_rate", "CPU hit", "{:.1%}"),
    ("cold_loads", "cold loads", "{:,}"),
    ("loads", "loads", "{:,}"),
    ("loads_per_pod_s", "loads/pod/s", "{:.4f}"),
    ("loads_per_pod_s_peak", "peak", "{:.3f}"),
    ("residency_p50_s", "resid p50 s", "{:.0f}"),
    ("residency_p95_s", "resid p95 s", "{:.0f}"),
    ("ttft_p50_ms", "TTFT p50", "{:.0f}"),
    ("ttft_p95_ms", "TTFT p95", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99", "{:.0f}"),
    ("ttft_hit_p95_ms", "hit p95", "{:.0f}"),
    ("ttft_miss_p95_ms", "miss p95", "{:.0f}"),
    ("load_wait_share", "load wait", "{:.1%}"),
    ("throughput_rps", "req/s", "{:.2f}"),
    ("distinct_adapters_per_pod", "adapters/pod", "{:.1f}"),
    ("convoy", "convoy", "{}"),
)
OUTCOME_NAMES = {GPU_HIT: "gpu_hit", CPU_HIT: "cpu_hit", COLD_LOAD: "cold_load"}


def result_json(result: ReplayResult) -> dict[str, object]:
    """A policy's figures as ``--json`` prints them."""
    payload: dict[str, object] = dict(result.metrics)
    if result.event_figures is not None:
        payload["events"] = {
            **result.event_figures,
            "login_surge_ttft_p95_ms": result.login_surge_ttft_p95_ms,
            "by_kind": result.event_figures_by_kind,
        }
    if result.after_pod_loss is not None:
        payload["after_pod_loss"] = result.after_pod_loss
    if result.by_class:
        payload["by_class"] = result.by_class
        payload["class_warmups"] = result.warmups
    return payload


def class_lines(result: ReplayResult) -> list[str]:
    """With ``--class-priority``: a line per catalog class (GPU hits, TTFT p95)."""
    return [
        f"{result.policy}: {name}: {figures['requests']:,} requests,"
        f" {figures['gpu_hit_rate']:.2%} GPU hits, TTFT p95 {figures['ttft_p95_ms']:,.0f} ms"
        for name, figures in result.by_class.items()
    ] + ([f"{result.policy}: {result.warmups:,} class warm-ups"] if result.by_class else [])


def results_table(results: list[ReplayResult]) -> Table:
    """One row per policy, the columns of ``COLUMNS``."""
    table = Table(title="replay")
    table.add_column("policy", no_wrap=True)
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for result in results:
        cells = [fmt.format(result.metrics.get(key, 0)) for key, _, fmt in COLUMNS]
        table.add_row(f"{result.policy} ({result.eviction.value})", *cells)
    return table


def replayed_frame(workload: SimWorkload, results: list[ReplayResult]) -> pd.DataFrame:
    """The request log of every replay, one row per request and policy."""
    start = pd.Timestamp(workload.start)
    stamps = start + pd.to_timedelta(np.asarray(workload.arrival_s), unit="s")
    frames = []
    for result in results:
        pods = np.asarray((*result.pod_ids, ""), dtype=object)
        frames.append(
            pd.DataFrame(
                {
                    "ts": stamps,
                    "adapter": workload.adapters,
                    "prompt_tokens": workload.prompt_tokens,
                    "output_tokens": workload.output_tokens,
                    "pod": pods[np.asarray(result.log.pod)],
                    "outcome": [OUTCOME_NAMES.get(code, "rejected") for code in result.log.outcome],
                    "ttft_ms": np.round(np.asarray(result.log.ttft_ms), 3),
                    "policy": result.policy,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def print_results(results: list[ReplayResult]) -> None:
    """The table, then each policy's lines per class and after its pod losses."""
    console = out()
    # Nineteen columns: wider than a default pipe, so never squeeze them into 80.
    console.width = max(console.width, 200)
    console.print(results_table(results))
    for result in results:
        for line in class_lines(result):
            console.print(line, highlight=False, markup=False)
        if result.after_pod_loss is not None:
            lost = result.after_pod_loss
            console.print(
                f"{result.policy}: in the {AFTER_POD_LOSS_S / 60:.0f} min after each of"
                f" {lost['pod_losses']} pod losses, {lost['requests']:,} requests:"
                f" {lost['served_share']:.1%} served, {lost['gpu_hit_rate']:.1%} GPU hits,"
                f" {lost['cold_loads_on_critical_path']:,} cold loads on the critical path,"
                f" TTFT p95 {lost['ttft_p95_ms']:,.0f} ms"
            )
