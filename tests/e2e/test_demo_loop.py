"""The whole loop on one machine, as `make demo` runs it, on a shorter trace.

Emulated pods, the controller and the router run as real local processes; the same
requests go through the router with the openai client under each policy, and the
figures come from the pods' counters and the router's request log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from placement.demo.processes import local_processes
from placement.demo.run import DemoOptions, PolicyResult, run_demo

pytestmark = pytest.mark.slow

SHORT = DemoOptions(
    window_hours=(9.0, 13.0),
    requests_per_policy=400,
    wall_s_per_policy=10.0,
    lead_s=8.0,
    plan_every_s=3,
)


def _processes_in(folder: Path) -> list[int]:
    """Processes whose working directory is ``folder`` (every child the demo starts)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "cwd")) == folder:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PolicyResult]:
    folder = tmp_path_factory.mktemp("demo")
    with local_processes(folder) as processes:
        outcome = run_demo(SHORT, folder, processes, lambda stage: None)
    assert _processes_in(folder) == []
    return {result.policy: result for result in outcome}


def test_every_request_is_answered_under_every_policy(results: dict[str, PolicyResult]) -> None:
    assert set(results) == {"round-robin", "epp", "lorafleet"}
    for result in results.values():
        assert result.requests == SHORT.requests_per_policy
        assert result.errors == 0


def test_round_robin_thrashes_where_the_adapter_aware_policies_do_not(
    results: dict[str, PolicyResult],
) -> None:
    spray, epp, planned = results["round-robin"], results["epp"], results["lorafleet"]
    for aware in (epp, planned):
        assert aware.gpu_hit_rate > spray.gpu_hit_rate + 0.2
        assert aware.activations < 0.7 * spray.activations
        assert aware.ttft_p50_ms < spray.ttft_p50_ms


def test_ctrl_c_leaves_no_process_behind(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "placement", "demo", "--requests", "300", "--seconds", "60",
               "--workdir", str(tmp_path)]  # fmt: skip
    log = (tmp_path / "demo-stderr.txt").open("wb")
    # A shell that starts a job in the background (CI runners, nohup) ignores SIGINT in
    # it, and a child inherits that: Python would then never raise KeyboardInterrupt.
    # Ctrl-C reaches a demo in a terminal with the default disposition, so give it that.
    demo = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=log,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "router-round-robin.log").exists():
            assert demo.poll() is None, "the demo ended before its router started"
            assert time.monotonic() < deadline, "the demo never started its router"
            time.sleep(0.2)
        assert _processes_in(tmp_path)
        demo.send_signal(signal.SIGINT)
        try:  # one grace period for every child, then SIGKILL: far under this bound
            code = demo.wait(timeout=120)
        except subprocess.TimeoutExpired:
            tail = (tmp_path / "demo-stderr.txt").read_text(errors="replace")[-2000:]
            pytest.fail(f"the demo was still running 120 s after Ctrl-C; its stderr:\n{tail}")
        assert code != 0
        assert _processes_in(tmp_path) == []
    finally:  # a failure here must not leave the demo running into the next test
        log.close()
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        for pid in _processes_in(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
