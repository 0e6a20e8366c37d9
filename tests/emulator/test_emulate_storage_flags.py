"""``lorafleet emulate`` takes the pods' storage from a fleet.yaml pool, flags override
it, and a bad flag is one line naming it (exit 2), never a traceback. One slow test
starts the command as the demo does and reads the storage back from the pods."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.cli.emulate_storage import pods_storage
from placement.demo.processes import local_processes
from placement.domain import AdapterStorage
from placement.errors import InputError

runner = CliRunner()
LEGAL = Path(__file__).resolve().parents[2] / "data" / "legal-research" / "fleet.yaml"
OBJECT = AdapterStorage(kind="object", bytes_per_s=2e8, first_byte_ms=80.0)

TWO_POOLS = """pools:
- name: fast
  base_model: llama-3.1-8b
  pods: [{name: a-0, url: "http://127.0.0.1:1"}]
- name: slow
  base_model: llama-3.1-8b
  storage: {kind: volume, bandwidth_per_s: 1GB, first_byte_ms: 5}
  pods: [{name: b-0, url: "http://127.0.0.1:2"}]
"""


def _storage(**flags: Any) -> AdapterStorage | None:
    given: dict[str, Any] = {
        "fleet": None, "pool": None, "kind": None, "bandwidth": None, "first_byte_ms": None,
    }  # fmt: skip
    return pods_storage(**{**given, **flags})


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param({}, None, id="none-local-nvme"),
        pytest.param({"fleet": LEGAL}, OBJECT, id="the-pools"),
        pytest.param(
            {"fleet": LEGAL, "first_byte_ms": 120.0},
            AdapterStorage(kind="object", bytes_per_s=2e8, first_byte_ms=120.0),
            id="a-flag-overrides-a-field",
        ),
        pytest.param(
            {"kind": "volume", "bandwidth": "1GB"},
            AdapterStorage(kind="volume", bytes_per_s=1e9, first_byte_ms=0.0),
            id="flags-alone",
        ),
    ],
)
def test_the_storage_the_pods_get(flags: dict[str, object], expected: object) -> None:
    assert _storage(**flags) == expected


def test_a_pool_is_chosen_by_name_and_the_first_by_default(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(TWO_POOLS)
    assert _storage(fleet=fleet) is None
    assert _storage(fleet=fleet, pool="slow") == AdapterStorage(
        kind="volume", bytes_per_s=1e9, first_byte_ms=5.0
    )


BAD = [
    pytest.param(["--storage-kind", "tape", "--storage-bandwidth", "1GB"],
                 "--storage-kind: expected one of nvme, volume, object, got 'tape'", id="kind"),
    pytest.param(["--storage-kind", "object", "--storage-bandwidth", "fast"],
                 "--storage-bandwidth: expected a byte size", id="bandwidth"),
    pytest.param(["--storage-kind", "object", "--storage-bandwidth", "0"],
                 "--storage-bandwidth: must be above 0", id="zero-bandwidth"),
    pytest.param(["--fleet", str(LEGAL), "--storage-first-byte-ms", "-1"],
                 "--storage-first-byte-ms: must be 0 or more, got -1", id="negative-wait"),
    pytest.param(["--storage-kind", "object"],
                 "a storage needs --storage-bandwidth (no --fleet pool gives one)", id="no-rate"),
    pytest.param(["--pool", "llama-70b"], "--pool: a pool of --fleet; no --fleet", id="no-fleet"),
    pytest.param(["--fleet", str(LEGAL), "--pool", "other"],
                 "has no pool 'other' (it has llama-70b)", id="unknown-pool"),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "line"), BAD)
def test_a_bad_storage_flag_is_one_line(flags: list[str], line: str) -> None:
    result = runner.invoke(app, ["emulate", "--pods", "1", *flags], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert line in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_emulate_pods_read_from_the_fleet_pools_storage(tmp_path: Path) -> None:
    with local_processes(tmp_path) as processes:
        ports_file = tmp_path / "pods.json"
        args = ["emulate", "--pods", "2", "--port", "0", "--ports-file", str(ports_file)]
        child = processes.start("pods", [*args, "--fleet", str(LEGAL)])
        urls = json.loads(processes.wait_for_file(child, ports_file, timeout_s=60))
        for url in urls.values():
            stats = httpx.get(f"{url}/admin/stats", timeout=5).json()
            assert stats["storage"] == {
                "kind": "object", "bandwidth_per_s": 2e8, "first_byte_ms": 80.0,
            }  # fmt: skip


def test_a_fleet_the_pods_cannot_read_is_refused_with_its_problems(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(TWO_POOLS.replace("1GB", "0"))
    with pytest.raises(InputError, match="bandwidth_per_s: must be above 0"):
        _storage(fleet=fleet)
