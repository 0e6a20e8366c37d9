"""Children that bind port 0 say where they listen: ``lorafleet emulate --port 0
--ports-file`` and ``lorafleet router --port 0 --port-file``, as the demo starts them,
with ``LocalProcesses.wait_for_file`` reading what they write. No port is chosen by
the parent, so none can be taken by another process before a child binds it.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from placement.demo.processes import ProcessError, local_processes

pytestmark = pytest.mark.slow


def _fleet_yaml(urls: dict[str, str]) -> str:
    pods = "".join(f'      - {{name: {name}, url: "{url}"}}\n' for name, url in urls.items())
    return (
        "pools:\n  - name: emulated\n    base_model: llama-3.1-8b\n"
        "    served_model_name: base-model\n    engine: vllm\n    max_lora_rank: 64\n"
        f"    pod_defaults: {{max_loras: 2, max_cpu_loras: 4}}\n    pods:\n{pods}"
    )


def test_pods_and_router_on_port_0_write_where_they_listen(tmp_path: Path) -> None:
    with local_processes(tmp_path) as processes:
        ports_file = tmp_path / "pods.json"
        pods = processes.start(
            "pods", ["emulate", "--pods", "2", "--port", "0", "--ports-file", str(ports_file)]
        )
        urls = json.loads(processes.wait_for_file(pods, ports_file, timeout_s=60))
        assert sorted(urls) == ["pod-0", "pod-1"]
        assert len(set(urls.values())) == 2
        for url in urls.values():
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        (tmp_path / "fleet.yaml").write_text(_fleet_yaml(urls))
        port_file = tmp_path / "router.port"
        router = processes.start(
            "router",
            ["router", "--fleet", str(tmp_path / "fleet.yaml"), "--port", "0",
             "--port-file", str(port_file)],
        )  # fmt: skip
        port = int(processes.wait_for_file(router, port_file, timeout_s=60))
        assert port != 0
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
        assert health["pods"] == 2


def test_waiting_for_a_file_ends_when_the_child_exits(tmp_path: Path) -> None:
    with local_processes(tmp_path) as processes:
        child = processes.start("pods", ["emulate", "--pods", "0"])  # refused: exit 2
        with pytest.raises(ProcessError, match="pods exited with 2"):
            processes.wait_for_file(child, tmp_path / "pods.json", timeout_s=60)
