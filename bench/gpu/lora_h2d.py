"""Host-to-GPU copy time of LoRA weights, by model shape and rank; disk to host.

For a 70B-like shape (hidden 8192, 80 layers, q_proj 8192->8192, v_proj 8192->1024
with GQA) and an 8B-like one (hidden 4096, 32 layers, v_proj 4096->1024), ranks
8..128, fp16: builds every layer's A (r x in) and B (out x r) for q_proj and v_proj
as pageable and as pinned CPU tensors, and copies them into preallocated GPU tensors
one by one (as an engine fills its LoRA slots) and as one concatenated buffer. Timed
with CUDA events after a warm-up; the median of several repetitions. Then the time to
read one adapter's safetensors file (from /dev/shm and from a file in the temp
directory, page cache warm and evicted) into host memory, pinned memory, and the GPU.

    python bench/gpu/lora_h2d.py --out h2d.json
    python bench/gpu/lora_h2d.py --device cpu --tiny     # smoke test without a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, int]] = {
    "70b": {"hidden": 8192, "layers": 80, "q_out": 8192, "v_out": 1024},
    "8b": {"hidden": 4096, "layers": 32, "q_out": 4096, "v_out": 1024},
}
TINY = {"tiny": {"hidden": 512, "layers": 4, "q_out": 512, "v_out": 128}}
RANKS = (8, 16, 32, 64, 128)


def log(*parts: Any) -> None:
    print("[h2d]", *parts, flush=True)


def lora_shapes(shape: dict[str, int], rank: int) -> list[tuple[str, tuple[int, int]]]:
    """(name, shape) of every LoRA tensor of an adapter on q_proj and v_proj."""
    hidden = shape["hidden"]
    out = []
    for layer in range(shape["layers"]):
        prefix = f"base_model.model.model.layers.{layer}.self_attn"
        out.append((f"{prefix}.q_proj.lora_A.weight", (rank, hidden)))
        out.append((f"{prefix}.q_proj.lora_B.weight", (shape["q_out"], rank)))
        out.append((f"{prefix}.v_proj.lora_A.weight", (rank, hidden)))
        out.append((f"{prefix}.v_proj.lora_B.weight", (shape["v_out"], rank)))
    return out


def make_tensors(specs: list[tuple[str, tuple[int, int]]]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for name, dims in specs:
        t = torch.empty(dims, dtype=torch.float16)
        t.uniform_(-0.01, 0.01, generator=gen)  # touches every page
        tensors[name] = t
    return tensors


class Timer:
    """Times a callable on the GPU with events, or on the host with perf_counter."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time_ms(self, fn: Callable[[], None], *, warmup: int, reps: int) -> dict[str, float]:
        for _ in range(warmup):
            fn()
        self.sync()
        event_ms, wall_ms = [], []
        for _ in range(reps):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                wall0 = time.perf_counter()
                start.record()
                fn()
                end.record()
                end.synchronize()
                wall_ms.append((time.perf_counter() - wall0) * 1000.0)
                event_ms.append(start.elapsed_time(end))
            else:
                wall0 = time.perf_counter()
                fn()
                wall_ms.append((time.perf_counter() - wall0) * 1000.0)
                event_ms.append(wall_ms[-1])
        return {
            "median_ms": statistics.median(event_ms),
            "min_ms": min(event_ms),
            "max_ms": max(event_ms),
            "wall_median_ms": statistics.median(wall_ms),
            "reps": reps,
        }


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms / 1000.0) / 1e9 if ms > 0 else float("nan")


def bench_copy(
    shape_name: str, shape: dict[str, int], rank: int, device: str, reps: int
) -> dict[str, Any]:
    timer = Timer(device)
    specs = lora_shapes(shape, rank)
    built = time.perf_counter()
    pageable = make_tensors(specs)
    nbytes = sum(t.numel() * t.element_size() for t in pageable.values())
    build_s = time.perf_counter() - built
    row: dict[str, Any] = {
        "shape": shape_name,
        "rank": rank,
        "tensors": len(pageable),
        "bytes": nbytes,
        "mb": round(nbytes / 1e6, 2),
        "build_s": round(build_s, 3),
    }
    cuda = device.startswith("cuda")
    pinned: dict[str, torch.Tensor] | None = None
    if cuda:
        started = time.perf_counter()
        pinned = {k: v.pin_memory() for k, v in pageable.items()}
        row["pin_per_tensor_ms"] = (time.perf_counter() - started) * 1000.0
    flat_pageable = torch.cat([t.reshape(-1) for t in pageable.values()])
    flat_pinned = None
    if cuda:
        started = time.perf_counter()
        flat_pinned = torch.empty_like(flat_pageable).pin_memory()
        flat_pinned.copy_(flat_pageable)
        row["pin_flat_ms"] = (time.perf_counter() - started) * 1000.0
    slots = {k: torch.empty(v.shape, dtype=v.dtype, device=device) for k, v in pageable.items()}
    flat_slot = torch.empty(flat_pageable.shape, dtype=flat_pageable.dtype, device=device)

    def per_tensor(src: dict[str, torch.Tensor]) -> Callable[[], None]:
        pairs = [(slots[k], src[k]) for k in src]

        def run() -> None:
            for dst, s in pairs:
                dst.copy_(s, non_blocking=True)

        return run

    def flat(src: torch.Tensor) -> Callable[[], None]:
        def run() -> None:
            flat_slot.copy_(src, non_blocking=True)

        return run

    cases: list[tuple[str, Callable[[], None]]] = [
        ("pageable_per_tensor", per_tensor(pageable)),
        ("pageable_flat", flat(flat_pageable)),
    ]
    if pinned is not None and flat_pinned is not None:
        cases += [("pinned_per_tensor", per_tensor(pinned)), ("pinned_flat", flat(flat_pinned))]
    for name, fn in cases:
        try:
            got = timer.time_ms(fn, warmup=2, reps=reps)
            got["gb_per_s"] = gbps(nbytes, got["median_ms"])
            row[name] = got
        except Exception as exc:
            row[name] = {"error": f"{type(exc).__name__}: {exc}"}
    # Check that the copy moved the right bytes (one tensor, cheap).
    key = next(iter(pageable))
    row["verified"] = bool(torch.equal(slots[key].cpu(), pageable[key]))
    # Free host and GPU memory before the next rank (the closures in cases hold them).
    cases.clear()
    pageable.clear()
    slots.clear()
    pinned = flat_pageable = flat_pinned = flat_slot = None  # type: ignore[assignment]
    if cuda:
        torch.cuda.empty_cache()
    return row


def _evict(path: Path) -> bool:
    """Best effort: drop the file's pages from the page cache (no root needed)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return True
    except (OSError, AttributeError):
        return False


def bench_disk(
    shape_name: str, shape: dict[str, int], rank: int, device: str, reps: int
) -> dict[str, Any]:
    from safetensors.torch import load_file, save_file

    cuda = device.startswith("cuda")
    tensors = make_tensors(lora_shapes(shape, rank))
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    out: dict[str, Any] = {"shape": shape_name, "rank": rank, "tensor_bytes": nbytes}
    places = []
    if Path("/dev/shm").is_dir():
        places.append(("shm", Path("/dev/shm")))
    places.append(("tmp", Path(tempfile.gettempdir())))
    for label, base in places:
        try:
            free = shutil.disk_usage(base).free
        except OSError:
            free = 0
        if free < 3 * nbytes:
            out[label] = {"skipped": f"{free / 1e6:.0f} MB free in {base}"}
            continue
        folder = Path(tempfile.mkdtemp(prefix="lora-h2d-", dir=base))
        path = folder / "adapter_model.safetensors"
        try:
            out[label] = _disk_cases(path, tensors, nbytes, cuda, reps, load_file, save_file)
            out[label]["dir"] = str(base)
        except Exception as exc:
            out[label] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return out


def _disk_cases(
    path: Path,
    tensors: dict[str, torch.Tensor],
    nbytes: int,
    cuda: bool,
    reps: int,
    load_file: Any,
    save_file: Any,
) -> dict[str, Any]:
    started = time.perf_counter()
    save_file(tensors, str(path))
    size = path.stat().st_size
    got: dict[str, Any] = {"file_bytes": size, "write_ms": (time.perf_counter() - started) * 1e3}
    pinned_buf = torch.empty(size, dtype=torch.uint8)
    if cuda:
        pinned_buf = pinned_buf.pin_memory()
    view = memoryview(pinned_buf.numpy())

    def read_into_buffer() -> None:
        with path.open("rb", buffering=0) as f:
            done = 0
            while done < size:
                n = f.readinto(view[done:])
                if not n:
                    break
                done += n

    def safetensors_cpu() -> None:
        loaded = load_file(str(path), device="cpu")
        for t in loaded.values():  # touch every page, in case the tensors are mmap-backed
            t.view(-1)[::2048].float().sum()

    def safetensors_cpu_then_pin() -> None:
        loaded = load_file(str(path), device="cpu")
        for t in loaded.values():
            t.pin_memory()

    def safetensors_cuda() -> None:
        load_file(str(path), device="cuda")
        torch.cuda.synchronize()

    def pinned_read_then_h2d() -> None:
        read_into_buffer()
        pinned_buf.to("cuda", non_blocking=True)
        torch.cuda.synchronize()

    cases: list[tuple[str, Callable[[], None]]] = [
        ("read_into_" + ("pinned" if cuda else "host") + "_buffer", read_into_buffer),
        ("safetensors_load_cpu", safetensors_cpu),
    ]
    if cuda:
        cases += [
            ("safetensors_load_cpu_then_pin", safetensors_cpu_then_pin),
            ("safetensors_load_cuda", safetensors_cuda),
            ("pinned_read_then_h2d", pinned_read_then_h2d),
        ]
    for name, fn in cases:
        for cache in ("warm", "evicted"):
            times = []
            try:
                fn()  # warm-up (and fills the page cache for the warm case)
                for _ in range(reps):
                    if cache == "evicted" and not _evict(path):
                        raise OSError("posix_fadvise unavailable")
                    started = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - started) * 1000.0)
                ms = statistics.median(times)
                got[f"{name}.{cache}"] = {"median_ms": ms, "gb_per_s": gbps(size, ms)}
            except Exception as exc:
                got[f"{name}.{cache}"] = {"error": f"{type(exc).__name__}: {exc}"}
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda or cpu (smoke test)")
    parser.add_argument("--tiny", action="store_true", help="small shapes (smoke test)")
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--disk-shape", default="70b")
    parser.add_argument("--disk-ranks", default="16,64")
    parser.add_argument("--time-cap", type=float, default=90.0, help="seconds; skip the rest")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    deadline = time.monotonic() + args.time_cap
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        log("no CUDA device: falling back to --device cpu")
        args.device = "cpu"
    shapes = TINY if args.tiny else SHAPES
    ranks = [int(r) for r in args.ranks.split(",") if r]
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
        log(
            f"{'shape':>5} {'rank':>4} {'MB':>8} {'pageable/t':>11} {'pageable/1':>11} "
            f"{'pinned/t':>9} {'pinned/1':>9}   (ms, GB/s in brackets)"
        )
        for shape_name, shape in shapes.items():
            for rank in ranks:
                if time.monotonic() > deadline:
                    result["errors"].append(f"time cap: skipped {shape_name} r{rank}")
                    continue
                try:
                    row = bench_copy(shape_name, shape, rank, args.device, args.reps)
                except Exception as exc:
                    traceback.print_exc()
                    row = {
                        "shape": shape_name,
                        "rank": rank,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                result["copies"].append(row)
                save()

                def cell(key: str, r: dict[str, Any] = row) -> str:
                    got = r.get(key)
                    if not isinstance(got, dict) or "median_ms" not in got:
                        return "-"
                    return f"{got['median_ms']:.2f}({got['gb_per_s']:.0f})"

                log(
                    f"{shape_name:>5} {rank:>4} {row.get('mb', 0):>8.1f} "
                    f"{cell('pageable_per_tensor'):>11} {cell('pageable_flat'):>11} "
                    f"{cell('pinned_per_tensor'):>9} {cell('pinned_flat'):>9}"
                    + (f"  ERROR {row['error']}" if "error" in row else "")
                )
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
    except Exception as exc:
        traceback.print_exc()
        result["errors"].append(f"{type(exc).__name__}: {exc}")
    save()
    sys.exit(1 if result["errors"] else 0)


if __name__ == "__main__":
    main()
