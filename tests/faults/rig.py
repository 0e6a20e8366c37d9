"""The fault suite's rig: a controller run as a process (``lorafleet controller -c``) on
port 0 of localhost, its inputs copied from ``data/legal-research``, its HTTP answers,
and its stderr.

Nothing here sleeps for a fixed time: ``wait_for`` polls a condition until a deadline,
and the port is the one the controller reports (``Uvicorn running on ...``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "data" / "legal-research"
LORAFLEET = Path(sys.executable).parent / "lorafleet"
SECRET = "fault-suite-secret-0123456789abcdef"
#: The scenario's history ends on 2026-03-12 at 04:00: the controller's clock starts there.
CLOCK = "clock: {start: '2026-03-12T04:00:00Z', speed: 1}\n"
PIPELINES = """pipelines:
- trigger: brief.filed
  steps:
  - {adapter: ny-jurisdiction-v3}
logins:
  firm-east: [ny-jurisdiction-v3]
"""
_LISTENING = re.compile(r"Uvicorn running on (http://\S+:\d+)")

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
        time.sleep(0.05)


def controller_yaml(*, state_dir: str = "state", extra: str = "") -> str:
    return (
        "catalog: catalog.yaml\nfleet: fleet.yaml\npipelines: pipelines.yaml\n"
        "history: {log: requests.parquet}\n"
        f"state_dir: {state_dir}\n"
        "webhook: {host: 127.0.0.1, port: 0}\n"
        "planner: {time_limit_s: 2}\n"
        "intervals: {plan_s: 3, ingest_s: 600, forecast_s: 600, watchdog_s: 600}\n"
        f"{CLOCK}{extra}"
    )


def prepare_workdir(directory: Path, *, config: str) -> Path:
    """The scenario's inputs, a pipeline with one trigger, and ``controller.yaml``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("catalog.yaml", "fleet.yaml", "requests.parquet"):
        shutil.copy(SCENARIO / name, directory / name)
    (directory / "pipelines.yaml").write_text(PIPELINES)
    path = directory / "controller.yaml"
    path.write_text(config)
    return path


@dataclass
class ControllerProcess:
    """One ``lorafleet controller`` child process and what it said."""

    process: subprocess.Popen[bytes]
    stderr_path: Path
    url: str = ""
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10.0))

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def get(self, path: str) -> httpx.Response:
        return self.client.get(self.url + path)

    def post(self, path: str, *, content: bytes, headers: dict[str, str]) -> httpx.Response:
        return self.client.post(self.url + path, content=content, headers=headers)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of ``/metrics`` (0 when absent)."""
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in self.get("/metrics").text.splitlines():
            sample, _, value = line.rpartition(" ")
            if sample == (f"{name}{{{wanted}}}" if wanted else name):
                return float(value)
            if wanted and sample.startswith(name + "{"):
                inside = sample[len(name) + 1 : -1]
                if sorted(inside.split(",")) == sorted(wanted.split(",")):
                    return float(value)
        return 0.0

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self) -> int:
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                return self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(timeout=20)


def start_controller(
    config: Path, *, env: dict[str, str] | None = None, listen: bool = True
) -> ControllerProcess:
    """Start ``lorafleet controller -c config``; with ``listen``, wait for its port."""
    stderr_path = config.with_name(f"controller-{time.monotonic_ns()}.log")
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LORAFLEET_")},
        "LORAFLEET_WEBHOOK_SECRET": SECRET,
        **(env or {}),
    }
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [str(LORAFLEET), "controller", "-c", str(config)],
            cwd=config.parent,
            env=environment,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    controller = ControllerProcess(process=process, stderr_path=stderr_path)
    if listen:

        def listening() -> str | None:
            if process.poll() is not None:
                raise AssertionError(f"the controller exited:\n{controller.log()}")
            found = _LISTENING.search(controller.log())
            return found.group(1) if found else None

        controller.url = wait_for(listening, timeout_s=60, what="the controller's port")
    return controller


def sign(body: bytes, *, timestamp: str | None = None, secret: str = SECRET) -> dict[str, str]:
    """The headers of a signed webhook request."""
    stamp = timestamp if timestamp is not None else str(int(time.time()))
    digest = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {
        "X-Lorafleet-Timestamp": stamp,
        "X-Lorafleet-Signature": f"sha256={digest}",
        "Content-Type": "application/json",
    }
