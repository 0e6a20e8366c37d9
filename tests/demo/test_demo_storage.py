"""The demo starts its emulated pods on the scenario pool's storage: legal-research's
pods read adapters from object storage, as its fleet.yaml says."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from placement.demo.processes import local_processes
from placement.demo.setup import PodTimings, Prepared, start_pods
from placement.domain import AdapterStorage
from placement.inputs import load_fleet
from placement.settings import Settings

pytestmark = pytest.mark.slow

LEGAL = Path(__file__).resolve().parents[2] / "data" / "legal-research"


def _prepared(workdir: Path) -> Prepared:
    """What ``prepare`` gives, without reading the scenario's log: only the pods matter."""
    return Prepared(
        workdir=workdir,
        catalog=LEGAL / "catalog.yaml",
        fleet_source=LEGAL / "fleet.yaml",
        fleet=workdir / "fleet.yaml",
        pipelines=None,
        history=workdir / "history.parquet",
        pods=4,
        served_model="llama-3.1-70b",
        start=datetime(2026, 3, 11, 13, tzinfo=UTC),
        speed=1.0,
        shots=(),
    )


def test_the_demos_pods_read_from_the_scenario_pools_storage(tmp_path: Path) -> None:
    with local_processes(tmp_path) as processes:
        timings = PodTimings.replayed(Settings(), prompt_tokens=2500)
        prepared = start_pods(timings, _prepared(tmp_path), processes)
        assert len(prepared.pod_urls) == 4
        for url in prepared.pod_urls:
            stats = httpx.get(f"{url}/admin/stats", timeout=5).json()
            assert stats["storage"] == {
                "kind": "object", "bandwidth_per_s": 2e8, "first_byte_ms": 80.0,
            }  # fmt: skip
        # the fleet.yaml the router and controller read keeps the storage too
        storage = load_fleet(prepared.fleet).pools[0].storage
        assert storage == AdapterStorage(kind="object", bytes_per_s=2e8, first_byte_ms=80.0)
