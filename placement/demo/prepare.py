"""The demo's options and its preparation: the scenario read, the history and the
replayed window cut, the files every policy's run shares written.

Owns ``DemoOptions`` (which window of which scenario, at what speed, thinned how) and
``prepare``, which turns them into ``placement.demo.setup.Prepared``: the history the
controller forecasts from (counts per forecast bucket), the requests and events of the
window on the demo's clock. Starts no process; running the policies is
``placement.demo.run``'s (it imports this module, never the other way).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd

from placement.demo.setup import DEFAULT_SCENARIO, POLICIES, PodTimings, Prepared, served_model
from placement.demo.traffic import EventShot, events_in
from placement.demo.traffic import select as select_shots
from placement.inputs import load_catalog, load_fleet, load_request_log
from placement.inputs.events import load_events
from placement.inputs.request_log import RequestLog, request_log_from_frame, write_request_log
from placement.settings import Settings
from placement.synth.scenario import load_scenario


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    scenario: Path = DEFAULT_SCENARIO
    #: Local hours of the scenario's last day that are measured: on the war story's
    #: Thursday, 15:00-15:01:30 EDT, the cascade's densest minutes (67 requests/s).
    window_hours: tuple[float, float] = (15.0, 15.025)
    #: The local day of the window; None: the log's last day.
    day: date | None = None
    #: Scenario seconds before the window replayed first and not measured: each policy
    #: meets the window with the pods it filled, not with empty ones.
    warmup_s: float = 30.0
    #: Scenario seconds per wall second: 1.0 replays the log at its real density.
    speed: float = 1.0
    #: Thin the window (and the warm-up and history alike) to this many requests at
    #: random; None sends every request.
    max_requests: int | None = None
    #: Deliver the scenario's events to the controller's webhook (lorafleet only).
    events: bool = True
    policies: tuple[str, ...] = POLICIES
    seed: int = 1
    #: The emulated pods' latencies; None: the replay's pod model (``PodTimings.replayed``).
    timings: PodTimings | None = None
    #: Seconds between the controller's ingests, forecasts and plans (on its clock:
    #: ``controller_intervals`` turns them into wall seconds); None: the controller's
    #: defaults, as deployed (a plan every 5 minutes, a forecast every 15).
    plan_every_s: int | None = None
    #: Wall seconds the controller runs before the traffic starts (its preloads).
    lead_s: float = 30.0
    #: Availability replicas (two copies) guard against pod failures: the demo runs the
    #: planner's default share, as a user's fleet would (None: PlannerSettings').
    replicate_share: float | None = None


def _window(
    options: DemoOptions, last_ts: pd.Timestamp, timezone: str
) -> tuple[datetime, datetime]:
    zone = ZoneInfo(timezone)
    if options.day is None:
        midnight = last_ts.tz_convert(zone).normalize()
    else:
        midnight = pd.Timestamp(options.day).tz_localize(zone)
    # Hours as floats are rounded to the millisecond (the log's own resolution).
    start = midnight + pd.Timedelta(hours=options.window_hours[0]).round("ms")
    end = midnight + pd.Timedelta(hours=options.window_hours[1]).round("ms")
    return start.to_pydatetime(), end.to_pydatetime()


def _log_frame(path: Path) -> pd.DataFrame:
    """The request log's rows, sorted by time. A Parquet log with UTC times is read as it
    is (millions of rows in seconds), its index each row's place in the file from 0;
    ``prepare`` checks the parts it uses, naming a bad row by that place. Any other log
    goes through ``load_request_log``, which checks every row (none is left to name)."""
    if path.suffix.lower() == ".parquet":
        frame = pd.read_parquet(path)
        # The index pandas stored with the file, if any, is no place in the file.
        frame.index = pd.RangeIndex(len(frame))
        if "ts" in frame and isinstance(frame["ts"].dtype, pd.DatetimeTZDtype):
            return frame.assign(ts=frame["ts"].dt.tz_convert("UTC")).sort_values(
                "ts", kind="stable"
            )
    return load_request_log(path).frame


def prepare(options: DemoOptions, workdir: Path) -> Prepared:
    """Read the scenario, cut the history and the replayed window, write the children's files."""
    files = load_scenario(options.scenario / "scenario.yaml")
    load_catalog(files.catalog, fleet=load_fleet(files.fleet))  # fail early on bad inputs
    frame = _log_frame(files.log)
    opened, closed = _window(options, frame["ts"].iloc[-1], files.scenario.timezone)
    start = opened - timedelta(seconds=options.warmup_s)
    rng = np.random.default_rng(options.seed)
    source = str(files.log)
    window = frame[(frame["ts"] >= start) & (frame["ts"] < closed)]
    replayed = request_log_from_frame(window, source=source, file_rows=window.index.tolist()).frame
    # Thinned, the replay keeps a share of the requests and the history the same share,
    # so that the rates the controller learns are the rates the router will see.
    in_window = int((replayed["ts"] >= opened).sum())
    keep = 1.0 if options.max_requests is None else options.max_requests / max(in_window, 1)
    keep = min(1.0, keep)
    past = frame[frame["ts"] < start]
    past = past if keep >= 1.0 else past[rng.random(len(past)) < keep]
    # The controller reads its history as counts per forecast bucket: the same rates as
    # the requests, read in a second where millions of rows took a minute.
    history = workdir / "history.parquet"
    bucket_s = Settings().forecast.bucket_s
    counts = RequestLog(frame=past, aggregated=False).counts(bucket_s)
    write_request_log(request_log_from_frame(counts, source=source).frame, history)
    budget = None if keep >= 1.0 else round(keep * len(replayed))
    shots = select_shots(
        replayed, start=start, end=closed, max_requests=budget, speed=options.speed, rng=rng
    )
    events: list[EventShot] = []
    if options.events and files.events.exists():
        log = load_events(files.events).frame
        events = events_in(log, start=start, end=closed, speed=options.speed)
    return Prepared(
        workdir=workdir,
        catalog=files.catalog.resolve(),
        fleet_source=files.fleet,
        fleet=workdir / "fleet.yaml",
        pipelines=files.pipelines.resolve() if files.pipelines else None,
        history=history,
        pods=len(load_fleet(files.fleet).pods),
        served_model=served_model(files.fleet),
        start=start,
        speed=options.speed,
        shots=tuple(shots),
        measured_from=opened,
        measured_to=closed,
        events=tuple(events),
        prompt_median=files.scenario.prompt_median,
    )
