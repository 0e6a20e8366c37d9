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

    python bench/gpu/peft_switch.py --out peft.json
    python bench/gpu/peft_switch.py --device cpu --tiny     # smoke test without a GPU
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


def _evict(folder: Path) -> None:
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


def _adapter_dir(root: Path) -> Path:
    """The folder save_pretrained put adapter_config.json in (a subfolder for a named one)."""
    found = sorted(root.rglob("adapter_config.json"))
    if not found:
        raise FileNotFoundError(f"no adapter_config.json under {root}")
    return found[0].parent


def run(bench: Bench) -> None:
    args = bench.args
    result = bench.result
    import peft
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

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

    ranks = [int(r) for r in args.ranks.split(",") if r]
    names = [f"r{r}_{k}" for r in ranks for k in range(args.per_rank)]
    rank_of = {f"r{r}_{k}": r for r in ranks for k in range(args.per_rank)}
    tmp = Path(tempfile.mkdtemp(prefix="peft-switch-", dir=args.tmp_dir))
    paths: dict[str, Path] = {}
    try:
        # 1. Create and save the adapters.
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
            paths[name] = _adapter_dir(tmp / name)
            sizes[name] = sum(p.stat().st_size for p in paths[name].iterdir() if p.is_file())
            base = wrapped.unload()  # the base model again, LoRA layers removed
        result["adapter_bytes"] = {str(rank_of[n]): sizes[n] for n in names}
        result["create_and_save_s"] = round(time.perf_counter() - started, 2)
        log(
            f"{len(names)} adapters saved in {result['create_and_save_s']} s: "
            + ", ".join(f"r{r}={sizes[f'r{r}_0'] / 1e6:.1f}MB" for r in ranks)
        )

        input_ids = torch.randint(0, dims["vocab"], (1, args.tokens), device=bench.device)
        state: dict[str, Any] = {}

        def forward_fn(model: Any) -> Callable[[], Any]:
            def fwd() -> Any:
                with torch.inference_mode():
                    try:
                        return model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
                    except TypeError:
                        return model(input_ids=input_ids, use_cache=False)

            return fwd

        # 2. Base forward before any PEFT wrapping (the plain model).
        def plain_forward() -> None:
            fwd = forward_fn(base)
            for _ in range(args.warmup):
                fwd()
            times = [bench.timed(fwd) for _ in range(args.reps)]
            result["forward_plain_ms"] = statistics.median(times)
            log(
                f"forward, plain model (batch 1, {args.tokens} tokens): "
                f"{result['forward_plain_ms']:.2f} ms"
            )

        bench.section("forward_plain", plain_forward)

        # 3. Load: the first via PeftModel.from_pretrained (wraps the model), then the rest.
        def first_load() -> None:
            _evict(paths[names[0]])
            holder: dict[str, Any] = {}

            def load() -> None:
                holder["model"] = PeftModel.from_pretrained(
                    base, str(paths[names[0]]), adapter_name=names[0]
                ).eval()

            result["from_pretrained_first_ms"] = bench.timed(load)
            state["model"] = holder["model"]
            log(
                f"PeftModel.from_pretrained ({names[0]}): "
                f"{result['from_pretrained_first_ms']:.1f} ms"
            )

        bench.section("first_load", first_load)
        model = state.get("model")
        if model is None:
            return

        def loads() -> None:
            per_rank: dict[int, list[float]] = {r: [] for r in ranks}
            first_time: dict[int, float] = {}
            for _rep in range(args.load_reps):
                for name in names:
                    if time.monotonic() > bench.deadline:
                        raise TimeoutError("time cap inside load_adapter reps")
                    if name in model.peft_config:
                        others = [n for n in model.peft_config if n != name]
                        if not others:
                            continue  # the only one loaded (from_pretrained): next round
                        if model.active_adapter == name:
                            model.set_adapter(others[0])
                        model.delete_adapter(name)
                    _evict(paths[name])
                    ms = bench.timed(
                        lambda n=name: model.load_adapter(str(paths[n]), adapter_name=n)
                    )
                    per_rank[rank_of[name]].append(ms)
                    first_time.setdefault(rank_of[name], ms)
            model.eval()
            result["load_adapter_ms"] = {
                str(r): {
                    "median": statistics.median(v),
                    "min": min(v),
                    "first": first_time[r],
                    "n": len(v),
                }
                for r, v in per_rank.items()
                if v
            }
            for r, got in result["load_adapter_ms"].items():
                log(
                    f"load_adapter r{r}: median {got['median']:.1f} ms (min {got['min']:.1f}, "
                    f"first {got['first']:.1f}, n={got['n']})"
                )

        bench.section("load_adapter", loads)
        for name in names:  # whatever the load section managed, have every adapter loaded
            if name not in model.peft_config:
                model.load_adapter(str(paths[name]), adapter_name=name)
        model.eval()

        def switches() -> None:
            times = []
            order = [n for _ in range(args.switch_reps) for n in names]
            for name in order:
                times.append(bench.timed(lambda n=name: model.set_adapter(n)))
            result["set_adapter_ms"] = {
                "median": statistics.median(times),
                "p90": sorted(times)[int(0.9 * len(times))],
                "max": max(times),
                "n": len(times),
                "adapters_loaded": len(model.peft_config),
            }
            got = result["set_adapter_ms"]
            log(
                f"set_adapter ({got['adapters_loaded']} loaded): median {got['median'] * 1e3:.0f} "
                f"us, p90 {got['p90'] * 1e3:.0f} us, max {got['max'] * 1e3:.0f} us"
            )

        bench.section("set_adapter", switches)

        def forwards() -> None:
            fwd = forward_fn(model)
            out: dict[str, Any] = {}
            with model.disable_adapter():
                for _ in range(args.warmup):
                    fwd()
                out["disabled"] = statistics.median(bench.timed(fwd) for _ in range(args.reps))
            for r in ranks:
                model.set_adapter(f"r{r}_0")
                for _ in range(args.warmup):
                    fwd()
                out[f"r{r}"] = statistics.median(bench.timed(fwd) for _ in range(args.reps))
            result["forward_ms"] = out
            with model.disable_adapter():
                plain_logits = fwd().logits.float()
            model.set_adapter(f"r{ranks[-1]}_0")
            lora_logits = fwd().logits.float()
            result["adapter_changes_output"] = bool(
                (plain_logits - lora_logits).abs().max().item() > 0
            )
            base_ms = out["disabled"]
            log(
                f"forward (batch 1, {args.tokens} tokens): adapters disabled {base_ms:.2f} ms; "
                + ", ".join(
                    f"r{r} {out[f'r{r}']:.2f} ms (+{out[f'r{r}'] - base_ms:.2f})" for r in ranks
                )
            )

        bench.section("forward", forwards)

        def first_after_switch() -> None:
            fwd = forward_fn(model)
            first, steady, switch_and_first = [], [], []
            current = model.active_adapter
            order = [n for _ in range(args.switch_reps) for n in names]
            for name in order:
                if name == current:
                    continue
                started = time.perf_counter()
                bench.sync()
                model.set_adapter(name)
                first.append(bench.timed(fwd))
                switch_and_first.append((time.perf_counter() - started) * 1000.0)
                steady.extend(bench.timed(fwd) for _ in range(args.steady_reps))
                current = name
            result["switch_then_forward_ms"] = {
                "first_forward_median": statistics.median(first),
                "steady_forward_median": statistics.median(steady),
                "switch_plus_first_median": statistics.median(switch_and_first),
                "first_minus_steady_median": statistics.median(first) - statistics.median(steady),
                "switches": len(first),
            }
            got = result["switch_then_forward_ms"]
            log(
                f"after a switch: first forward {got['first_forward_median']:.2f} ms, steady "
                f"{got['steady_forward_median']:.2f} ms (switch+first "
                f"{got['switch_plus_first_median']:.2f} ms, {got['switches']} switches)"
            )

        bench.section("first_after_switch", first_after_switch)

        def reload_cycle() -> None:
            # The cost of a cold swap: delete the active adapter's weights, load another
            # from disk, make it active and serve one forward (what a pod without a free
            # slot does before the first request of an adapter it does not hold).
            fwd = forward_fn(model)
            times = []
            victims = [n for n in names if n != names[0]]
            for name in victims * max(1, args.load_reps // 2):
                if time.monotonic() > bench.deadline:
                    break
                model.set_adapter(names[0])
                model.delete_adapter(name)
                _evict(paths[name])

                def swap(n: str = name) -> None:
                    model.load_adapter(str(paths[n]), adapter_name=n)
                    model.set_adapter(n)
                    fwd()

                times.append((rank_of[name], bench.timed(swap)))
            result["cold_swap_then_forward_ms"] = {
                str(r): statistics.median(t for rr, t in times if rr == r)
                for r in ranks
                if any(rr == r for rr, _ in times)
            }
            log(
                "cold swap (delete, load from disk, set, forward): "
                + ", ".join(
                    f"r{r} {v:.1f} ms" for r, v in result["cold_swap_then_forward_ms"].items()
                )
            )

        bench.section("cold_swap", reload_cycle)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
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
    args = parser.parse_args()
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
