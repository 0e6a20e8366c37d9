"""Parse a pod's Prometheus ``/metrics`` text into ``PodMetrics``.

Pure: text in, values out. vLLM's ``lora_requests_info`` keeps one series per label
set it ever exposed, each valued with the time it was last set, so the current one is
the series with the largest value (POD-API.md). vLLM's KV share is
``vllm:kv_cache_usage_perc``, ``vllm:gpu_cache_usage_perc`` before vllm-project/vllm#18354:
either is read, the current name first.

SGLang has no per-adapter series. ``sglang:lora_pool_slots_used`` counts the distinct
adapters in the running batch, not the adapters resident on the GPU: it is activity,
never residency (residency comes from the router's ledger, ``placement.residency``).

A sample valued ``NaN`` or infinite says nothing: it is left out, as if the pod had not
exposed it (a pod once answered ``vllm:num_requests_running NaN``, and ``round(NaN)``
raised). Counts below zero read as zero and the KV share is kept within 0..1. Text the
parser refuses is a ``PermanentEngineError`` naming the first line it refuses.
"""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

from placement.domain import AdapterId
from placement.errors import PermanentEngineError
from placement.ports import PodMetrics

_Samples = dict[str, list[tuple[dict[str, str], float]]]


def _samples(text: str, *, pod: str | None) -> _Samples:
    by_name: _Samples = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                value = float(sample.value)
                if math.isfinite(value):  # NaN and infinities say nothing: left out
                    by_name[sample.name].append((dict(sample.labels), value))
    except ValueError as exc:
        raise PermanentEngineError(
            f"unreadable /metrics text{_first_bad_line(text)}: {str(exc)[:300]}", pod=pod
        ) from None
    return by_name


def _first_bad_line(text: str) -> str:
    """Where the text stops parsing: `` at line N (...)`` for the first sample line the
    parser refuses alone, else nothing (the fault is in how lines go together)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            for family in text_string_to_metric_families(line + "\n"):
                for sample in family.samples:
                    float(sample.value)
        except ValueError:
            return f" at line {number} ({line[:120]!r})"
    return ""


def _total(samples: _Samples, name: str) -> float:
    return sum(value for _, value in samples.get(name, []))


def _count(samples: _Samples, name: str) -> int:
    """A sum of gauges that count things (requests, slots): a whole number, never negative."""
    total = _total(samples, name)
    return max(0, round(total)) if math.isfinite(total) else 0


def _share(value: float) -> float:
    return min(1.0, max(0.0, value))


def _mean(samples: _Samples, name: str) -> float:
    values = [value for _, value in samples.get(name, [])]
    return sum(values) / len(values) if values else 0.0


def _first_mean(samples: _Samples, *names: str) -> float:
    """The mean of the first of ``names`` the text exposes (0.0 when none is)."""
    for name in names:
        if name in samples:
            return _mean(samples, name)
    return 0.0


def _whole_number(text: str | None) -> int | None:
    """``text`` as a whole number if it is ASCII digits (``isdigit`` alone takes "²",
    which ``int`` refuses), else None."""
    if text and text.isascii() and text.isdigit():
        return int(text)
    return None


def _names(joined: str) -> frozenset[AdapterId]:
    return frozenset(AdapterId(name) for name in joined.split(",") if name)


def parse_vllm_metrics(text: str, *, pod: str | None = None) -> PodMetrics:
    """Running and waiting requests summed over engines, KV use averaged over them."""
    samples = _samples(text, pod=pod)
    info = samples.get("vllm:lora_requests_info", [])
    latest = max(info, key=lambda series: series[1])[0] if info else {}
    return PodMetrics(
        running=_count(samples, "vllm:num_requests_running"),
        waiting=_count(samples, "vllm:num_requests_waiting"),
        kv_usage=_share(
            _first_mean(samples, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        ),
        running_adapters=_names(latest.get("running_lora_adapters", "")),
        waiting_adapters=_names(latest.get("waiting_lora_adapters", "")),
        max_loras=_whole_number(latest.get("max_lora")),
    )


def parse_sglang_metrics(text: str, *, pod: str | None = None) -> PodMetrics:
    """SGLang's gauges; the LoRA pool slots say how many adapters the running batch uses."""
    samples = _samples(text, pod=pod)
    slots = "sglang:lora_pool_slots_total" in samples
    used = _count(samples, "sglang:lora_pool_slots_used")
    total = _count(samples, "sglang:lora_pool_slots_total")
    return PodMetrics(
        running=_count(samples, "sglang:num_running_reqs"),
        waiting=_count(samples, "sglang:num_queue_reqs"),
        kv_usage=_share(_mean(samples, "sglang:token_usage")),
        lora_slots_used=used if slots else None,
        lora_slots_total=total if slots else None,
    )
