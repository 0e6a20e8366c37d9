"""A pod's /metrics text read as the router reads it: values that say nothing (NaN,
infinities) are missing, counts are whole and never negative, shares within 0..1."""

from __future__ import annotations

import pytest

from placement.adapters.metrics_text import parse_sglang_metrics, parse_vllm_metrics


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_a_sample_that_is_nan_or_infinite_reads_as_missing(value: str) -> None:
    text = (
        f'vllm:num_requests_running{{e="0"}} {value}\nvllm:num_requests_running{{e="1"}} 2\n'
        f"vllm:num_requests_waiting {value}\nvllm:kv_cache_usage_perc {value}\n"
    )
    metrics = parse_vllm_metrics(text, pod="pod-0")
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (2, 0, 0.0)
    sglang = parse_sglang_metrics(f"sglang:num_running_reqs {value}\nsglang:token_usage {value}\n")
    assert (sglang.running, sglang.kv_usage) == (0, 0.0)


def test_counts_below_zero_and_shares_beyond_one_are_kept_in_range() -> None:
    text = "vllm:num_requests_running -3\nvllm:kv_cache_usage_perc 7.5\n"
    text += 'vllm:lora_requests_info{max_lora="²",running_lora_adapters=""} 1\n'
    metrics = parse_vllm_metrics(text)
    assert (metrics.running, metrics.kv_usage, metrics.max_loras) == (0, 1.0, None)
