"""Request logs into simulator columns: per request, pre-aggregated, and bad input."""

from __future__ import annotations

import pandas as pd
import pytest

from placement.domain import Adapter, AdapterId, Catalog
from placement.errors import InputError
from placement.inputs.request_log import request_log_from_frame
from placement.sim.workload import DEFAULT_OUTPUT_TOKENS, workload_from_log

CATALOG = Catalog(
    adapters=tuple(
        Adapter(
            name=AdapterId(name),
            base_model="llama-3.1-8b",
            rank=16,
            alpha=16,
            target_modules=("q_proj", "v_proj"),
            dtype="float16",
            source=f"s3://a/{name}",
            size_bytes=size,
        )
        for name, size in (("a", 10_000_000), ("b", 20_000_000))
    )
)
START = pd.Timestamp("2026-03-10T09:00:00Z")


def test_per_request_log_keeps_order_lengths_and_sizes() -> None:
    frame = pd.DataFrame(
        {
            "ts": [START + pd.Timedelta(seconds=s) for s in (5, 0, 2)],
            "adapter": ["b", "a", "a"],
            "prompt_tokens": [30, 10, 20],
        }
    )
    load = workload_from_log(request_log_from_frame(frame), CATALOG, bucket_s=600)
    assert load.arrival_s == [0.0, 2.0, 5.0]
    assert load.adapters == ["a", "a", "b"]
    assert load.prompt_tokens == [10, 20, 30]
    assert load.output_tokens == [DEFAULT_OUTPUT_TOKENS] * 3
    assert load.size_bytes == {"a": 10_000_000, "b": 20_000_000}


def test_aggregated_log_is_spread_over_each_bucket() -> None:
    frame = pd.DataFrame(
        {
            "ts": [START, START, START + pd.Timedelta(minutes=10)],
            "adapter": ["a", "b", "a"],
            "requests": [4, 1, 2],
        }
    )
    load = workload_from_log(request_log_from_frame(frame), CATALOG, bucket_s=600)
    assert len(load) == 7
    assert load.adapters.count("a") == 6
    assert all(0.0 <= s < 1200.0 for s in load.arrival_s)
    assert load.arrival_s == sorted(load.arrival_s)


def test_adapters_missing_from_the_catalog_are_named() -> None:
    frame = pd.DataFrame({"ts": [START], "adapter": ["ghost"]})
    with pytest.raises(InputError, match="not in the catalog: ghost"):
        workload_from_log(request_log_from_frame(frame), CATALOG, bucket_s=600)


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        (None, []),
        (["e1", None, ""], [None, None, "e1"]),  # sorted: 0 s, 2 s, 5 s
    ],
    ids=["no-column", "some-requests-carry-one"],
)
def test_event_ids_follow_their_requests(
    ids: list[str | None] | None, expected: list[str | None]
) -> None:
    frame = pd.DataFrame(
        {"ts": [START + pd.Timedelta(seconds=s) for s in (5, 0, 2)], "adapter": ["b", "a", "a"]}
    )
    if ids is not None:
        frame["event_id"] = ids
    load = workload_from_log(request_log_from_frame(frame), CATALOG, bucket_s=600)
    assert load.event_ids == expected
