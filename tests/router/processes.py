"""A router run as a process (``lorafleet router --port 0 --port-file``), for the tests
where a process matters: signals (SIGKILL, SIGTERM), its memory (``VmRSS`` and
``VmHWM`` of ``/proc/<pid>/status``), its loops running on their own clock.

The pods are emulated in the test's process (``tests.router.conftest.emulated``) and
named in a fleet file; nothing sleeps for a fixed time: ``wait_for`` polls a condition
until a deadline.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

LORAFLEET = Path(sys.executable).parent / "lorafleet"
T = TypeVar("T")


def wait_for(condition: Callable[[], T | None], *, timeout_s: float, what: str) -> T:
    """The first truthy value of ``condition``, polled until ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def fleet_yaml(urls: dict[str, str], *, max_loras: int = 2, max_cpu_loras: int = 8) -> str:
    pods = "".join(f'      - {{name: {name}, url: "{url}"}}\n' for name, url in urls.items())
    return (
        "pools:\n  - name: emulated\n    base_model: llama-3.1-8b\n"
        "    served_model_name: base-model\n    engine: vllm\n    max_lora_rank: 64\n"
        f"    pod_defaults: {{max_loras: {max_loras}, max_cpu_loras: {max_cpu_loras}}}\n"
        f"    pods:\n{pods}"
    )


def status_kib(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` line in KiB: ``VmRSS`` now, ``VmHWM`` its peak."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for process {pid}")


@dataclass
class RouterProcess:
    process: subprocess.Popen[bytes]
    stderr_path: Path
    url: str
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30.0))

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def rss_kib(self) -> int:
        return status_kib(self.pid, "VmRSS")

    def peak_rss_kib(self) -> int:
        return status_kib(self.pid, "VmHWM")

    def get(self, path: str) -> httpx.Response:
        return self.client.get(self.url + path)

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = self.get("/healthz").json()
        return body

    def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (0 when absent)."""
        wanted = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
        for line in self.get("/metrics").text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample == name + wanted:
                return float(value)
        return 0.0

    def terminate(self, *, timeout_s: float = 30.0) -> int:
        """SIGTERM, and the exit code once it exited."""
        self.client.close()
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def kill(self) -> None:
        """SIGKILL: nothing of the router's runs on, so the directories it made for its
        workers are removed here (``remove_worker_dirs``)."""
        self.client.close()
        self.process.kill()
        self.process.wait(timeout=30)
        remove_worker_dirs(self.pid)

    def stop(self) -> None:
        """Kill the router if it still runs; either way its workers' directories go (a
        parent that crashed, or was killed by someone else, cannot remove them itself)."""
        if self.process.poll() is None:
            self.kill()
        self.client.close()
        remove_worker_dirs(self.pid)


def remove_worker_dirs(pid: int) -> None:
    """The directories a router parent killed outright left behind for its workers
    (``router.workers._Shared``: on ``/dev/shm`` or in the temporary directory, named by
    the parent's pid); before, each such test left three on ``/dev/shm``."""
    for root in {"/dev/shm", tempfile.gettempdir()}:
        for path in Path(root).glob(f"lorafleet-*-{pid}-*"):
            shutil.rmtree(path, ignore_errors=True)


def start_router(
    directory: Path, *, urls: dict[str, str], args: Sequence[str] = (), name: str = "router"
) -> RouterProcess:
    """``lorafleet router`` on port 0 in front of the pods at ``urls``, once it listens."""
    directory.mkdir(parents=True, exist_ok=True)
    fleet = directory / f"{name}-fleet.yaml"
    fleet.write_text(fleet_yaml(urls))
    port_file = directory / f"{name}.port"
    port_file.unlink(missing_ok=True)
    stderr_path = directory / f"{name}.log"
    command = [str(LORAFLEET), "router", "--fleet", str(fleet), "--port", "0",
               "--port-file", str(port_file), *args]  # fmt: skip
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)

    def port() -> int | None:
        if process.poll() is not None:
            raise AssertionError(f"the router exited:\n{stderr_path.read_text()}")
        text = port_file.read_text() if port_file.exists() else ""
        return int(text) if text.strip() else None

    try:
        bound = wait_for(port, timeout_s=90, what="the router's port file")
    except BaseException:
        process.kill()
        process.wait(timeout=30)
        remove_worker_dirs(process.pid)
        raise
    return RouterProcess(process=process, stderr_path=stderr_path, url=f"http://127.0.0.1:{bound}")
