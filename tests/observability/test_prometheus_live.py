"""A real Prometheus (Debian's package) scrapes the router in front of emulated pods;
the history source reads the request counts back and a forecaster uses them.

Slow (a real server, a few scrape intervals): marked ``slow``. Without the binary it
skips, or fails under CI=true (``scripts/ensure-prometheus`` installs it). The test
keeps time by Prometheus's own scrapes of the router, which it waits on as events.
"""

from __future__ import annotations

import contextlib
import math
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from models.baselines import Persistence
from models.series import panel_from_counts
from placement.adapters.prom import PromHistorySource
from placement.controller.live_ports import PrometheusHistory
from placement.domain import Catalog
from placement.emulator import (
    EmulatedFleet,
    PodConfig,
    listening_sockets,
    ports_of,
    serving_in_thread,
)
from placement.plan import Plan
from placement.router import build_router
from placement.router.wiring import ServedApp, free_port
from placement.settings import RouterSettings, Settings
from tests import factories
from tests.factories import make_plan

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "monitoring" / "rules.yaml"
BUCKET_S = 6
#: The router's own loops stay quiet: this test is about Prometheus scraping it.
QUIET = Settings(
    router=RouterSettings(scrape_interval_s=3600.0, plan_poll_s=3600.0, log_flush_s=3600.0)
)
SENT = {"alpha": 7, "beta": 3}
#: Prometheus must be told its port, so a scan picks one (``free_port``) and another
#: process may take it before Prometheus binds it; such a start is tried again on a
#: new port, this many times in all. Our own servers bind port 0 and never race.
PROMETHEUS_STARTS = 3


class Scrapes:
    """The router app, noting the wall time at which each scrape of ``/metrics`` was
    answered, so that the test waits on Prometheus's scrapes instead of sleeping."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._times_s: list[float] = []
        self._changed = threading.Condition()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
        if scope["type"] == "http" and scope["path"] == "/metrics":
            with self._changed:
                self._times_s.append(time.time())
                self._changed.notify_all()

    def count(self) -> int:
        with self._changed:
            return len(self._times_s)

    def wait(
        self, done: Callable[[Sequence[float]], bool], *, timeout_s: float, what: str
    ) -> Sequence[float]:
        """The scrape times once ``done`` holds for them."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(self._times_s), timeout=timeout_s):
                raise AssertionError(f"timed out waiting for {what}")
            return list(self._times_s)


def catalog() -> Catalog:
    return factories.catalog(
        *(
            factories.adapter(
                name,
                base="base-model",
                rank=8,
                size_bytes=50_000_000,
                source=f"s3://adapters/{name}",
            )
            for name in SENT
        )
    )


def plan() -> Plan:
    """alpha hot on pod-0, beta on pod-1, valid through 2026."""
    return make_plan(
        {"pod-0": ["alpha"], "pod-1": ["beta"]},
        plan_id="live",
        created=datetime(2026, 1, 1, tzinfo=UTC),
        valid_for=timedelta(days=365),
    )


@contextlib.contextmanager
def router_with_pods() -> Iterator[tuple[str, Scrapes]]:
    config = replace(PodConfig(), max_loras=2, max_cpu_loras=4)
    sockets = listening_sockets(2)
    fleet = EmulatedFleet.start(2, ports=ports_of(sockets), config=config)
    with serving_in_thread(fleet.handles, sockets=sockets):
        app = build_router(
            fleet=fleet.domain(),
            plan=plan(),
            catalog=catalog(),
            settings=QUIET,
            registry=CollectorRegistry(),
        )
        scrapes = Scrapes(app)
        with ServedApp(scrapes) as served:
            yield served.url, scrapes


def _answers_as_prometheus(process: subprocess.Popen[bytes], port: int) -> bool:
    """Whether Prometheus serves on ``port``; False once it has exited (a lost bind)."""
    deadline = time.monotonic() + 20
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            answer = httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=1)
            # Another process that took the port would not answer as Prometheus.
            if answer.status_code == 200 and "Prometheus" in answer.text:
                return process.poll() is None
        time.sleep(0.1)
    return False


def _start_prometheus(
    command: list[str], log_path: Path, *, pick_port: Callable[[], int] = free_port
) -> tuple[subprocess.Popen[bytes], int]:
    """Prometheus running ``command`` on a port found free, retried on a new port when
    another process took the one found (see ``PROMETHEUS_STARTS``)."""
    for _ in range(PROMETHEUS_STARTS):
        port = pick_port()
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [*command, f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if _answers_as_prometheus(process, port):
            return process, port
        _stop(process)
        if "address already in use" not in log_path.read_text():
            break
    raise AssertionError(
        f"prometheus did not start (exit status {process.poll()}): " + log_path.read_text()[-2000:]
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@contextlib.contextmanager
def prometheus(binary: str, tmp_path: Path, *, target: str, scrapes: Scrapes) -> Iterator[str]:
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "router", "static_configs": [{"targets": [target]}]},
        ],
    }
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp_path / "prometheus.log"
    command = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    process, port = _start_prometheus(command, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        # Prometheus scrapes only once its storage and configuration are loaded, and
        # it has answered queries since; a second scrape also had the first stored.
        try:
            scrapes.wait(lambda times: len(times) >= 2, timeout_s=20, what="two scrapes")
        except AssertionError:
            raise AssertionError(
                f"prometheus (exit status {process.poll()}) never scraped the router: "
                + log_path.read_text()[-2000:]
            ) from None
        yield url
    finally:
        _stop(process)


def instant(url: str, query: str) -> list[dict[str, object]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()
    result: list[dict[str, object]] = answer["data"]["result"]
    return result


def test_counts_scraped_from_the_router_come_back_for_the_forecast(
    prometheus_binary: str, tmp_path: Path
) -> None:
    with router_with_pods() as (router_url, scrapes):
        target = router_url.removeprefix("http://")
        with prometheus(prometheus_binary, tmp_path, target=target, scrapes=scrapes) as prom_url:
            assert instant(prom_url, 'up{job="router"} == 1')
            # Start the requests just after a scrape early in a bucket (scrapes come every
            # second), so that they share one bucket.
            seen = scrapes.count()
            scrapes.wait(
                lambda times: len(times) > seen and times[-1] % BUCKET_S < 1.0,
                timeout_s=BUCKET_S + 2,
                what="a scrape early in a bucket",
            )
            bucket_start_s = math.floor(time.time() / BUCKET_S) * BUCKET_S
            with httpx.Client(base_url=router_url, timeout=10) as client:
                for adapter, count in SENT.items():
                    for _ in range(count):
                        answer = client.post(
                            "/v1/completions",
                            json={"model": adapter, "prompt": "hi", "max_tokens": 1},
                        )
                        assert answer.status_code == 200, answer.text
            # The last bucket closes after a scrape has seen every request; the scrape
            # after that one means the one before is stored.
            bucket_end_s = math.ceil((time.time() + 1.5) / BUCKET_S) * BUCKET_S
            one_bucket = bucket_end_s == bucket_start_s + BUCKET_S
            scrapes.wait(
                lambda times: sum(t > bucket_end_s for t in times) >= 2,
                timeout_s=3 * BUCKET_S,
                what="two scrapes after the bucket closed",
            )
            rule_groups = httpx.get(f"{prom_url}/api/v1/rules", timeout=5).json()
            with PromHistorySource(prom_url) as source:
                frame = source.request_counts(
                    start=datetime.fromtimestamp(bucket_start_s - 3 * BUCKET_S, tz=UTC),
                    end=datetime.fromtimestamp(bucket_end_s, tz=UTC),
                    bucket_s=BUCKET_S,
                )
                # The controller's ingest of Prometheus history, at the bucket's end.
                ingest = PrometheusHistory(
                    source, lookback_s=4 * BUCKET_S, bucket_s=BUCKET_S, clock=lambda: bucket_end_s
                )
                log = ingest()
    totals = frame.groupby("adapter")["requests"].sum().to_dict()
    assert totals == SENT
    # Prometheus loaded the shipped rules and evaluates them without error.
    health = {
        rule["name"]: rule["health"]
        for group in rule_groups["data"]["groups"]
        for rule in group["rules"]
    }
    assert health and set(health.values()) <= {"ok", "unknown"}, health
    # The controller's ingest gives the same counts, and a forecaster reads them:
    # persistence repeats the last bucket's requests.
    assert log.aggregated
    panel = panel_from_counts(log.counts(BUCKET_S), bucket_s=BUCKET_S, end_s=int(bucket_end_s))
    assert dict(zip(panel.adapters, panel.counts.sum(axis=0), strict=True)) == SENT
    if one_bucket:
        forecast = Persistence().fit(panel).predict(panel, horizon=1)
        assert dict(zip(panel.adapters, forecast.mean[0], strict=True)) == SENT


def test_a_port_taken_before_prometheus_binds_it_is_tried_again(
    prometheus_binary: str, tmp_path: Path
) -> None:
    (tmp_path / "prometheus.yml").write_text("global: {scrape_interval: 1s}\n")
    command = [
        prometheus_binary,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        "--log.level=warn",
    ]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        lost = int(taken.getsockname()[1])
        picks = iter([lost, free_port()])
        process, port = _start_prometheus(
            command, tmp_path / "prometheus.log", pick_port=lambda: next(picks)
        )
    try:
        assert port != lost
        assert process.poll() is None
        answer = httpx.get(f"http://127.0.0.1:{port}/-/healthy", timeout=5)
        assert "Prometheus" in answer.text
    finally:
        _stop(process)
