"""When each pod last served each adapter: the ``RecentUse`` port over the router's log.

The event preloads weigh an adapter they would displace by its recent use
(``PodView.idle_s``); the router's live request log is the one record of it the
controller has (the router's own state is in another process, and the ledger sees only
lorafleet's own loads and warm-ups). Reads only; the router owns the files.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from placement.adapters.live_request_log import LiveRequestLog
from placement.domain import AdapterId, PodId


class RouterLogUse:
    """The ``RecentUse`` port over the router's live request log: per pod, the arrival
    of each adapter's latest request the pod served (a row with an outcome; one the
    router or the pod refused did not use the adapter there). Its own reader, so an
    event's read, incremental like the ingest's, does not disturb the ingest's; a lock
    keeps two events' reads in turn. A log of counts per bucket tells no moment: none."""

    def __init__(self, path: Path) -> None:
        self._log = LiveRequestLog(path)
        self._lock = threading.Lock()

    def __call__(self) -> Mapping[PodId, Mapping[AdapterId, float]]:
        with self._lock:
            if not self._log.path.exists():
                return {}
            log = self._log.read()
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
