"""The measured sections of peft_switch.py, each a function of the bench and the adapters.

Owns what each section times and records (``result`` keys and the log line): a forward
of the plain model, the first load (``PeftModel.from_pretrained``), ``load_adapter``
from disk per rank, ``set_adapter`` between loaded adapters, a forward per rank
against the adapters disabled, the first forward after a switch, and a cold swap.
Each runs inside ``Bench.section``, which keeps a failure in the result. Building the
model and the adapters is ``peft_setup``'s; the order of the sections peft_switch.py's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.gpu.peft_setup import Bench, evict, log


@dataclass(frozen=True, kw_only=True)
class Adapters:
    """The saved adapters: their names (by rank, then index), ranks and folders."""

    names: list[str]
    rank_of: dict[str, int]
    ranks: list[int]
    paths: dict[str, Path]


def forward_fn(model: Any, input_ids: Any) -> Callable[[], Any]:
    """One forward of ``input_ids`` (batch 1), the logits of the last token only when
    the model can keep just those."""

    def fwd() -> Any:
        with torch.inference_mode():
            try:
                return model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
            except TypeError:
                return model(input_ids=input_ids, use_cache=False)

    return fwd


def plain_forward(bench: Bench, fwd: Callable[[], Any]) -> None:
    """The base model's forward before any PEFT wrapping."""
    args, result = bench.args, bench.result
    for _ in range(args.warmup):
        fwd()
    times = [bench.timed(fwd) for _ in range(args.reps)]
    result["forward_plain_ms"] = statistics.median(times)
    log(
        f"forward, plain model (batch 1, {args.tokens} tokens): {result['forward_plain_ms']:.2f} ms"
    )


def first_load(bench: Bench, base: Any, adapters: Adapters) -> Any:
    """``PeftModel.from_pretrained`` of the first adapter (it wraps the model): the
    wrapped model, in eval mode."""
    from peft import PeftModel

    first = adapters.names[0]
    evict(adapters.paths[first])
    holder: dict[str, Any] = {}

    def load() -> None:
        holder["model"] = PeftModel.from_pretrained(
            base, str(adapters.paths[first]), adapter_name=first
        ).eval()

    bench.result["from_pretrained_first_ms"] = bench.timed(load)
    log(f"PeftModel.from_pretrained ({first}): {bench.result['from_pretrained_first_ms']:.1f} ms")
    return holder["model"]


def load_adapters(bench: Bench, model: Any, adapters: Adapters) -> None:
    """``load_adapter`` from disk (page cache evicted), each adapter deleted first."""
    paths, rank_of = adapters.paths, adapters.rank_of
    per_rank: dict[int, list[float]] = {r: [] for r in adapters.ranks}
    first_time: dict[int, float] = {}
    for _rep in range(bench.args.load_reps):
        for name in adapters.names:
            if time.monotonic() > bench.deadline:
                raise TimeoutError("time cap inside load_adapter reps")
            if name in model.peft_config:
                others = [n for n in model.peft_config if n != name]
                if not others:
                    continue  # the only one loaded (from_pretrained): next round
                if model.active_adapter == name:
                    model.set_adapter(others[0])
                model.delete_adapter(name)
            evict(paths[name])
            ms = bench.timed(partial(model.load_adapter, str(paths[name]), adapter_name=name))
            per_rank[rank_of[name]].append(ms)
            first_time.setdefault(rank_of[name], ms)
    model.eval()
    bench.result["load_adapter_ms"] = {
        str(r): {"median": statistics.median(v), "min": min(v), "first": first_time[r], "n": len(v)}
        for r, v in per_rank.items()
        if v
    }
    for r, got in bench.result["load_adapter_ms"].items():
        log(
            f"load_adapter r{r}: median {got['median']:.1f} ms (min {got['min']:.1f}, "
            f"first {got['first']:.1f}, n={got['n']})"
        )


def switches(bench: Bench, model: Any, adapters: Adapters) -> None:
    """``set_adapter`` between adapters already loaded."""
    order = [n for _ in range(bench.args.switch_reps) for n in adapters.names]
    times = [bench.timed(partial(model.set_adapter, name)) for name in order]
    bench.result["set_adapter_ms"] = got = {
        "median": statistics.median(times),
        "p90": sorted(times)[int(0.9 * len(times))],
        "max": max(times),
        "n": len(times),
        "adapters_loaded": len(model.peft_config),
    }
    log(
        f"set_adapter ({got['adapters_loaded']} loaded): median {got['median'] * 1e3:.0f} "
        f"us, p90 {got['p90'] * 1e3:.0f} us, max {got['max'] * 1e3:.0f} us"
    )


def forwards(bench: Bench, model: Any, adapters: Adapters, fwd: Callable[[], Any]) -> None:
    """A forward with the adapters disabled and with each rank; and whether an adapter
    changes the logits."""
    args, ranks = bench.args, adapters.ranks
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
    bench.result["forward_ms"] = out
    with model.disable_adapter():
        plain_logits = fwd().logits.float()
    model.set_adapter(f"r{ranks[-1]}_0")
    lora_logits = fwd().logits.float()
    bench.result["adapter_changes_output"] = bool(
        (plain_logits - lora_logits).abs().max().item() > 0
    )
    base_ms = out["disabled"]
    log(
        f"forward (batch 1, {args.tokens} tokens): adapters disabled {base_ms:.2f} ms; "
        + ", ".join(f"r{r} {out[f'r{r}']:.2f} ms (+{out[f'r{r}'] - base_ms:.2f})" for r in ranks)
    )


def first_after_switch(
    bench: Bench, model: Any, adapters: Adapters, fwd: Callable[[], Any]
) -> None:
    """The first forward after a switch against the steady state on the same adapter."""
    first: list[float] = []
    steady: list[float] = []
    switch_and_first: list[float] = []
    current = model.active_adapter
    order = [n for _ in range(bench.args.switch_reps) for n in adapters.names]
    for name in order:
        if name == current:
            continue
        started = time.perf_counter()
        bench.sync()
        model.set_adapter(name)
        first.append(bench.timed(fwd))
        switch_and_first.append((time.perf_counter() - started) * 1000.0)
        steady.extend(bench.timed(fwd) for _ in range(bench.args.steady_reps))
        current = name
    bench.result["switch_then_forward_ms"] = got = {
        "first_forward_median": statistics.median(first),
        "steady_forward_median": statistics.median(steady),
        "switch_plus_first_median": statistics.median(switch_and_first),
        "first_minus_steady_median": statistics.median(first) - statistics.median(steady),
        "switches": len(first),
    }
    log(
        f"after a switch: first forward {got['first_forward_median']:.2f} ms, steady "
        f"{got['steady_forward_median']:.2f} ms (switch+first "
        f"{got['switch_plus_first_median']:.2f} ms, {got['switches']} switches)"
    )


def cold_swap(bench: Bench, model: Any, adapters: Adapters, fwd: Callable[[], Any]) -> None:
    """The cost of a cold swap: delete the active adapter's weights, load another from
    disk, make it active and serve one forward (what a pod without a free slot does
    before the first request of an adapter it does not hold)."""
    names, paths = adapters.names, adapters.paths
    times = []
    victims = [n for n in names if n != names[0]]
    for name in victims * max(1, bench.args.load_reps // 2):
        if time.monotonic() > bench.deadline:
            break
        model.set_adapter(names[0])
        model.delete_adapter(name)
        evict(paths[name])

        def swap(n: str = name) -> None:
            model.load_adapter(str(paths[n]), adapter_name=n)
            model.set_adapter(n)
            fwd()

        times.append((adapters.rank_of[name], bench.timed(swap)))
    bench.result["cold_swap_then_forward_ms"] = swapped = {
        str(r): statistics.median(t for rr, t in times if rr == r)
        for r in adapters.ranks
        if any(rr == r for rr, _ in times)
    }
    log(
        "cold swap (delete, load from disk, set, forward): "
        + ", ".join(f"r{r} {v:.1f} ms" for r, v in swapped.items())
    )
