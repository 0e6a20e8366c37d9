"""The plan file watched and swapped, the request log, and cancelled clients."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from placement.emulator import Latency
from placement.inputs.request_log import load_request_log
from placement.plan import Plan, plan_to_json
from placement.router.reqlog import JsonLinesRequestLog, LogRow, ParquetRequestLog, RequestLogSink

from .conftest import catalog_of, emulated, plan_of, router_for


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_suffix(".tmp")
    staging.write_text(text)
    os.replace(staging, path)


def _plan(owner: str, plan_id: str) -> Plan:
    return plan_of({"alpha": [owner]}, plan_id=plan_id)


def test_the_plan_file_is_swapped_and_a_corrupt_or_missing_one_keeps_the_last_good(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plan.json"
    _write_atomically(path, plan_to_json(_plan("pod-0", "first")))
    with emulated(2) as pods:
        with router_for(pods.domain, plan=path, catalog=catalog_of(["alpha"])) as router:
            client = router.client()
            client.completions.create(model="alpha", prompt="p", max_tokens=1)
            _write_atomically(path, plan_to_json(_plan("pod-1", "second")))
            router.refresh_plan()
            assert router.get("/healthz")["plan"] == "second"
            client.completions.create(model="alpha", prompt="p", max_tokens=1)
            _write_atomically(path, "{ this is not a plan")
            router.refresh_plan()
            health = router.get("/healthz")
            assert health["plan_problem"] is not None
            assert health["plan"] == "second"
            client.completions.create(model="alpha", prompt="p", max_tokens=1)
            path.unlink()
            router.refresh_plan()
            health = router.get("/healthz")
            assert "no such file" in health["plan_problem"]
            assert health["plan"] == "second"
            client.completions.create(model="alpha", prompt="p", max_tokens=1)
        assert pods.fleet.pod("pod-0").counters["requests"] == 1
        assert pods.fleet.pod("pod-1").counters["requests"] == 3


def test_starting_without_a_plan_routes_by_hashing_and_says_so(tmp_path: Path) -> None:
    with emulated(2) as pods:
        missing = tmp_path / "absent.json"
        with router_for(pods.domain, plan=missing, catalog=catalog_of(["alpha"])) as router:
            health = router.get("/healthz")
            assert health["routing"] == "hashing"
            assert "no such file" in health["plan_problem"]
            answer = router.client().completions.create(model="alpha", prompt="p", max_tokens=1)
            assert answer.choices[0].text
            assert router.get("/v1/unplanned")["adapters"] == {"alpha": 1}


def test_every_request_lands_in_the_log_with_tenant_tokens_pod_and_outcome() -> None:
    with emulated(2) as pods:
        plan = plan_of({"alpha": ["pod-0"]})
        with router_for(pods.domain, plan=plan, catalog=catalog_of(["alpha"])) as router:
            client = router.client()
            client.completions.create(model="alpha", prompt="one two three", max_tokens=4)
            client.completions.create(
                model="alpha", prompt="x", max_tokens=2, extra_headers={"X-Tenant": "acme"}
            )
            client.chat.completions.create(
                model="alpha",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=3,
                user="globex",
            )
    # Leaving the block stopped the router, which flushed its log.
    first, second, third = sorted(router.log.rows, key=lambda row: row.ts_s)
    assert all(type(row) is LogRow for row in router.log.rows)  # one shape, from the proxy on
    assert [row.outcome for row in (first, second, third)] == ["cold_load", "gpu_hit", "gpu_hit"]
    assert [row.tenant for row in (first, second, third)] == [None, "acme", "globex"]
    assert {row.pod for row in (first, second, third)} == {"pod-0"}
    assert first.output_tokens == 4 and first.prompt_tokens == 3
    assert all(row.status == 200 and row.ttft_ms is not None for row in (first, second, third))


ROWS = [
    LogRow(1.7e9 + i, f"a{i % 2}", "t", 3, 4, "pod-0", "gpu_hit", 12.5, 200) for i in range(5)
] + [LogRow(1.7e9 + 3600.0, "a0", None, None, None, None, None, None, 503)]


@pytest.mark.parametrize(
    "make",
    [ParquetRequestLog, lambda d: JsonLinesRequestLog(d / "log.jsonl")],
    ids=["parquet", "jsonl"],
)
def test_log_files_read_back_through_the_forecasters_reader(
    tmp_path: Path, make: Callable[[Path], RequestLogSink]
) -> None:
    sink = make(tmp_path)
    sink.write(ROWS[:3])
    sink.write(ROWS[3:])
    sink.close()
    files = sorted(p for p in tmp_path.iterdir() if p.is_file())
    frames = [load_request_log(path).frame for path in files]
    assert sum(len(frame) for frame in frames) == len(ROWS)
    first = frames[0]
    assert list(first.columns[:8]) == [
        "ts",
        "adapter",
        "tenant",
        "prompt_tokens",
        "output_tokens",
        "pod",
        "outcome",
        "ttft_ms",
    ]
    assert str(first["ts"].dt.tz) == "UTC"
    if make is ParquetRequestLog:
        assert len(files) == 2  # rotated at the hour


def test_a_client_that_goes_away_cancels_the_upstream_request() -> None:
    slow = replace(Latency(), tpot_ms=50.0)
    catalog = catalog_of(["alpha"])
    with emulated(1, latency=slow) as pods, router_for(pods.domain, catalog=catalog) as router:
        body = {"model": "alpha", "prompt": "p", "max_tokens": 400, "stream": True}
        with (
            httpx.Client() as http,
            http.stream("POST", f"{router.url}/v1/completions", json=body, timeout=10) as reply,
        ):
            lines = reply.iter_lines()
            next(lines)
        # The pod's answer ends when the router drops the upstream request, not after
        # its 400 tokens (20 s): incomplete.
        [answer] = pods.answers.wait(1)
        assert not answer.complete
    assert [row.status for row in router.log.rows] == [499]
