"""The whole loop on one machine, as `make demo` runs it, on shorter windows.

Emulated pods, the controller and the router run as real local processes; the same
requests go through the router with the openai client under each policy, at the log's
real density, and the figures come from the pods' counters and the router's request
log. A second, sparser window (legal research at its 9 AM login) checks that the
scenario's events reach the controller's webhook and that the controller preloads a
login's adapters before the login's first request.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import pytest

from placement.demo.measure import PolicyResult, first_after_events
from placement.demo.prepare import DemoOptions, prepare
from placement.demo.processes import local_processes
from placement.demo.run import run_demo
from placement.inputs import load_request_log

pytestmark = pytest.mark.slow

LEGAL = Path(__file__).resolve().parents[2] / "data" / "legal-research"

#: The war story's Thursday at 08:55 EDT, every request (about 28 a second), after 10 s
#: of warm-up: 30 s measured per policy.
SHORT = DemoOptions(window_hours=(8 + 55 / 60, 8 + 55.5 / 60), warmup_s=10.0, lead_s=15.0)

#: Legal research's Wednesday, 08:53-08:55 New York time, four times faster than real
#: time: firm-east's first login of the day (08:53:12) and its first requests, on the
#: two adapters pipelines.yaml names for it, which the night left in object storage.
LOGIN = DemoOptions(
    scenario=LEGAL,
    day=date(2026, 3, 11),
    window_hours=(8 + 53 / 60, 8 + 55 / 60),
    warmup_s=0.0,
    speed=4.0,
    lead_s=15.0,
    policies=("epp", "lorafleet"),
)
LOGIN_ADAPTERS = {"ny-jurisdiction-v3", "federal-law-v5"}


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
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, PolicyResult]]:
    folder = tmp_path_factory.mktemp("demo")
    with local_processes(folder) as processes:
        outcome = run_demo(SHORT, folder, processes, lambda stage: None)
    assert _processes_in(folder) == []
    return folder, {result.policy: result for result in outcome}


def test_every_request_is_answered_under_every_policy(
    demo: tuple[Path, dict[str, PolicyResult]],
) -> None:
    results = demo[1]
    assert set(results) == {"round-robin", "epp", "lorafleet"}
    for result in results.values():
        assert result.sent > 800  # 40 s of the log at its density, not thinned
        assert result.unanswered_line() is None
        assert result.logged == result.sent
        assert result.errors == 0
        assert 0.6 * result.sent < result.requests < 0.9 * result.sent  # the warm-up's not


def test_round_robin_thrashes_where_the_adapter_aware_policies_do_not(
    demo: tuple[Path, dict[str, PolicyResult]],
) -> None:
    results = demo[1]
    spray, epp, planned = results["round-robin"], results["epp"], results["lorafleet"]
    for aware in (epp, planned):
        assert aware.gpu_hit_rate > spray.gpu_hit_rate + 0.2
        assert aware.activations < 0.7 * spray.activations
        assert aware.ttft_p50_ms < spray.ttft_p50_ms


@pytest.fixture(scope="module")
def login(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, PolicyResult]]:
    folder = tmp_path_factory.mktemp("login")
    with local_processes(folder) as processes:
        outcome = run_demo(LOGIN, folder, processes, lambda stage: None)
    return folder, {result.policy: result for result in outcome}


def test_the_logins_reach_the_webhook_and_the_controller_answers_for_their_adapters(
    login: tuple[Path, dict[str, PolicyResult]],
) -> None:
    folder, results = login
    lines = (folder / "events-lorafleet.jsonl").read_text().splitlines()
    answers = [json.loads(line) for line in lines]
    assert [a["event_id"] for a in answers if a["kind"] == "login"] == ["login-000041"]
    for answer in answers:
        assert answer["status"] == 202, answer
        # Each of the login's adapters is preloaded now, or already on a GPU (the plan's
        # look-ahead put it there): the controller looked at both.
        preloaded = {p.split("/")[1] for p in answer["preloads"]}
        hot = {a for a, why in answer["skipped"].items() if why.startswith("already hot")}
        assert preloaded | hot == LOGIN_ADAPTERS, answer
    assert results["lorafleet"].events.accepted == results["lorafleet"].events.delivered == 1
    assert results["epp"].events.delivered == 0  # no controller behind a reactive policy


def test_a_logins_first_requests_find_their_adapters_on_a_gpu_only_under_lorafleet(
    login: tuple[Path, dict[str, PolicyResult]],
) -> None:
    folder, _results = login
    prepared = prepare(LOGIN, folder)
    firsts = [s for s in prepared.shots if s.event_id == "login-000041"]
    assert {s.adapter for s in firsts} == LOGIN_ADAPTERS
    found = {}
    for policy in LOGIN.policies:
        log = load_request_log(folder / f"requests-{policy}.jsonl").frame
        found[policy] = first_after_events(log, firsts, start=prepared.start, speed=LOGIN.speed)
    assert found == {"epp": (2, 0), "lorafleet": (2, 2)}


def test_ctrl_c_leaves_no_process_behind(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "placement", "demo", "--minutes", "1",
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
