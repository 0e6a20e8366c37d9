"""A real Prometheus (Debian's package) scrapes the router in front of emulated pods;
the history source reads the request counts back and a forecaster uses them.

Slow (a real server, a few scrape intervals): marked ``slow``. Without the binary it
skips, or fails under CI=true (``scripts/ensure-prometheus`` installs it). The test
keeps time by Prometheus's own scrapes of the router, which it waits on as events.
"""

from __future__ import annotations

import contextlib
import math
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
from placement.emulator import EmulatedFleet, PodConfig, free_base_port, serving_in_thread
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
    fleet = EmulatedFleet.start(2, base_port=free_base_port(2), config=config)
    with serving_in_thread(fleet.handles):
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


@contextlib.contextmanager
def prometheus(binary: str, tmp_path: Path, *, target: str, scrapes: Scrapes) -> Iterator[str]:
    port = free_port()
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
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
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
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


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
