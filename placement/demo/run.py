"""The whole loop on one machine: emulated pods, the controller and the router, live.

For each policy the demo restarts the emulated pods empty, starts a router (and for
lorafleet the controller, which forecasts from the history, plans, preloads before
the traffic and keeps replanning from what the router logs), and replays the same
window of a scenario's day through the router with the ``openai`` client: every
request of the window at its time (the log's real density on the wall clock, unless
``speed`` or ``max_requests`` say otherwise), after a warm-up of the minutes before it
that fills the pods under that policy and is not measured. The scenario's events
(pipeline steps, logins) go to the controller's webhook at their times, signed with a
secret made for this run, so that the controller preloads for them.

The figures come from the pods' own counters and the router's request log, not from
the simulator (``placement.demo.measure``). The emulated pods read adapters from the
storage of the scenario's pool (fleet.yaml ``storage``) and take the war story's pod
timings in wall milliseconds. Every child process is stopped when the demo ends.

No child is told a port chosen in advance: the pods and the router bind port 0 and
write the ports the kernel gave them to a file the demo waits for (``--ports-file``,
``--port-file``); the controller's webhook binds port 0 too and the demo reads the
port from its log. A port found free by a scan can be taken by another process
before the child binds it, and the child then dies at startup.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx
import pandas as pd
import yaml

from placement.demo.measure import (
    PodCounts,
    PolicyResult,
    actions_between,
    controller_actions,
    event_figures,
    measure,
)
from placement.demo.prepare import DemoOptions, prepare
from placement.demo.processes import Child, LocalProcesses
from placement.demo.setup import (
    PodTimings,
    Prepared,
    pod_counts,
    restart_pods,
    start_pods,
)
from placement.demo.traffic import (
    EventResult,
    Mark,
    ShotResult,
    Webhook,
    drive,
)
from placement.inputs import load_request_log
from placement.settings import Settings

#: How a webhook's secret reaches the controller (its config's default ``secret_env``).
SECRET_ENV = "LORAFLEET_WEBHOOK_SECRET"
_LISTENING = re.compile(r"Uvicorn running on (http://\S+)")

#: Wall seconds a router is given to start before the traffic (the replay's clock) begins.
ROUTER_START_S = 5.0
#: How long a router or controller gets to finish its log before it is killed.
STOP_GRACE_S = 30.0


@dataclass(frozen=True, kw_only=True)
class Stage:
    """A moment in the demo, for a progress display."""

    policy: str
    message: str
    done: int = 0
    total: int = 0


Progress = Callable[[Stage], None]


def _controller_config(
    options: DemoOptions, prepared: Prepared, live_log: Path, origin_s: float
) -> Path:
    config = {
        "catalog": str(prepared.catalog),
        "fleet": str(prepared.fleet),
        "history": {"log": str(prepared.history), "live_log": str(live_log)},
        "state_dir": str(prepared.workdir / "controller-state"),
        # The secret comes from the environment (SECRET_ENV); the port from the log.
        "webhook": {"host": "127.0.0.1", "port": 0},
        # The history is counts: the events' model is pipelines.yaml's, not learned.
        "learn_events": False,
        "planner": {"time_limit_s": 2.0}
        | ({} if options.replicate_share is None else {"replicate_share": options.replicate_share}),
        "clock": {
            "start": prepared.start.isoformat(), "speed": prepared.speed, "origin_s": origin_s,
        },
    }  # fmt: skip
    if prepared.pipelines is not None:
        config["pipelines"] = str(prepared.pipelines)
    intervals = controller_intervals(options.plan_every_s, speed=prepared.speed)
    if intervals:
        config["intervals"] = intervals
    path = prepared.workdir / "controller.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def controller_intervals(plan_every_s: int | None, *, speed: float) -> dict[str, int]:
    """The controller's ingest, forecast and plan periods in wall seconds, so that it
    keeps its cadence on the demo's clock: ``plan_every_s`` for all three, else the
    deployed ones (``ControllerSettings``). Its scheduler runs on the wall clock while
    its clock runs ``speed`` times faster: at 6x, a plan every 300 wall seconds would
    come every 30 minutes of the scenario, on a forecast 90 minutes old. The watchdog
    (pods that restarted) stays on the wall clock. Empty: nothing to change."""
    if plan_every_s is None and speed == 1.0:
        return {}
    deployed = Settings().controller
    periods = (
        dict.fromkeys(("ingest_s", "forecast_s", "plan_s"), plan_every_s)
        if plan_every_s is not None
        else {
            "ingest_s": deployed.ingest_interval_s,
            "forecast_s": deployed.forecast_interval_s,
            "plan_s": deployed.plan_interval_s,
        }
    )
    return {job: max(1, round(every_s / speed)) for job, every_s in periods.items()}


def _start_controller(
    options: DemoOptions,
    prepared: Prepared,
    processes: LocalProcesses,
    *,
    log_path: Path,
    origin_s: float,
) -> tuple[Child, Path, Webhook]:
    """The controller, its first plan written, and where its webhook listens."""
    secret = secrets.token_hex(32)
    config = _controller_config(options, prepared, log_path, origin_s)
    controller = processes.start(
        "controller", ["controller", "--config", str(config)], env={SECRET_ENV: secret}
    )
    url = processes.wait_for_line(controller, _LISTENING, timeout_s=120.0)
    plan_path = prepared.workdir / "controller-state" / "plan.json"
    processes.wait_for_file(controller, plan_path, timeout_s=120.0)
    return controller, plan_path, Webhook(url=f"{url}/v1/events", secret=secret.encode(), base=url)


async def _controller_actions(webhook: Webhook | None, dump: Path) -> Counter[str]:
    """What the controller has run on the pods so far, by kind (its ``/metrics``, kept in
    ``dump``); nothing without a controller."""
    if webhook is None:
        return Counter()
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            answer = await client.get(f"{webhook.base}/metrics")
    except httpx.HTTPError:  # a figure lost, not the run: the controller's log says why
        return Counter()
    dump.write_text(answer.text)
    return controller_actions(answer.text)


def run_policy(
    policy: str,
    options: DemoOptions,
    prepared: Prepared,
    processes: LocalProcesses,
    progress: Progress,
) -> PolicyResult:
    """One policy on freshly restarted pods; the router (and controller) stop afterwards."""
    restart_pods(prepared.pod_urls)
    port_file = prepared.workdir / f"router-{policy}.port"
    port_file.unlink(missing_ok=True)
    log_path = prepared.workdir / f"requests-{policy}.jsonl"
    log_path.unlink(missing_ok=True)
    origin_s = time.time() + (options.lead_s if policy == "lorafleet" else 0.0)
    children = []
    webhook = None
    if policy == "lorafleet":
        progress(Stage(policy=policy, message="controller: forecast, plan and preload"))
        controller, plan_path, webhook = _start_controller(
            options, prepared, processes, log_path=log_path, origin_s=origin_s
        )
        children.append(controller)
        late_s = time.time() + ROUTER_START_S - origin_s
        if late_s > 0:  # the traffic keeps to the router's clock; the controller's runs ahead
            progress(Stage(policy=policy, message=f"first plan {late_s:.0f} s past the lead"))
        policy_args = ["--plan", str(plan_path)]
    else:
        policy_args = ["--policy", policy]
    # The traffic starts when the router's clock reads the replay's start.
    origin_s = max(origin_s, time.time() + ROUTER_START_S)
    router_args = [
        "router", "--fleet", str(prepared.fleet), "--catalog", str(prepared.catalog),
        "--port", "0", "--port-file", str(port_file), "--request-log", str(log_path),
        "--clock-start", prepared.start.isoformat(), "--clock-speed", str(prepared.speed),
        "--clock-origin", str(origin_s), *policy_args,
    ]  # fmt: skip
    router = processes.start(f"router-{policy}", router_args)
    children.append(router)
    # The port file is written once the router accepts connections (its lifespan done).
    port = int(processes.wait_for_file(router, port_file, timeout_s=60.0))
    delay = origin_s - time.time()
    if delay < -0.5:
        progress(Stage(policy=policy, message=f"router started {-delay:.1f} s late"))
    if delay > 0:
        progress(Stage(policy=policy, message=f"preloading for {delay:.0f} s before the traffic"))
        time.sleep(delay)
    done = 0

    def on_done(_result: ShotResult) -> None:
        nonlocal done
        done += 1
        if done % 200 == 0 or done == len(prepared.shots):
            progress(
                Stage(policy=policy, message="replaying", done=done, total=len(prepared.shots))
            )

    before: list[PodCounts] = []
    ran_before: Counter[str] = Counter()
    dump = prepared.workdir / f"controller-metrics-{policy}"

    async def window_opens() -> None:
        before.extend(await pod_counts(prepared.pod_urls))
        ran_before.update(await _controller_actions(webhook, dump.with_suffix(".opened.txt")))

    async def replay() -> tuple[list[ShotResult], list[PodCounts], list[EventResult]]:
        results, answers = await drive(
            prepared.shots,
            base_url=f"http://127.0.0.1:{port}/v1",
            events=prepared.events,
            webhook=webhook,
            marks=[Mark(at_s=prepared.warmup_wall_s, action=window_opens)],
            on_done=on_done,
            origin_s=origin_s,
        )
        ran.update(await _controller_actions(webhook, dump.with_suffix(".ended.txt")))
        return results, await pod_counts(prepared.pod_urls), answers

    ran: Counter[str] = Counter()
    results, after, answers = asyncio.run(replay())
    _write_answers(prepared.workdir / f"events-{policy}.jsonl", answers)
    for child in reversed(children):
        # A router flushes its request log on the way out; on a loaded machine that can
        # take more than the default grace, and a SIGKILL would drop its last rows.
        processes.stop(child, grace_s=STOP_GRACE_S)
    measured = _measured(policy, prepared, log_path, before, after, results, answers)
    return replace(measured, controller_actions=actions_between(ran_before, ran))


def _write_answers(path: Path, answers: Sequence[EventResult]) -> None:
    """The webhook's answer to each event, one JSON line each, for whoever checks them."""
    lines = [
        json.dumps(
            {
                **asdict(answer.event),
                "status": answer.status,
                "preloads": list(answer.preloads),
                "skipped": answer.skipped,
            }
        )
        for answer in sorted(answers, key=lambda a: a.event.at_s)
    ]
    path.write_text("".join(f"{line}\n" for line in lines))


def _measured(
    policy: str,
    prepared: Prepared,
    log_path: Path,
    before: list[PodCounts],
    after: list[PodCounts],
    results: list[ShotResult],
    answers: list[EventResult],
) -> PolicyResult:
    log = (
        load_request_log(log_path).frame
        if log_path.exists() and log_path.stat().st_size
        else pd.DataFrame({"ts": pd.Series([], dtype="datetime64[ns, UTC]")}).assign(
            adapter="", tenant="", outcome="", ttft_ms=0.0, status=200
        )
    )
    opened = prepared.measured_from or prepared.start
    in_window = [s for s in prepared.shots if s.at_s >= prepared.warmup_wall_s]
    return measure(
        policy,
        log=log,
        served_model=prepared.served_model,
        measured_from=opened,
        window_s=prepared.window_wall_s,
        before=before,
        after=after,
        results=results,
        events=event_figures(answers, log, in_window, start=prepared.start, speed=prepared.speed),
    )


def run_demo(
    options: DemoOptions, workdir: Path, processes: LocalProcesses, progress: Progress
) -> list[PolicyResult]:
    prepared = prepare(options, workdir)
    progress(Stage(policy="", message=f"starting {prepared.pods} emulated pods"))
    timings = options.timings or PodTimings.replayed(Settings())
    prepared = start_pods(timings, prepared, processes)
    return [
        run_policy(policy, options, prepared, processes, progress) for policy in options.policies
    ]
