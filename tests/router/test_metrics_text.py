"""A pod's /metrics text read as the router reads it: values that say nothing (NaN,
infinities) are missing, counts are whole and never negative, shares within 0..1; a line
the parser refuses is left out by the router's reading (unless it is one of a metric the
router reads), where the strict reading refuses the page."""

from __future__ import annotations

import pytest

from placement.adapters.metrics_text import (
    ReadMetrics,
    parse_sglang_metrics,
    parse_vllm_metrics,
    read_sglang_metrics,
    read_vllm_metrics,
)
from placement.errors import PermanentEngineError


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


# --- the router's lenient reading ----------------------------------------------------

GOOD = 'vllm:num_requests_running{e="0"} 2\nvllm:kv_cache_usage_perc{e="0"} 0.5\n'


@pytest.mark.parametrize(
    ("bad", "kind", "metric"),
    [
        ('vllm:e2e_bucket{le="0.1" 3', "sample", "vllm:e2e_bucket"),
        ("<html>", "sample", "<html>"),
        ("# TYPE vllm:e2e", "metadata", "vllm:e2e"),
        ("# TYPE vllm:e2e bogus", "metadata", "vllm:e2e"),
        ("vllm:e2e_count 1_000", "sample", "vllm:e2e_count"),
    ],
    ids=["unclosed-labels", "html", "type-without-kind", "unknown-type", "underscored-value"],
)
def test_the_router_leaves_out_a_line_it_cannot_read_where_the_strict_reading_refuses_all(
    bad: str, kind: str, metric: str
) -> None:
    text = f"{GOOD}{bad}\r\nvllm:num_requests_waiting 4\n"
    with pytest.raises(PermanentEngineError, match=r"^pod-0: unreadable /metrics text"):
        parse_vllm_metrics(text, pod="pod-0")
    read = read_vllm_metrics(text, pod="pod-0")
    assert (read.metrics.running, read.metrics.waiting, read.metrics.kv_usage) == (2, 4, 0.5)
    (skipped,) = read.skipped
    assert (skipped.number, skipped.kind, skipped.metric) == (3, kind, metric)
    assert read_vllm_metrics(GOOD) == ReadMetrics(metrics=parse_vllm_metrics(GOOD))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (GOOD + 'vllm:num_requests_waiting{e="0" 4\n', "line 3 .*a line of vllm:num_requests"),
        ('sglang:num_running_reqs 1\nsglang:token_usage{x="y} 0.5\n', "line 2 .*sglang:token"),
    ],
    ids=["vllm-waiting", "sglang-kv"],
)
def test_the_router_refuses_a_page_whose_broken_line_is_one_it_reads(text: str, said: str) -> None:
    read = read_sglang_metrics if text.startswith("sglang") else read_vllm_metrics
    with pytest.raises(PermanentEngineError, match=f"^pod-0: unreadable /metrics text at {said}"):
        read(text, pod="pod-0")
