"""The controller process: controller.yaml, the composition, the routes, rollback, kube mode."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from placement.adapters.statedir import DirPlanStore
from placement.cli.app import app
from placement.controller.config import load_controller_config, read_secret
from placement.controller.ports import Job, TickOutcome
from placement.controller.wiring import build, settings_for
from placement.errors import InputError
from placement.settings import Settings
from tests.controller.controller_kubefake import FakeApiServer, make_pod
from tests.factories import make_plan

REPO = Path(__file__).resolve().parents[2]
SECRET = "topsecret-topsecret-topsecret-42"
SCENARIO = REPO / "data" / "legal-research"


def write_config(tmp_path: Path, body: str) -> Path:
    for name in ("catalog.yaml", "fleet.yaml", "pipelines.yaml", "requests.parquet"):
        shutil.copy(SCENARIO / name, tmp_path / name)
    (tmp_path / "secret").write_text(SECRET + "\n")
    path = tmp_path / "controller.yaml"
    path.write_text(body)
    return path


LOCAL = """
catalog: catalog.yaml
fleet: fleet.yaml
pipelines: pipelines.yaml
history: {log: requests.parquet}
state_dir: state
webhook: {secret_file: secret, port: 18999}
"""


def test_a_local_config_resolves_paths_against_its_directory(tmp_path: Path) -> None:
    config = load_controller_config(write_config(tmp_path, LOCAL))
    assert config.catalog == tmp_path / "catalog.yaml"
    assert config.history.log == tmp_path / "requests.parquet"
    assert config.state_dir == tmp_path / "state"
    assert read_secret(config.webhook, {}) == SECRET.encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param("catalog: c.yaml\n", "fleet: Field required", id="missing-field"),
        pytest.param(
            LOCAL + "colour: blue\n", "colour: Extra inputs are not permitted", id="unknown"
        ),
        pytest.param(
            LOCAL.replace("{log: requests.parquet}", "{log: a.parquet, prometheus_url: http://p}"),
            "exactly one of log or prometheus_url",
            id="two-histories",
        ),
        pytest.param(LOCAL.replace("state_dir: state", ""), "state_dir is required", id="no-state"),
        pytest.param(
            LOCAL + "kubernetes: {selector: a=b}\n",
            "kubernetes.namespace: Field required",
            id="kube-ns",
        ),
        pytest.param(LOCAL + "intervals: {plan_s: 0}\n", "intervals.plan_s", id="zero-interval"),
        pytest.param("- a\n- b\n", "expected a mapping", id="not-a-mapping"),
        pytest.param(LOCAL + "forecast_model: crystal-ball\n", "unknown forecaster", id="model"),
        pytest.param(
            LOCAL + "planner: {replicate_share: 0}\n", "planner.replicate_share", id="share"
        ),
        pytest.param(
            LOCAL + "planner: {time_limit_s: .nan}\n",
            "planner.time_limit_s: Input should be a finite number",
            id="nan",
        ),
        pytest.param(
            LOCAL + "max_loads_per_event: 4\nlease_retry_period_s: .inf\n",
            "lease_retry_period_s: Input should be a finite number",
            id="inf",
        ),
        pytest.param(
            LOCAL + "lease_duration_s: 9\n",
            "api_timeout_s (5.0) < lease_renew_deadline_s (10.0) < lease_duration_s (9)",
            id="lease-shorter-than-renew-deadline",
        ),
        pytest.param(
            LOCAL + "api_timeout_s: 10\n",
            "api_timeout_s (10.0) < lease_renew_deadline_s (10.0)",
            id="api-timeout-not-under-renew-deadline",
        ),
        pytest.param(
            LOCAL + "catalog: catalog.yaml\n",
            "key 'catalog' is given twice",
            id="duplicate-key",
        ),
        pytest.param(
            LOCAL + "webhook: {source_header: 'X Forwarded'}\n",
            "key 'webhook' is given twice",
            id="duplicate-section",
        ),
    ],
)
def test_config_mistakes_are_reported_with_their_field(
    tmp_path: Path, body: str, expected: str
) -> None:
    path = write_config(tmp_path, body)
    with pytest.raises(InputError) as raised:
        load_controller_config(path)
    assert expected in str(raised.value)
    assert str(path) in str(raised.value)
    result = CliRunner().invoke(app, ["controller", "--config", str(path)])
    assert result.exit_code == 2
    assert expected in result.output


def test_what_the_file_sets_overrides_the_settings_and_nothing_else(tmp_path: Path) -> None:
    defaults = Settings()
    # Without the tuning sections the file sets nothing: the tree's defaults are the only ones.
    assert settings_for(load_controller_config(write_config(tmp_path, LOCAL))) == defaults
    body = LOCAL + (
        "planner: {replicate_share: 1.0, time_limit_s: 2}\n"
        "intervals: {plan_s: 60}\nmax_loads_per_event: 5\nlease_duration_s: 30\n"
    )
    settings = settings_for(load_controller_config(write_config(tmp_path, body)))
    assert settings == replace(
        defaults,
        planner=replace(defaults.planner, replicate_share=1.0, time_limit_s=2.0),
        controller=replace(
            defaults.controller, plan_interval_s=60, max_loads_per_event=5, lease_duration_s=30
        ),
    )


def test_no_secret_turns_the_webhook_off_and_an_empty_secret_file_is_refused(
    tmp_path: Path,
) -> None:
    without = load_controller_config(
        write_config(tmp_path, LOCAL.replace("secret_file: secret, ", ""))
    )
    assert read_secret(without.webhook, {}) is None
    assert read_secret(without.webhook, {"LORAFLEET_WEBHOOK_SECRET": SECRET}) == SECRET.encode()
    with_file = load_controller_config(write_config(tmp_path, LOCAL))
    (tmp_path / "secret").write_text("\n")
    with pytest.raises(InputError, match="the webhook secret is empty"):
        read_secret(with_file.webhook, {"LORAFLEET_WEBHOOK_SECRET": "x"})


@pytest.mark.anyio
async def test_without_a_secret_the_controller_runs_with_the_webhook_off(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    config = load_controller_config(
        write_config(tmp_path, LOCAL.replace("secret_file: secret, ", ""))
    )
    _, webhook = build(config, http=http)
    transport = httpx.ASGITransport(app=webhook)
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.post("/v1/events", content=b"{}")).status_code == 404


def test_rollback_swaps_the_plans_of_the_state_directory(tmp_path: Path) -> None:
    path = write_config(tmp_path, LOCAL)
    runner = CliRunner()
    first = runner.invoke(app, ["rollback", "--config", str(path)])
    assert first.exit_code == 1
    assert "no previous plan" in first.output
    store = DirPlanStore(tmp_path / "state")
    store.publish(make_plan(plan_id="p1"))
    store.publish(make_plan(plan_id="p2"))
    result = runner.invoke(app, ["rollback", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "rolled back to plan p1" in result.output
    assert store.current() == make_plan(plan_id="p1")
    assert store.previous() == make_plan(plan_id="p2")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.mark.anyio
async def test_the_composed_app_serves_health_metrics_and_the_openapi_document(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    schedule, webhook = build(load_controller_config(write_config(tmp_path, LOCAL)), http=http)
    assert schedule.job_ids() == ["forecast", "ingest", "lease", "plan", "watchdog"]
    controller = schedule.controller
    # The state directory's lock is its lease: taken at the first lease tick.
    assert await controller.guarded(Job.LEASE, controller.lease) is TickOutcome.DONE
    assert await controller.guarded(Job.INGEST, controller.ingest) is TickOutcome.DONE
    transport = httpx.ASGITransport(app=webhook)
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
        assert (await client.get("/healthz")).status_code == 200
        ready = (await client.get("/readyz")).json()
        metrics = (await client.get("/metrics")).text
        document = (await client.get("/openapi.json")).json()
    # Not served yet (no scheduler running): alive, not ready.
    assert ready == {
        "leader": True,
        "plan": None,
        "backing_off": [],
        "problems": [],
        "ready": False,
        "reason": "starting",
    }
    assert 'lorafleet_controller_ticks_total{job="ingest",outcome="done"} 1.0' in metrics
    assert "lorafleet_plan_period_seconds 300.0" in metrics  # the stale-plan alert's period
    assert "lorafleet_slot_capacity{pool=" in metrics  # active adapters against slots
    assert "lorafleet_active_adapters{pool=" in metrics
    assert "/v1/events" in document["paths"]


@pytest.mark.anyio
async def test_kube_mode_discovers_pods_and_takes_the_lease_on_the_api_server(
    tmp_path: Path, http: httpx.AsyncClient, fake_api: FakeApiServer
) -> None:
    for i in range(4):
        fake_api.put("pods", make_pod(f"pod-{i}", ip=f"10.0.0.{i}", pool="llama-70b"))
    body = LOCAL.replace("state_dir: state", "") + (
        f"kubernetes: {{namespace: lf, api_host: '{fake_api.url}'}}\nidentity: controller-0\n"
    )
    schedule, _ = build(load_controller_config(write_config(tmp_path, body)), http=http)
    controller = schedule.controller
    assert controller.is_leader() is False
    assert await controller.guarded(Job.LEASE, controller.lease) is TickOutcome.DONE
    lease = fake_api.get("leases", "lorafleet-controller")
    assert lease is not None and lease["spec"]["holderIdentity"] == "controller-0"
    await controller.discover()
    assert [(p.name, p.url) for p in controller.fleet.pods] == [
        (f"pod-{i}", f"http://10.0.0.{i}:8000") for i in range(4)
    ]
    assert {p.max_loras for p in controller.fleet.pods} == {4}  # the fleet file's budgets


@pytest.mark.anyio
async def test_serve_starts_the_jobs_and_stops_cleanly(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    import asyncio

    from placement.controller.schedule import serve

    schedule, webhook = build(load_controller_config(write_config(tmp_path, LOCAL)), http=http)
    DirPlanStore(tmp_path / "state")  # the state directory exists before the run
    stop = asyncio.Event()
    running = asyncio.create_task(serve(schedule, webhook, host="127.0.0.1", port=0, stop=stop))
    while not schedule.scheduler.running:
        await asyncio.sleep(0.01)
    assert "lease" in schedule.job_ids()
    stop.set()
    await running
    assert schedule.scheduler.running is False


def test_rollback_on_kubernetes_swaps_the_plan_configmap(
    tmp_path: Path, fake_api: FakeApiServer
) -> None:
    from placement.adapters.kube import KubePlanStore, KubeTarget, connect

    body = LOCAL.replace("state_dir: state", "") + (
        f"kubernetes: {{namespace: lf, api_host: '{fake_api.url}'}}\n"
    )
    path = write_config(tmp_path, body)
    api = connect(host=fake_api.url)
    try:
        store = KubePlanStore(api, target=KubeTarget(namespace="lf"))
        store.publish(make_plan(plan_id="p1"))
        store.publish(make_plan(plan_id="p2"))
        fake_api.inject("GET", "configmaps", 500)
        failed = CliRunner().invoke(app, ["rollback", "--config", str(path)])
        result = CliRunner().invoke(app, ["rollback", "--config", str(path)])
        assert (failed.exit_code, result.exit_code) == (1, 0), result.output
        assert "HTTP 500" in failed.output
        assert store.current() == make_plan(plan_id="p1")
    finally:
        api.close()  # type: ignore[no-untyped-call]  # kubernetes: close is unannotated


@pytest.mark.anyio
async def test_the_composed_controller_learns_event_models_and_forecasts_with_models(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    from datetime import timedelta

    from placement.controller.live_ports import ReusingForecaster, SeasonalForecaster
    from placement.domain import TenantId
    from placement.forecast.demand import demand_from_forecast
    from placement.forecast.event_preloads import Event, EventKind
    from placement.forecast.forecaster import ModelForecaster

    schedule, _ = build(load_controller_config(write_config(tmp_path, LOCAL)), http=http)
    controller = schedule.controller
    assert isinstance(controller.ports.forecaster, ReusingForecaster)
    assert await controller.guarded(Job.LEASE, controller.lease) is TickOutcome.DONE
    assert await controller.guarded(Job.INGEST, controller.ingest) is TickOutcome.DONE
    assert controller.state.predictor is not None
    login = Event(kind=EventKind.LOGIN, id="e", tenant=TenantId("firm-east"))
    declared = {p.adapter for p in controller.ports.predictor(login)}
    learned = {p.adapter for p in controller.state.predictor(login)}
    assert declared < learned  # the log taught more than pipelines.yaml says
    history = controller.state.history
    assert history is not None
    end = history.frame["ts"].max().to_pydatetime()
    forecast = controller.settings.forecast
    fit = ModelForecaster(
        settings=forecast, catalog=controller.ports.catalog, model="level-profile"
    ).forecast(history, start=end, duration_s=3600)
    for start in (end, end + timedelta(hours=1)):  # the look-ahead reads the same fit
        expected = demand_from_forecast(
            fit.frame, at=start, validity_s=3600, bucket_s=forecast.bucket_s
        )
        assert controller.ports.forecaster(history, start=start, duration_s=3600) == expected
    same_hour = build(
        load_controller_config(write_config(tmp_path, LOCAL + "forecast_model: same-hour\n")),
        http=http,
    )[0]
    assert isinstance(same_hour.controller.ports.forecaster, SeasonalForecaster)


def test_a_warped_clock_runs_the_controller_on_scenario_time(tmp_path: Path) -> None:
    import asyncio
    from datetime import UTC, datetime, timedelta

    body = LOCAL + "clock: {start: '2026-03-11T08:00:00Z', speed: 60, origin_s: 1000.0}\n"

    async def built() -> tuple[float, datetime]:
        async with httpx.AsyncClient() as client:
            schedule, _ = build(load_controller_config(write_config(tmp_path, body)), http=client)
            start = datetime(2026, 3, 11, 8, tzinfo=UTC)
            return schedule.controller.clock(), schedule._to_wall(start + timedelta(hours=1))

    scenario_now_s, wall = asyncio.run(built())
    assert scenario_now_s > datetime(2026, 3, 11, 8, tzinfo=UTC).timestamp()  # 60x since 1000
    assert wall == datetime.fromtimestamp(1000.0 + 60.0, UTC)


def test_a_naive_clock_start_is_refused(tmp_path: Path) -> None:
    path = write_config(tmp_path, LOCAL + "clock: {start: '2026-03-11T08:00:00'}\n")
    with pytest.raises(InputError, match=r"clock\.start"):
        load_controller_config(path)


def test_the_live_log_joins_the_history_when_it_can_be_read(tmp_path: Path) -> None:
    import pandas as pd

    from placement.controller.live_ports import FileHistory
    from placement.inputs.request_log import load_request_log

    small = tmp_path / "requests.parquet"
    load_request_log(SCENARIO / "requests.parquet").frame.head(500).to_parquet(small)
    historic = load_request_log(small)
    live_path = tmp_path / "live.jsonl"
    history = FileHistory(small, bucket_s=Settings().forecast.bucket_s, live=live_path)
    assert len(history().frame) == len(historic.frame)  # no live log yet
    live = pd.DataFrame(
        {
            "ts": ["2026-03-12T05:00:00Z", "2026-03-12T05:00:01Z"],
            "adapter": ["ny-jurisdiction-v3", "ca-jurisdiction-v4"],
            "tenant": ["firm-east", "firm-west"],
            "pod": ["pod-0", "pod-1"],
        }
    )
    live.to_json(live_path, orient="records", lines=True)
    joined = history()
    assert len(joined.frame) == len(historic.frame) + 2
    assert joined.frame["ts"].max() == pd.Timestamp("2026-03-12T05:00:01Z")
    with live_path.open("a") as handle:
        handle.write('{"ts": "2026-03-12T05:00')  # the router is mid-line
    assert len(history().frame) >= len(historic.frame)
