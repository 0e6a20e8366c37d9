"""Storage tiers: fleet.yaml's ``storage:`` per pool, paid by the simulator's cold loads."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from placement.domain import AdapterStorage, Fleet
from placement.errors import InputError
from placement.inputs import load_fleet
from placement.settings import Settings
from placement.sim.replay import run_policy
from placement.sim.workload import SimWorkload
from tests.fleets import fleet_yaml

MB = 1_000_000
ONE_POD = [("pod-0", "http://127.0.0.1:18000")]
OBJECT = "{kind: object, bandwidth_per_s: 200MB, first_byte_ms: 80}"


def fleet(tmp_path: Path, storage: str | None) -> Fleet:
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_yaml(storage=storage, pods=ONE_POD))
    return load_fleet(path)


def test_a_pool_names_its_storage(tmp_path: Path) -> None:
    assert fleet(tmp_path, OBJECT).pools[0].storage == AdapterStorage(
        kind="object", bytes_per_s=200 * MB, first_byte_ms=80.0
    )
    assert fleet(tmp_path, None).pools[0].storage is None


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ("{kind: tape, bandwidth_per_s: 1MB}", "expected one of nvme"),
        ("{kind: object}", "bandwidth_per_s: is required"),
        ("fast", "expected a mapping"),
    ],
    ids=["unknown-kind", "no-bandwidth", "not-a-mapping"],
)
def test_a_bad_storage_is_one_line(tmp_path: Path, storage: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        fleet(tmp_path, storage)
    assert any(message in str(problem) for problem in caught.value.problems)


def test_cold_loads_pay_the_pools_storage(tmp_path: Path) -> None:
    load = SimWorkload(
        start=datetime(2026, 3, 10, tzinfo=UTC),
        arrival_s=[0.0],
        adapters=["a"],
        prompt_tokens=[100],
        output_tokens=[10],
        size_bytes={"a": 50 * MB},
    )
    settings = Settings()
    nvme = run_policy("epp", load, fleet(tmp_path, None), settings=settings)
    remote = run_policy("epp", load, fleet(tmp_path, OBJECT), settings=settings)
    ((start, end, _, cold),) = nvme.log.loads
    ((remote_start, remote_end, _, remote_cold),) = remote.log.loads
    assert cold and remote_cold
    nvme_fetch_ms = 1000.0 * 50 * MB / settings.load_cost.storage_to_host_bytes_per_s
    object_fetch_ms = 80.0 + 1000.0 * 50 * MB / (200 * MB)
    assert (remote_end - remote_start) - (end - start) == pytest.approx(
        (object_fetch_ms - nvme_fetch_ms) / 1000.0
    )
    assert remote.metrics["ttft_p50_ms"] > nvme.metrics["ttft_p50_ms"]
