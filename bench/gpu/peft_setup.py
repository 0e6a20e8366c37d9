"""The PEFT bench's harness and what it measures on: for peft_switch.py.

Owns ``Bench`` (the time cap, the device synchronised around every timing, each
section's failure kept in the result rather than raised, the JSON saved after each
section), the randomly initialised Llama-like decoder (``build_model``: nothing is
downloaded), the random LoRA adapters saved with ``save_pretrained``
(``save_adapters``), and the page-cache eviction before a load from disk. The measured
sections are ``peft_sections``'; the order they run in is peft_switch.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

FULL = {"hidden": 2048, "layers": 16, "heads": 16, "kv_heads": 16, "inter": 5632, "vocab": 32000}
TINY = {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 4, "inter": 512, "vocab": 1000}


def log(*parts: Any) -> None:
    print("[peft]", *parts, flush=True)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = args.device
        self.cuda = self.device.startswith("cuda")
        self.deadline = time.monotonic() + args.time_cap
        self.result: dict[str, Any] = {"bench": "peft_switch", "errors": []}

    def save(self) -> None:
        if self.args.out is not None:
            self.args.out.write_text(json.dumps(self.result, indent=2, default=str))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def timed(self, fn: Callable[[], Any]) -> float:
        """Milliseconds of ``fn`` with the device synchronised before and after."""
        self.sync()
        started = time.perf_counter()
        fn()
        self.sync()
        return (time.perf_counter() - started) * 1000.0

    def section(self, name: str, fn: Callable[[], Any]) -> None:
        if time.monotonic() > self.deadline:
            self.result["errors"].append(f"time cap: skipped {name}")
            log(f"{name}: skipped (time cap)")
            return
        started = time.perf_counter()
        try:
            fn()
        except Exception as exc:
            traceback.print_exc()
            self.result["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
            log(f"{name}: FAILED {type(exc).__name__}: {exc}")
        self.result.setdefault("section_s", {})[name] = round(time.perf_counter() - started, 2)
        self.save()


def evict(folder: Path) -> None:
    """Best effort: drop the folder's files from the page cache (no root needed)."""
    for path in folder.rglob("*"):
        if path.is_file():
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            except (OSError, AttributeError):
                pass


def adapter_dir(root: Path) -> Path:
    """The folder save_pretrained put adapter_config.json in (a subfolder for a named one)."""
    found = sorted(root.rglob("adapter_config.json"))
    if not found:
        raise FileNotFoundError(f"no adapter_config.json under {root}")
    return found[0].parent


def build_model(bench: Bench) -> Any:
    """The random decoder on the device, in eval mode; the versions and its size go in
    the result."""
    import peft
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    args, result = bench.args, bench.result
    dims = TINY if args.tiny else FULL
    dtype = getattr(torch, args.dtype)
    result.update(
        {
            "device": bench.device,
            "gpu": torch.cuda.get_device_name(0) if bench.cuda else None,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "dims": dims,
            "dtype": args.dtype,
            "tokens": args.tokens,
        }
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=dims["hidden"],
        num_hidden_layers=dims["layers"],
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"],
        intermediate_size=dims["inter"],
        vocab_size=dims["vocab"],
        max_position_embeddings=4096,
    )
    started = time.perf_counter()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(bench.device):
            base = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    base = base.to(device=bench.device, dtype=dtype).eval()
    bench.sync()
    result["model_build_s"] = round(time.perf_counter() - started, 2)
    result["params_m"] = round(sum(p.numel() for p in base.parameters()) / 1e6, 1)
    log(
        f"model: {result['params_m']} M params, {args.dtype} on {bench.device}, "
        f"built in {result['model_build_s']} s"
    )
    return base


def save_adapters(
    bench: Bench,
    base: Any,
    *,
    names: list[str],
    rank_of: dict[str, int],
    ranks: list[int],
    tmp: Path,
) -> tuple[Any, dict[str, Path]]:
    """A random adapter of each name (A and B random: each changes the output), saved
    under ``tmp``; the base model again (LoRA layers removed) and each adapter's folder."""
    from peft import LoraConfig, get_peft_model

    result = bench.result
    paths: dict[str, Path] = {}
    started = time.perf_counter()
    sizes = {}
    for name in names:
        r = rank_of[name]
        cfg = LoraConfig(
            r=r,
            lora_alpha=2 * r,
            target_modules=["q_proj", "v_proj"],
            lora_dropout=0.0,
            bias="none",
            init_lora_weights=False,  # random A and B: the adapter changes the output
            task_type="CAUSAL_LM",
        )
        wrapped = get_peft_model(base, cfg, adapter_name=name)
        wrapped.save_pretrained(str(tmp / name))
        paths[name] = adapter_dir(tmp / name)
        sizes[name] = sum(p.stat().st_size for p in paths[name].iterdir() if p.is_file())
        base = wrapped.unload()  # the base model again, LoRA layers removed
    result["adapter_bytes"] = {str(rank_of[n]): sizes[n] for n in names}
    result["create_and_save_s"] = round(time.perf_counter() - started, 2)
    log(
        f"{len(names)} adapters saved in {result['create_and_save_s']} s: "
        + ", ".join(f"r{r}={sizes[f'r{r}_0'] / 1e6:.1f}MB" for r in ranks)
    )
    return base, paths
