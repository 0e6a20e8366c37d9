"""A pod's /metrics text read as the router reads it: values that say nothing (NaN,
infinities) are missing, counts are whole and never negative, shares within 0..1; a line
the parser refuses is left out by the router's reading (unless it is one of a metric the
router reads), where the strict reading refuses the page; a long line is quoted cut; a
page past the cap is read from the metric families whole in its head, if they hold what
the router reads."""

from __future__ import annotations

import pytest

from placement.adapters.metrics_text import (
    ReadMetrics,
    parse_sglang_metrics,
    parse_vllm_metrics,
    read_sglang_head,
    read_sglang_metrics,
    read_vllm_head,
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


# --- long lines, quoted cut ------------------------------------------------------------

LONG_NAME = "vllm:e2e_" + "x" * 1_000_000


@pytest.mark.parametrize(
    "reading", [parse_vllm_metrics, read_vllm_metrics], ids=["strict", "router"]
)
def test_a_megabyte_line_of_a_metric_the_router_reads_is_named_in_a_short_message(
    reading: object,
) -> None:
    line = "vllm:num_requests_running" + "x" * 1_000_000 + '{e="0" 2'
    with pytest.raises(PermanentEngineError) as raised:
        reading(GOOD + line + "\n", pod="pod-0")  # type: ignore[operator]
    said = str(raised.value)
    assert len(said) < 1000
    assert "... (1000033 characters in all)" in said


def test_a_megabyte_line_left_out_is_quoted_and_named_cut_with_a_marker() -> None:
    read = read_vllm_metrics(GOOD + LONG_NAME + '{le="0.1" 7\n', pod="pod-0")
    (skipped,) = read.skipped
    assert skipped.metric == LONG_NAME[:120] + "... (1000009 characters in all)"
    assert skipped.text == (LONG_NAME + '{le="0.1" 7')[:120] + "... (1000020 characters in all)"
    assert len(str(skipped)) < 500


# --- a page past the cap, read from its head -----------------------------------------

LORA_INFO = (
    "# TYPE vllm:lora_requests_info gauge\n"
    'vllm:lora_requests_info{max_lora="4",running_lora_adapters="old"} 1.0\n'
    'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a"} 2.0\n'
)
HEAD = GOOD + "vllm:num_requests_waiting 4\n" + LORA_INFO


@pytest.mark.parametrize(
    ("head", "whole"),
    [
        (HEAD + "# TYPE vllm:e2e histogram\nvllm:e2e_bucket{le=", True),
        (HEAD + "# TYPE vllm:e2e histogram\n", True),
        (HEAD, False),  # the cut may fall between two lora series: more may follow
        (HEAD + 'vllm:lora_requests_info{max_lora="4",running_lora_adap', False),
        (LORA_INFO + GOOD, False),  # the KV gauge's family is the last in the head
        (GOOD + LORA_INFO + "# TYPE vllm:e2e histogram\n", False),  # no waiting gauge
    ],
    ids=["cut-mid-line", "cut-after-a-line", "cut-in-lora", "cut-mid-lora", "kv-last", "no-wait"],
)
def test_a_cut_page_is_read_from_its_whole_families_when_they_hold_what_the_router_reads(
    head: str, whole: bool
) -> None:
    read = read_vllm_head(head, pod="pod-0")
    if not whole:
        assert read is None
        return
    assert read is not None
    metrics = read.metrics
    assert (metrics.running, metrics.waiting, metrics.kv_usage) == (2, 4, 0.5)
    assert (metrics.running_adapters, metrics.max_loras) == (frozenset({"a"}), 4)


def test_a_cut_sglang_page_is_read_from_its_head_when_every_gauge_it_reads_is_whole() -> None:
    page = (
        "sglang:num_running_reqs 1\nsglang:num_queue_reqs 2\nsglang:token_usage 0.5\n"
        "sglang:lora_pool_slots_used 1\nsglang:lora_pool_slots_total 4\n"
    )
    read = read_sglang_head(page + 'sglang:e2e_bucket{le="1"} 1\nsglang:e2e_bu', pod="pod-0")
    assert read is not None
    assert (read.metrics.running, read.metrics.lora_slots_total) == (1, 4)
    # The last whole line's family may go on past the cut (the cut line's name may be cut).
    assert read_sglang_head(page + "sglang:e2e_bu", pod="pod-0") is None
