"""A login's preloads against the idle times the live controller now knows: at the wire.

The webhook takes a signed login; the controller decides from its ledger and the
router's request log (a JSON-lines file written by the router's own writer), and runs
the loads on an emulated vLLM pod. An adapter the log shows used a moment ago is not
displaced; one idle for an hour is.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from placement.adapters.kube_memory import MemoryPlanStore, MemoryStateStore
from placement.adapters.request_log_files import JsonLinesRequestLog, LogRow, ParquetRequestLog
from placement.controller.live_ports import EngineActuator, SeasonalForecaster
from placement.controller.ports import ControllerPorts, idle_times
from placement.controller.recent_use import LastUse, RouterLogUse, latest_uses
from placement.controller.ticks import Controller
from placement.controller.webhook import create_webhook_app
from placement.controller.webhook_gate import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from placement.controller.wiring import ControllerEvents
from placement.domain import AdapterId, Pipelines, TenantId
from placement.emulator import ZERO_LATENCY, EmulatedFleet, PodConfig
from placement.forecast.event_preloads import pipeline_predictor
from placement.inputs.request_log import RequestLog, request_log_from_frame
from placement.settings import ControllerSettings, ExecutorSettings, Settings
from tests import factories
from tests.factories import T0, FakeClock

pytestmark = pytest.mark.anyio

SECRET = b"a-webhook-secret-of-at-least-32-bytes"
SETTINGS = Settings(
    executor=ExecutorSettings(per_action_deadline_s=5.0, max_attempts=2, backoff_base_s=0.0),
    controller=ControllerSettings(max_loads_per_event=4),
)
#: How long one read of the router's log serves the events after it (the default).
REFRESH_S = SETTINGS.controller.recent_use_refresh_s
CATALOG = factories.catalog(
    *(
        factories.adapter(
            name,
            base="base-model",
            rank=8,
            size_bytes=1_000_000,
            tenant=tenant,
            target_modules=("q_proj",),
            source=f"s3://adapters/{name}",
        )
        for name, tenant in (("beta-a", "beta"), ("beta-b", "beta"), ("acme-chat", "acme"))
    )
)
LOGINS = Pipelines(
    logins=MappingProxyType(
        {
            TenantId("beta"): (AdapterId("beta-a"), AdapterId("beta-b")),
            TenantId("acme"): (AdapterId("acme-chat"),),
        }
    )
)


@pytest.fixture
def emulated() -> EmulatedFleet:
    return EmulatedFleet.start(
        1, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    )


async def _no_sleep(_: float) -> None:
    return None


@pytest.fixture
async def rig(
    emulated: EmulatedFleet, tmp_path: Path
) -> AsyncIterator[tuple[Controller, httpx.AsyncClient, FakeClock, JsonLinesRequestLog]]:
    clock = FakeClock(T0.replace(hour=9).timestamp())
    router_log = JsonLinesRequestLog(tmp_path / "router-requests.jsonl")
    empty = request_log_from_frame(pd.DataFrame({"ts": [], "adapter": []}), source="none")
    async with emulated.http() as pods:
        ports = ControllerPorts(
            catalog=CATALOG,
            fleet=emulated.domain(pool="llama"),
            history=lambda: empty,
            forecaster=SeasonalForecaster(bucket_s=SETTINGS.forecast.bucket_s, days=1),
            planner=lambda *_, **__: None,  # type: ignore[arg-type]  # no plan tick runs here
            actuator=EngineActuator(
                catalog=CATALOG, http=pods, settings=SETTINGS, rng=random.Random(0), sleep=_no_sleep
            ),
            plans=MemoryPlanStore(),
            state=MemoryStateStore(),
            predictor=pipeline_predictor(LOGINS, CATALOG),
            recent_use=RouterLogUse(router_log.path, refresh_s=REFRESH_S, clock=clock),
        )
        controller = Controller(ports, settings=SETTINGS, clock=clock)
        app = create_webhook_app(
            ControllerEvents(controller, triggers=frozenset()),
            secret=SECRET,
            settings=SETTINGS.controller,
            clock=clock,
            registry=CollectorRegistry(),
        )
        transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 4000))
        async with httpx.AsyncClient(transport=transport, base_url="http://controller") as http:
            yield controller, http, clock, router_log
    router_log.close()


async def login(
    controller: Controller, http: httpx.AsyncClient, clock: FakeClock, tenant: str
) -> dict[str, Any]:
    body = json.dumps({"type": "login", "tenant": tenant, "id": f"login-{clock()}"}).encode()
    timestamp = str(int(clock()))
    headers = {
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(SECRET, timestamp=timestamp, body=body),
        "content-type": "application/json",
    }
    answer = await http.post("/v1/events", content=body, headers=headers)
    assert answer.status_code == 202, answer.text
    await asyncio.gather(*controller._background)  # the preloads, run on the pod
    decision: dict[str, Any] = answer.json()
    return decision


def served(at_s: float, adapter: str) -> LogRow:
    return LogRow(
        ts_s=at_s,
        adapter=adapter,
        tenant="beta",
        prompt_tokens=20,
        output_tokens=10,
        pod="pod-0",
        outcome="gpu_hit",
        ttft_ms=12.0,
        status=200,
    )


@pytest.mark.parametrize(
    ("after_s", "beta_a_used_ago_s", "displaced"),
    [(3600.0, 1.0, False), (3600.0, 3000.0, True), (1.0, None, False)],
    ids=["used-a-moment-ago-stays", "idle-for-long-is-displaced", "warmed-a-moment-ago-stays"],
)
async def test_a_login_displaces_a_long_idle_adapter_but_not_one_in_use(
    rig: tuple[Controller, httpx.AsyncClient, FakeClock, JsonLinesRequestLog],
    emulated: EmulatedFleet,
    after_s: float,
    beta_a_used_ago_s: float | None,
    displaced: bool,
) -> None:
    controller, http, clock, router_log = rig
    # beta logs in: both its adapters land on the pod's two slots, beta-a first (the
    # least recently used: the one a third adapter would push off)
    first = await login(controller, http, clock, "beta")
    assert [(p["kind"], p["adapter"]) for p in first["preloads"]] == [
        ("load", "beta-a"),
        ("warmup", "beta-a"),
        ("load", "beta-b"),
        ("warmup", "beta-b"),
    ]
    clock.advance(after_s)
    if beta_a_used_ago_s is not None:  # the router served beta-a on pod-0 that long ago
        router_log.write([served(clock() - beta_a_used_ago_s, "beta-a")])
    decision = await login(controller, http, clock, "acme")
    on_gpu = emulated.pod("pod-0").gpu
    if displaced:
        assert [p["adapter"] for p in decision["preloads"]] == ["acme-chat", "acme-chat"]
        assert on_gpu == ("beta-b", "acme-chat")
    else:
        assert decision["preloads"] == []
        assert "displace beta-a" in decision["skipped"]["acme-chat"]
        assert on_gpu == ("beta-a", "beta-b")


def test_the_router_log_tells_the_last_request_each_pod_served(tmp_path: Path) -> None:
    """Per pod, the latest arrival of a request it served; refused rows (no outcome)
    used no adapter there; a log not yet written tells nothing."""
    path = tmp_path / "router-requests.jsonl"
    assert RouterLogUse(path, refresh_s=REFRESH_S)() == {}
    writer = JsonLinesRequestLog(path)
    t = T0.timestamp()
    refused = served(t + 50, "beta-a")._replace(outcome=None, status=404)
    elsewhere = served(t + 20, "beta-a")._replace(pod="pod-1")
    writer.write([served(t, "beta-a"), served(t + 10, "beta-b"), refused, elsewhere])
    writer.write([served(t + 30, "beta-a")])
    writer.close()
    assert RouterLogUse(path, refresh_s=REFRESH_S)() == {
        "pod-0": {"beta-a": t + 30, "beta-b": t + 10},
        "pod-1": {"beta-a": t + 20},
    }


def test_idle_times_count_from_the_later_of_use_and_landing() -> None:
    hot = (AdapterId("a"), AdapterId("b"), AdapterId("c"), AdapterId("?unloaded-3"))
    used = {AdapterId("a"): 100.0, AdapterId("b"): 50.0, AdapterId("c"): 130.0}
    landed = {AdapterId("b"): 90.0}
    assert idle_times(hot, used_s=used, landed_s=landed, now_s=120.0) == {
        "a": 20.0,
        "b": 30.0,
        "c": 0.0,  # a time ahead of the controller's clock: in use, never idler
    }


def test_one_read_serves_the_events_of_the_next_seconds(tmp_path: Path) -> None:
    """A read's answer is given again for ``refresh_s``, the settings tree's
    ``recent_use_refresh_s`` (2 s)."""
    path, clock = tmp_path / "router-requests.jsonl", FakeClock()
    writer = JsonLinesRequestLog(path)
    assert REFRESH_S == 2.0
    use = RouterLogUse(path, refresh_s=REFRESH_S, clock=clock)
    t = T0.timestamp()
    writer.write([served(t, "beta-a")])
    assert use() == {"pod-0": {"beta-a": t}}
    writer.write([served(t + 1, "beta-b")])
    clock.advance(1.9)
    assert use() == {"pod-0": {"beta-a": t}}
    clock.advance(0.1)
    assert use() == {"pod-0": {"beta-a": t, "beta-b": t + 1}}
    writer.close()


def test_every_event_reads_the_log_with_no_refresh(tmp_path: Path) -> None:
    path, clock = tmp_path / "router-requests.jsonl", FakeClock()
    writer = JsonLinesRequestLog(path)
    use = RouterLogUse(path, refresh_s=0.0, clock=clock)
    t = T0.timestamp()
    writer.write([served(t, "beta-a")])
    assert use() == {"pod-0": {"beta-a": t}}
    writer.write([served(t + 1, "beta-b")])
    assert use() == {"pod-0": {"beta-a": t, "beta-b": t + 1}}  # the clock did not move
    writer.close()


@pytest.mark.parametrize(
    "refresh_s", [-1.0, math.nan, math.inf], ids=["negative", "nan", "infinite"]
)
def test_a_refresh_that_is_no_time_span_is_refused_by_name(refresh_s: float) -> None:
    with pytest.raises(ValueError, match=r"ControllerSettings\.recent_use_refresh_s must be"):
        ControllerSettings(recent_use_refresh_s=refresh_s)


def test_each_refresh_folds_in_only_the_rows_appended_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh costs what the router appended: the rows it folds in are those."""
    folded: list[int] = []

    def counted(log: RequestLog) -> LastUse:
        folded.append(len(log.frame))
        return latest_uses(log)

    monkeypatch.setattr("placement.controller.recent_use.latest_uses", counted)
    path = tmp_path / "router-requests.jsonl"
    writer = JsonLinesRequestLog(path)
    use = RouterLogUse(path, refresh_s=0.0)
    t = T0.timestamp()
    writer.write([served(t + i, "beta-a") for i in range(50)])
    first = use()
    writer.write([served(t + 60, "beta-b")])
    assert use() == {"pod-0": {"beta-a": t + 49, "beta-b": t + 60}}
    assert use() == {"pod-0": {"beta-a": t + 49, "beta-b": t + 60}}
    assert folded == [50, 1, 0]
    assert first == {"pod-0": {"beta-a": t + 49}}  # an answer given is never changed after
    writer.close()


def test_a_use_stays_known_when_the_file_that_told_it_is_deleted(tmp_path: Path) -> None:
    path = tmp_path / "router-requests.jsonl"
    writer = JsonLinesRequestLog(path, rotate_bytes=1)  # each write rotates
    use = RouterLogUse(path, refresh_s=0.0)
    t = T0.timestamp()
    writer.write([served(t, "beta-a")])
    assert use() == {"pod-0": {"beta-a": t}}
    for rotated in tmp_path.glob("router-requests.*.jsonl"):
        rotated.unlink()  # the operator's retention
    writer.write([served(t + 5, "beta-b")])
    assert use() == {"pod-0": {"beta-a": t, "beta-b": t + 5}}
    writer.close()


@settings(max_examples=30, deadline=None)
@given(
    batches=st.lists(
        st.lists(
            st.tuples(
                st.sampled_from(["pod-0", "pod-1"]),
                st.sampled_from(["beta-a", "beta-b", "acme-chat"]),
                st.floats(0.0, 7200.0),
                st.booleans(),
            ),
            max_size=4,
        ),
        min_size=1,
        max_size=6,
    ),
    rotate_bytes=st.sampled_from([1, 400, None]),
    parquet=st.booleans(),
)
def test_the_kept_answer_is_what_a_read_of_the_whole_log_tells(
    batches: list[list[tuple[str, str, float, bool]]], rotate_bytes: int | None, parquet: bool
) -> None:
    """Through rotations, and Parquet parts compacted into hours (rows given again),
    the answer brought up to date is the one a new reader of the whole log gives, and
    the latest of the served rows written (to the microsecond the files keep)."""
    t = T0.timestamp()
    written: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as directory:
        target = Path(directory) / ("parquet" if parquet else "router-requests.jsonl")
        writer: ParquetRequestLog | JsonLinesRequestLog = (
            ParquetRequestLog(target)
            if parquet
            else JsonLinesRequestLog(target, rotate_bytes=rotate_bytes)
        )
        use = RouterLogUse(target, refresh_s=0.0)
        for batch in batches:
            rows = [
                served(t + at_s, adapter)._replace(pod=pod, outcome="gpu_hit" if ok else None)
                for pod, adapter, at_s, ok in batch
            ]
            writer.write(rows)
            for row in rows:
                if row.outcome is not None and row.pod is not None:
                    key = (row.pod, row.adapter)
                    written[key] = max(row.ts_s, written.get(key, -math.inf))
            assert use() == RouterLogUse(target, refresh_s=0.0)()
        writer.close()
        answer = use()
        assert answer == RouterLogUse(target, refresh_s=0.0)()
        told: dict[tuple[str, str], float] = {
            (pod, adapter): at_s for pod, uses in answer.items() for adapter, at_s in uses.items()
        }
        assert told.keys() == written.keys()
        assert all(abs(told[key] - at_s) <= 1e-6 for key, at_s in written.items())
