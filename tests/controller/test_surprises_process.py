"""Surprises in the composed controller: controller.yaml with a source template, pods
discovered on a fake Kubernetes API server, emulated pods at the wire, the router's
live log. An adapter that appears in the live log is planned and loaded at the next
ticks; a catalog edit is picked up; a broken one is refused and counted on /metrics."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pandas as pd
import pytest

from placement.controller.config import load_controller_config
from placement.controller.ports import Job, TickOutcome
from placement.controller.ticks import Controller
from placement.controller.wiring import build
from placement.domain import AdapterId, Tier
from placement.emulator import ZERO_LATENCY, EmulatedFleet, PodConfig
from placement.errors import InputError
from placement.plan import plan_from_json
from tests.controller.controller_kubefake import FakeApiServer, make_pod
from tests.fleets import fleet_yaml

pytestmark = pytest.mark.anyio

NOW = datetime(2026, 3, 5, 10, 0, tzinfo=UTC)
FLEET = fleet_yaml(
    pool="llama",
    served_model_name="base-model",
    max_lora_rank=16,
    host_adapter_bytes="8GiB",
    capacity_rps=10,
    pods=[("template", "http://127.0.0.1:1")],
)
CONFIG = """
catalog: catalog.yaml
fleet: fleet.yaml
history: {{log: requests.parquet, live_log: live.jsonl}}
kubernetes: {{namespace: lf, api_host: '{api}'}}
identity: controller-0
forecast_model: level-profile
clock: {{start: '{start}', speed: 1.0, origin_s: {origin}}}
planner: {{replicate_share: 1.0}}
"""


def entry(name: str, *, rank: object = 8) -> str:
    return (
        f"- name: {name}\n  base_model: llama-3.1-8b\n  rank: {rank}\n"
        f"  size_bytes: 1000000\n  source: s3://catalogued/{name}\n"
    )


def write_inputs(
    tmp_path: Path, api: str, *, template: str | None = "s3://adapters/{name}"
) -> Path:
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "catalog.yaml").write_text("adapters:\n" + entry("a0") + entry("a1"))
    rows = []
    at = NOW - timedelta(days=3)
    while at < NOW:  # three days of a0 and a1, every ten minutes
        rows += [(at, "a0", 30), (at, "a1", 15)]
        at += timedelta(minutes=10)
    frame = pd.DataFrame(rows, columns=["ts", "adapter", "requests"])
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    frame.to_parquet(tmp_path / "requests.parquet")
    body = CONFIG.format(api=api, start=NOW.isoformat(), origin=time.time())
    if template is not None:
        body += f"inputs: {{adapter_source_template: '{template}'}}\n"
    path = tmp_path / "controller.yaml"
    path.write_text(body)
    return path


def route(tmp_path: Path, name: str, *, per_minute: int, minutes: int) -> None:
    """The router's live log: ``name`` requested over the last ``minutes``."""
    with (tmp_path / "live.jsonl").open("a") as log:
        for minute in range(minutes, 0, -1):
            for i in range(per_minute):  # apart: the same row twice counts once
                at = NOW - timedelta(minutes=minute) + timedelta(seconds=60 * i / per_minute)
                row = {"ts": at.isoformat(), "adapter": name, "pod": "pod-0"}
                log.write(json.dumps(row) + "\n")


@pytest.fixture
async def pods() -> AsyncIterator[tuple[EmulatedFleet, httpx.AsyncClient]]:
    fleet = EmulatedFleet.start(
        2, config=PodConfig(latency=ZERO_LATENCY, max_loras=2, max_cpu_loras=4)
    )
    async with fleet.http() as http:
        yield fleet, http


async def ticks(controller: Controller, *jobs: Job) -> list[TickOutcome]:
    tick = {
        Job.LEASE: controller.lease,
        Job.INGEST: controller.ingest,
        Job.FORECAST: controller.forecast,
        Job.PLAN: controller.plan_and_apply,
    }
    return [await controller.guarded(job, tick[job]) for job in jobs]


CYCLE = (Job.INGEST, Job.FORECAST, Job.PLAN)


def published_tier(fake_api: FakeApiServer, name: str) -> Tier:
    configmap = fake_api.get("configmaps", "lorafleet-plan")
    assert configmap is not None
    plan = plan_from_json(configmap["data"]["plan.json"], source="the plan ConfigMap")
    return plan.tier_of(AdapterId(name))


async def test_a_new_adapter_in_the_live_log_is_planned_and_loaded_from_the_template(
    tmp_path: Path,
    fake_api: FakeApiServer,
    pods: tuple[EmulatedFleet, httpx.AsyncClient],
) -> None:
    emulated, http = pods
    for handle in emulated.handles:
        port = httpx.URL(handle.url).port
        fake_api.put("pods", make_pod(handle.name, ip="127.0.0.1", pool="llama", port=port or 0))
    config = load_controller_config(write_inputs(tmp_path, fake_api.url))
    schedule, webhook = build(config, http=http)
    controller = schedule.controller
    assert await ticks(controller, Job.LEASE, *CYCLE) == [TickOutcome.DONE] * 4
    assert published_tier(fake_api, "ab-variant-7") is Tier.COLD
    # The unannounced variant: an hour of traffic, busier than a0 and a1.
    route(tmp_path, "ab-variant-7", per_minute=20, minutes=60)
    assert await ticks(controller, Job.INGEST) == [TickOutcome.DONE]
    assert controller.state.forecast_now  # the schedule brings the forecast forward
    assert await ticks(controller, Job.FORECAST, Job.PLAN) == [TickOutcome.DONE] * 2
    assert controller.state.demand is not None
    assert controller.state.demand[AdapterId("ab-variant-7")].mean_rps == pytest.approx(
        20 / 60, rel=0.05
    )
    assert published_tier(fake_api, "ab-variant-7") is Tier.HOT
    paths = {
        handle.pod.listed[name].path
        for handle in emulated.handles
        for name in handle.pod.listed
        if name == "ab-variant-7"
    }
    assert paths == {"s3://adapters/ab-variant-7"}
    # A catalog edit that breaks it: refused, counted once, the catalog in force kept.
    before = controller.ports.catalog
    (tmp_path / "catalog.yaml").write_text("adapters:\n" + entry("a0", rank=99) + entry("a1"))
    assert await ticks(controller, *CYCLE, Job.INGEST) == [TickOutcome.DONE] * 4
    assert controller.ports.catalog == before
    transport = httpx.ASGITransport(app=webhook)
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
        metrics = (await client.get("/metrics")).text
    assert 'lorafleet_controller_errors_total{error="InputError",task="catalog"} 1.0' in metrics
    # Fixed, with the variant announced as production: its entry is the catalog's now.
    (tmp_path / "catalog.yaml").write_text(
        "adapters:\n" + entry("a0") + entry("a1") + entry("ab-variant-7")
    )
    assert await ticks(controller, *CYCLE) == [TickOutcome.DONE] * 3
    variant = controller.ports.catalog.by_name()[AdapterId("ab-variant-7")]
    assert variant.source == "s3://catalogued/ab-variant-7"


async def test_an_edit_pipelines_yaml_cannot_serve_is_refused(
    tmp_path: Path,
    fake_api: FakeApiServer,
    pods: tuple[EmulatedFleet, httpx.AsyncClient],
) -> None:
    _, http = pods
    path = write_inputs(tmp_path, fake_api.url, template=None)
    (tmp_path / "pipelines.yaml").write_text(
        "pipelines:\n- trigger: doc.uploaded\n  steps:\n  - {adapter: a1}\n"
    )
    path.write_text(path.read_text() + "pipelines: pipelines.yaml\n")
    schedule, _ = build(load_controller_config(path), http=http)
    controller = schedule.controller
    await ticks(controller, Job.LEASE, Job.INGEST)
    (tmp_path / "catalog.yaml").write_text("adapters:\n" + entry("a0"))  # a1 retired
    assert await ticks(controller, Job.INGEST) == [TickOutcome.DONE]
    assert AdapterId("a1") in controller.ports.catalog.names()
    assert controller.state.catalog_problem is not None
    assert "a1" in controller.state.catalog_problem
    assert AdapterId("a1") not in controller.state.unplanned  # still in force, still planned


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param("s3://adapters/fixed", "holds no {name}", id="no-name"),
        pytest.param("http://{name}.example/x", "scheme http:// is not allowed", id="scheme"),
        pytest.param("s3://{name}/{version}", "only {name} may stand in braces", id="braces"),
        pytest.param("file:///etc/{name}", "is not under /adapters", id="outside-roots"),
    ],
)
def test_a_bad_template_is_refused_at_start_naming_its_field(
    tmp_path: Path, template: str, expected: str
) -> None:
    path = write_inputs(tmp_path, "http://127.0.0.1:1", template=template)
    with pytest.raises(InputError) as raised:
        load_controller_config(path)
    assert "inputs" in str(raised.value) and "adapter_source_template" in str(raised.value)
    assert expected in str(raised.value)


def inputs_configmap(catalog_text: str) -> dict[str, object]:
    return {"metadata": {"name": "lorafleet-inputs"}, "data": {"catalog.yaml": catalog_text}}


async def test_a_catalog_in_a_configmap_is_re_read_when_its_version_changes(
    tmp_path: Path,
    fake_api: FakeApiServer,
    pods: tuple[EmulatedFleet, httpx.AsyncClient],
) -> None:
    _, http = pods
    path = write_inputs(tmp_path, fake_api.url, template=None)
    body = path.read_text().replace("catalog: catalog.yaml\n", "")
    body = body.replace("api_host:", "catalog_configmap: lorafleet-inputs, api_host:")
    path.write_text(body)
    (tmp_path / "catalog.yaml").unlink()  # the ConfigMap is the only catalog
    fake_api.put("configmaps", inputs_configmap("adapters:\n" + entry("a0")))
    schedule, _ = build(load_controller_config(path), http=http)
    controller = schedule.controller
    assert controller.ports.catalog.names() == {"a0"}
    await ticks(controller, Job.LEASE, Job.INGEST)
    fake_api.put("configmaps", inputs_configmap("adapters:\n" + entry("a0") + entry("a1")))
    assert await ticks(controller, Job.INGEST) == [TickOutcome.DONE]
    assert controller.ports.catalog.names() == {"a0", "a1"}
    fake_api.put("configmaps", inputs_configmap("adapters:\n" + entry("a1", rank="x")))
    fake_api.inject("GET", "configmaps", 500)
    assert await ticks(controller, Job.INGEST, Job.INGEST) == [TickOutcome.DONE] * 2
    assert controller.ports.catalog.names() == {"a0", "a1"}  # the last good one
    problem = controller.state.catalog_problem
    assert problem is not None
    assert "configmap lf/lorafleet-inputs key catalog.yaml" in problem
    assert "adapter a1: rank" in problem


def test_the_catalog_comes_from_one_place(tmp_path: Path) -> None:
    path = write_inputs(tmp_path, "http://127.0.0.1:1", template=None)
    path.write_text(path.read_text().replace("api_host:", "catalog_configmap: inputs, api_host:"))
    with pytest.raises(InputError, match=r"one of catalog or kubernetes\.catalog_configmap"):
        load_controller_config(path)
