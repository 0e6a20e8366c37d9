"""Host-to-GPU copy time of LoRA weights, by model shape and rank; disk to host.

For a 70B-like shape (hidden 8192, 80 layers, q_proj 8192->8192, v_proj 8192->1024
with GQA) and an 8B-like one (hidden 4096, 32 layers, v_proj 4096->1024), ranks
8..128, fp16: builds every layer's A (r x in) and B (out x r) for q_proj and v_proj
as pageable and as pinned CPU tensors, and copies them into preallocated GPU tensors
one by one (as an engine fills its LoRA slots) and as one concatenated buffer. Timed
with CUDA events after a warm-up; the median of several repetitions. Then the time to
read one adapter's safetensors file (from /dev/shm and from a file in the temp
directory, page cache warm and evicted) into host memory, pinned memory, and the GPU.

The copies are ``h2d_copies``', the file reads ``h2d_disk``'s; this script runs them
within its time cap, logs a line each and writes the JSON.

    python bench/gpu/lora_h2d.py --out h2d.json
    python bench/gpu/lora_h2d.py --device cpu --tiny     # smoke test without a GPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if not __package__:  # run as a file: the repository root on the path, for bench.gpu
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.h2d_copies import bench_copy
from bench.gpu.h2d_disk import bench_disk

SHAPES: dict[str, dict[str, int]] = {
    "70b": {"hidden": 8192, "layers": 80, "q_out": 8192, "v_out": 1024},
    "8b": {"hidden": 4096, "layers": 32, "q_out": 4096, "v_out": 1024},
}
TINY = {"tiny": {"hidden": 512, "layers": 4, "q_out": 512, "v_out": 128}}
RANKS = (8, 16, 32, 64, 128)


def log(*parts: Any) -> None:
    print("[h2d]", *parts, flush=True)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda or cpu (smoke test)")
    parser.add_argument("--tiny", action="store_true", help="small shapes (smoke test)")
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--disk-shape", default="70b")
    parser.add_argument("--disk-ranks", default="16,64")
    parser.add_argument("--time-cap", type=float, default=90.0, help="seconds; skip the rest")
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def _copy_line(shape_name: str, rank: int, row: dict[str, Any]) -> str:
    def cell(key: str) -> str:
        got = row.get(key)
        if not isinstance(got, dict) or "median_ms" not in got:
            return "-"
        return f"{got['median_ms']:.2f}({got['gb_per_s']:.0f})"

    return (
        f"{shape_name:>5} {rank:>4} {row.get('mb', 0):>8.1f} "
        f"{cell('pageable_per_tensor'):>11} {cell('pageable_flat'):>11} "
        f"{cell('pinned_per_tensor'):>9} {cell('pinned_flat'):>9}"
        + (f"  ERROR {row['error']}" if "error" in row else "")
    )


def _copies(
    args: argparse.Namespace, result: dict[str, Any], *, deadline: float, save: Callable[[], None]
) -> None:
    """Every shape and rank's copies, a row each, until the time cap."""
    log(
        f"{'shape':>5} {'rank':>4} {'MB':>8} {'pageable/t':>11} {'pageable/1':>11} "
        f"{'pinned/t':>9} {'pinned/1':>9}   (ms, GB/s in brackets)"
    )
    shapes = TINY if args.tiny else SHAPES
    ranks = [int(r) for r in args.ranks.split(",") if r]
    for shape_name, shape in shapes.items():
        for rank in ranks:
            if time.monotonic() > deadline:
                result["errors"].append(f"time cap: skipped {shape_name} r{rank}")
                continue
            try:
                row = bench_copy(shape_name, shape, rank, args.device, args.reps)
            except Exception as exc:
                traceback.print_exc()
                row = {"shape": shape_name, "rank": rank, "error": f"{type(exc).__name__}: {exc}"}
            result["copies"].append(row)
            save()
            log(_copy_line(shape_name, rank, row))


def _disk(
    args: argparse.Namespace, result: dict[str, Any], *, deadline: float, save: Callable[[], None]
) -> None:
    """One shape's file reads at each of ``--disk-ranks``, until the time cap."""
    disk_shapes = {"tiny": TINY["tiny"]} if args.tiny else SHAPES
    disk_name = args.disk_shape if args.disk_shape in disk_shapes else next(iter(disk_shapes))
    shape = disk_shapes[disk_name]
    for rank in [int(r) for r in args.disk_ranks.split(",") if r]:
        if time.monotonic() > deadline:
            result["errors"].append(f"time cap: skipped disk r{rank}")
            continue
        try:
            disk = bench_disk(disk_name, shape, rank, args.device, max(3, args.reps // 3))
        except Exception as exc:
            traceback.print_exc()
            disk = {"rank": rank, "error": f"{type(exc).__name__}: {exc}"}
        result["disk"].append(disk)
        save()
        for place in ("shm", "tmp"):
            got = disk.get(place, {})
            cells = [
                f"{k}={v['median_ms']:.1f}ms({v['gb_per_s']:.1f}GB/s)"
                for k, v in got.items()
                if isinstance(v, dict) and "median_ms" in v
            ]
            extra = got.get("skipped") or got.get("error") or ""
            log(f"disk {disk_name} r{rank} {place}: " + (" ".join(cells) or extra))


def main() -> None:
    args = _arguments()
    deadline = time.monotonic() + args.time_cap
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        log("no CUDA device: falling back to --device cpu")
        args.device = "cpu"
    result: dict[str, Any] = {
        "bench": "lora_h2d",
        "device": args.device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        "copies": [],
        "disk": [],
        "errors": [],
    }

    def save() -> None:
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=2))

    try:
        if args.device.startswith("cuda"):
            started = time.perf_counter()
            torch.zeros(1, device=args.device)
            torch.cuda.synchronize()
            result["cuda_init_s"] = round(time.perf_counter() - started, 2)
        log(f"device {args.device} {result['gpu'] or ''} torch {torch.__version__}")
        _copies(args, result, deadline=deadline, save=save)
        _disk(args, result, deadline=deadline, save=save)
    except Exception as exc:
        traceback.print_exc()
        result["errors"].append(f"{type(exc).__name__}: {exc}")
    save()
    sys.exit(1 if result["errors"] else 0)


if __name__ == "__main__":
    main()
