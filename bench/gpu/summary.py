"""Print the short table of bench/gpu/run_all.sh from the JSON files in a folder.

python bench/gpu/summary.py "$OUT"
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def load(folder: Path, name: str) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads((folder / name).read_text())
        return data
    except (OSError, ValueError):
        return None


def f(value: Any, fmt: str = ".2f") -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def h2d(data: dict[str, Any] | None) -> list[str]:
    if data is None:
        return ["h2d: no result"]
    lines = [
        f"LoRA host->GPU copies ({data.get('gpu') or data.get('device')}), median ms [GB/s]",
        f"  {'shape':>5} {'rank':>4} {'MB':>7}  {'pageable/tensor':>16} {'pageable/flat':>16}"
        f" {'pinned/tensor':>16} {'pinned/flat':>16} {'pin ms':>7}",
    ]
    for row in data.get("copies", []):

        def cell(key: str, r: dict[str, Any] = row) -> str:
            got = r.get(key)
            if not isinstance(got, dict) or "median_ms" not in got:
                return "-"
            return f"{got['median_ms']:.2f} [{got['gb_per_s']:.1f}]"

        lines.append(
            f"  {row.get('shape', '?'):>5} {row.get('rank', '?'):>4} {f(row.get('mb'), '.1f'):>7}"
            f"  {cell('pageable_per_tensor'):>16} {cell('pageable_flat'):>16}"
            f" {cell('pinned_per_tensor'):>16} {cell('pinned_flat'):>16}"
            f" {f(row.get('pin_per_tensor_ms'), '.1f'):>7}"
            + (f"  ERROR {row['error']}" if "error" in row else "")
        )
    for disk in data.get("disk", []):
        for place in ("shm", "tmp"):
            got = disk.get(place)
            if not isinstance(got, dict):
                continue
            if "skipped" in got or "error" in got:
                lines.append(
                    f"  disk {disk.get('shape')} r{disk.get('rank')} {place}: "
                    f"{got.get('skipped') or got.get('error')}"
                )
                continue
            mb = got.get("file_bytes", 0) / 1e6
            lines.append(
                f"  disk {disk.get('shape')} r{disk.get('rank')} {place} ({mb:.0f} MB), "
                "median ms [GB/s], page cache warm / evicted:"
            )
            names = sorted({k.rsplit(".", 1)[0] for k in got if "." in k and k != "dir"})
            for name in names:
                cells = []
                for cache in ("warm", "evicted"):
                    v = got.get(f"{name}.{cache}", {})
                    cells.append(
                        f"{v['median_ms']:.1f} [{v['gb_per_s']:.1f}]" if "median_ms" in v else "-"
                    )
                lines.append(f"    {name:<32} {cells[0]:>16} / {cells[1]:<16}")
    for err in data.get("errors", []):
        lines.append(f"  ! {err}")
    return lines


def peft(data: dict[str, Any] | None) -> list[str]:
    if data is None:
        return ["peft: no result"]
    lines = [
        f"PEFT ({data.get('gpu') or data.get('device')}, {data.get('params_m')} M params, "
        f"{data.get('dtype')}, transformers {data.get('transformers')}, peft {data.get('peft')})",
        f"  model build {f(data.get('model_build_s'))} s; "
        f"PeftModel.from_pretrained first {f(data.get('from_pretrained_first_ms'), '.1f')} ms",
    ]
    loads = data.get("load_adapter_ms", {})
    sizes = data.get("adapter_bytes", {})
    for rank, got in loads.items():
        lines.append(
            f"  load_adapter r{rank:<3} ({sizes.get(rank, 0) / 1e6:.1f} MB): median "
            f"{got['median']:.1f} ms, min {got['min']:.1f}, first {got['first']:.1f} (n={got['n']})"
        )
    switch = data.get("set_adapter_ms")
    if switch:
        lines.append(
            f"  set_adapter ({switch['adapters_loaded']} loaded): median "
            f"{switch['median'] * 1e3:.0f} us, p90 {switch['p90'] * 1e3:.0f} us"
        )
    fwd = data.get("forward_ms")
    if fwd:
        base = fwd.get("disabled")
        cells = [f"plain {f(data.get('forward_plain_ms'))}", f"disabled {f(base)}"]
        cells += [f"{k} {v:.2f} (+{v - base:.2f})" for k, v in fwd.items() if k != "disabled"]
        lines.append(
            f"  forward b=1 x {data.get('tokens')} tok, ms: "
            + ", ".join(cells)
            + f" (adapter changes output: {data.get('adapter_changes_output')})"
        )
    after = data.get("switch_then_forward_ms")
    if after:
        lines.append(
            f"  after a switch: first forward {after['first_forward_median']:.2f} ms vs steady "
            f"{after['steady_forward_median']:.2f} ms (switch+first "
            f"{after['switch_plus_first_median']:.2f} ms)"
        )
    cold = data.get("cold_swap_then_forward_ms")
    if cold:
        lines.append(
            "  cold swap (load from disk + set + forward): "
            + ", ".join(f"r{r} {v:.1f} ms" for r, v in cold.items())
        )
    for err in data.get("errors", []):
        lines.append(f"  ! {err}")
    return lines


def router(data: dict[str, Any] | None) -> list[str]:
    if data is None:
        return ["router: no result"]
    cfg = data.get("config", {})
    cores = data.get("cores", {})
    lines = [
        f"Router at {f(cfg.get('rate_rps'), '.0f')} req/s for {f(cfg.get('seconds'), '.0f')} s "
        f"({cfg.get('requests')} requests, {cfg.get('pods')} pods, pinned={cores.get('pinned')}: "
        f"router {cores.get('router')}, pods {cores.get('pods')}, gen {cores.get('gen')})",
        f"  {'path':<8} {'ok':>6} {'err':>5} {'rps':>7} {'p50':>7} {'p90':>7} {'p95':>7}"
        f" {'p99':>7} {'p99.9':>7} {'max':>7} {'lag99':>6} {'rtr us/req':>10}",
    ]
    for key in sorted(k for k in data if k.startswith(("direct", "routed"))):
        got = data[key]
        if not isinstance(got, dict) or "latency" not in got:
            continue
        lat = got["latency"]
        lines.append(
            f"  {key:<8} {got['ok']:>6} {sum(got['errors'].values()):>5}"
            f" {f(got.get('achieved_rps'), '.1f'):>7} {f(lat['p50_ms']):>7} {f(lat['p90_ms']):>7}"
            f" {f(lat['p95_ms']):>7} {f(lat['p99_ms']):>7} {f(lat['p999_ms']):>7}"
            f" {f(lat['max_ms']):>7} {f(got['send_lag_ms']['p99']):>6}"
            f" {f(got.get('router_cpu_us_per_request'), '.0f'):>10}"
        )
    added = data.get("added_ms")
    if added:
        lines.append(
            "  added by the router (ms): "
            + ", ".join(f"{k.removesuffix('_ms')} {v:.3f}" for k, v in added.items())
        )
    closed = [(k, data[k]) for k in ("closed_direct", "closed_routed") if k in data]
    if closed:
        lines.append(
            "  closed loop (64 in flight): "
            + ", ".join(f"{k.removeprefix('closed_')} {v['rps']:.0f} req/s" for k, v in closed)
        )
    for err in data.get("errors", []):
        lines.append(f"  ! {err}")
    return lines


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    lines = []
    for part in (
        h2d(load(folder, "h2d.json")),
        peft(load(folder, "peft.json")),
        router(load(folder, "router.json")),
    ):
        lines += [*part, ""]
    sections = folder / "sections.txt"
    if sections.exists():
        lines.append(
            "sections (name rc seconds): "
            + "; ".join(line.strip() for line in sections.read_text().splitlines() if line.strip())
        )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
