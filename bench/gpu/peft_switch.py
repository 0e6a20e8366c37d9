"""What loading and switching LoRA adapters costs on a real GPU, with PEFT.

Builds a randomly initialised Llama-like decoder with transformers (nothing is
downloaded: hidden 2048, 16 layers, 16 heads, intermediate 5632, vocab 32000, bf16),
creates N random LoRA adapters with peft (ranks 8, 16 and 64 on q_proj and v_proj,
B not zero so that they change the output) and saves them with save_pretrained to a
temporary directory. Then measures, with torch.cuda.synchronize around every timing
and the median over repetitions:

- load_adapter from disk, per rank (the files' page cache evicted first, best effort),
- set_adapter between adapters already loaded,
- one forward step (batch 1, 128 tokens) with the adapters disabled and with each rank,
- the first forward after a switch against the steady state on the same adapter.

The harness, the model and the adapters are ``peft_setup``'s, the sections
``peft_sections``'; this script runs them in order within its time cap.

    python bench/gpu/peft_switch.py --out peft.json
    python bench/gpu/peft_switch.py --device cpu --tiny     # smoke test without a GPU
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

if not __package__:  # run as a file: the repository root on the path, for bench.gpu
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.gpu.peft_sections import (
    Adapters,
    cold_swap,
    first_after_switch,
    first_load,
    forward_fn,
    forwards,
    load_adapters,
    plain_forward,
    switches,
)
from bench.gpu.peft_setup import FULL, TINY, Bench, build_model, save_adapters


def run(bench: Bench) -> None:
    """Build the model and the adapters, then run the sections in order; a section
    that fails is recorded and the next runs, except that nothing runs on the PEFT
    model when the first load failed."""
    args = bench.args
    base = build_model(bench)
    ranks = [int(r) for r in args.ranks.split(",") if r]
    names = [f"r{r}_{k}" for r in ranks for k in range(args.per_rank)]
    rank_of = {f"r{r}_{k}": r for r in ranks for k in range(args.per_rank)}
    tmp = Path(tempfile.mkdtemp(prefix="peft-switch-", dir=args.tmp_dir))
    try:
        base, paths = save_adapters(bench, base, names=names, rank_of=rank_of, ranks=ranks, tmp=tmp)
        adapters = Adapters(names=names, rank_of=rank_of, ranks=ranks, paths=paths)
        vocab = (TINY if args.tiny else FULL)["vocab"]
        input_ids = torch.randint(0, vocab, (1, args.tokens), device=bench.device)
        _sections(bench, base, adapters, input_ids)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sections(bench: Bench, base: Any, adapters: Adapters, input_ids: Any) -> None:
    bench.section("forward_plain", lambda: plain_forward(bench, forward_fn(base, input_ids)))
    state: dict[str, Any] = {}
    bench.section("first_load", lambda: state.update(model=first_load(bench, base, adapters)))
    model = state.get("model")
    if model is None:
        return
    bench.section("load_adapter", lambda: load_adapters(bench, model, adapters))
    for name in adapters.names:  # whatever the load section managed, have every adapter loaded
        if name not in model.peft_config:
            model.load_adapter(str(adapters.paths[name]), adapter_name=name)
    model.eval()
    fwd = forward_fn(model, input_ids)
    bench.section("set_adapter", lambda: switches(bench, model, adapters))
    bench.section("forward", lambda: forwards(bench, model, adapters, fwd))
    bench.section("first_after_switch", lambda: first_after_switch(bench, model, adapters, fwd))
    bench.section("cold_swap", lambda: cold_swap(bench, model, adapters, fwd))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda or cpu (smoke test)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
    parser.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--ranks", default="8,16,64")
    parser.add_argument("--per-rank", type=int, default=2, help="adapters of each rank")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--load-reps", type=int, default=3)
    parser.add_argument("--switch-reps", type=int, default=10)
    parser.add_argument("--steady-reps", type=int, default=3)
    parser.add_argument("--tmp-dir", default=None, help="where the adapters are saved")
    parser.add_argument("--time-cap", type=float, default=150.0, help="seconds; skip the rest")
    parser.add_argument("--out", type=Path)
    return parser.parse_args()


def main() -> None:
    args = _arguments()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("[peft] no CUDA device: falling back to --device cpu", flush=True)
        args.device = "cpu"
    if args.dtype is None:
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    bench = Bench(args)
    try:
        run(bench)
    except Exception as exc:
        traceback.print_exc()
        bench.result["errors"].append(f"{type(exc).__name__}: {exc}")
    bench.save()
    sys.exit(1 if bench.result["errors"] else 0)


if __name__ == "__main__":
    main()
