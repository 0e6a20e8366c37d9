"""When each pod last served each adapter: the ``RecentUse`` port over the router's log.

The event preloads weigh an adapter they would displace by its recent use
(``PodView.idle_s``); the router's live request log is the one record of it the
controller has (the router's own state is in another process, and the ledger sees only
lorafleet's own loads and warm-ups). Reads only; the router owns the files.

The answer is kept and brought up to date with the rows the log gained since the last
read (``RequestLogTail.read_new``), so a refresh costs what the router appended, not the
whole log; a row read twice (a file read again from its start) changes no latest time,
and a use stays known when the file that told it is deleted. An answer still
serves every event for ``refresh_s`` after its read
(``ControllerSettings.recent_use_refresh_s``, 2 s), so a flood of logins does not list
and stat the log's files for each; the log itself lags by the router's ``log_flush_s``
(1 s), and an idle time is weighed at one minute at least
(``event_preloads.MIN_WINDOW_S``), so two seconds more staleness moves few decisions.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from placement.adapters.live_request_log import RequestLogTail
from placement.adapters.request_log_files import worker_logs
from placement.domain import AdapterId, PodId
from placement.inputs.request_log import RequestLog

LastUse = Mapping[PodId, Mapping[AdapterId, float]]


class RouterLogUse:
    """The ``RecentUse`` port over the router's live request log: per pod, the arrival
    of each adapter's latest request the pod served (a row with an outcome; one the
    router or the pod refused did not use the adapter there), its further workers' logs
    (``router --workers N``) read with it. Its own reader, so an event's read does not
    disturb the ingest's; a lock keeps two events' reads in turn, and an answer younger
    than ``refresh_s`` (seconds on ``clock``) is given again. A log of counts per bucket
    tells no moment: its rows are passed by."""

    def __init__(
        self,
        path: Path,
        *,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        #: Worker 0's log and each further worker's (``router --workers N``).
        self._tails: dict[Path, RequestLogTail] = {}
        self._lock = threading.Lock()
        self._refresh_s = refresh_s
        self._clock = clock
        self._answer: LastUse = {}
        self._read_at_s = -math.inf

    def __call__(self) -> LastUse:
        with self._lock:
            now_s = self._clock()
            if not 0.0 <= now_s - self._read_at_s < self._refresh_s:
                paths = [self._path, *worker_logs(self._path)]
                self._tails = {p: self._tails.get(p) or RequestLogTail(p) for p in paths}
                for tail in self._tails.values():
                    if tail.path.exists():
                        self._answer = updated(self._answer, latest_uses(tail.read_new()))
                self._read_at_s = now_s
            return self._answer


def latest_uses(log: RequestLog) -> LastUse:
    """Per pod, the latest arrival of each adapter's request the pod served in ``log``."""
    frame = log.frame
    if log.aggregated or frame.empty or "pod" not in frame:
        return {}
    served = frame["pod"].notna()
    if "outcome" in frame:
        served &= frame["outcome"].notna()
    rows = frame.loc[served, ["pod", "adapter", "ts"]].astype({"pod": str, "adapter": str})
    last = rows.groupby(["pod", "adapter"], sort=False)["ts"].max()
    used: dict[PodId, dict[AdapterId, float]] = {}
    for (pod, adapter), ts in zip(last.index, last, strict=True):
        used.setdefault(PodId(str(pod)), {})[AdapterId(str(adapter))] = ts.timestamp()
    return used


def updated(answer: LastUse, new: LastUse) -> LastUse:
    """``answer`` with the later of each time in ``new``: a new mapping (the answer
    given before may still be read), sharing the pods ``new`` does not name."""
    merged = dict(answer)
    for pod, uses in new.items():
        times = dict(merged.get(pod, {}))
        for adapter, at_s in uses.items():
            times[adapter] = max(at_s, times.get(adapter, -math.inf))
        merged[pod] = times
    return merged
