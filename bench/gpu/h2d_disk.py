"""Disk to host (and GPU) reads of one adapter's safetensors file, for lora_h2d.py.

Owns ``bench_disk``: the file written to /dev/shm and to the temp directory, then read
into a host buffer (pinned on a GPU machine), through safetensors onto the host and
the GPU, page cache warm and evicted. The tensors and the timing helpers are
``h2d_copies``'; this module prints nothing (``lora_h2d`` does).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.gpu.h2d_copies import gbps, lora_shapes, make_tensors


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
    """The file written once, then each way of reading it, page cache warm and evicted.

    Long (about 70 lines) because the five ways are closures over the one file and the
    one (pinned) buffer, listed where they are timed; the timing loop is the last
    dozen lines."""
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
