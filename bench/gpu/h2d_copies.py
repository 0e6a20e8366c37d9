"""Host-to-GPU copies of one adapter's LoRA weights, pageable and pinned, for lora_h2d.py.

Owns the adapter's tensors by model shape and rank (q_proj and v_proj, every layer,
fp16), the timer (CUDA events on a GPU, perf_counter on the host) and ``bench_copy``:
per-tensor and one-buffer copies into preallocated GPU tensors, as an engine fills its
LoRA slots. It reads no file (``h2d_disk``) and prints nothing (``lora_h2d``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


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
    """One row: the adapter's copies, per tensor and as one buffer, pageable and (on a
    GPU) pinned, each with its median time and GB/s.

    Long (about 70 lines) on purpose: the copy closures hold the host and GPU tensors,
    and all of them must be dropped in one place before ``empty_cache`` so that the
    next rank starts with the memory free; split up, the references would be spread
    over frames."""
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
    # (with torch installed the Nones need the ignore; without it torch is Any here)
    pinned = flat_pageable = flat_pinned = flat_slot = None  # type: ignore[assignment, unused-ignore]
    if cuda:
        torch.cuda.empty_cache()
    return row
