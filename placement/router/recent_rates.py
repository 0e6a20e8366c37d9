"""The router's recent request rates, per adapter, over a sliding window.

``RecentRates`` counts the requests the router sends, per adapter, over the last 20
minutes: the recent rate that caps a victim's forecast (``VictimWorth.rate``), one
counter shared by every pod of every topology (``router.state.build_topology`` carries
it from one topology to the next).

No IO and no clock of its own: the proxy passes the time of each request it counts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping

#: The window of the recent rate: the replay's (``placement.sim.planning.RECENT_S``).
RECENT_WINDOW_S = 1200.0


class RecentRates(Mapping[str, float]):
    """Each adapter's rate (req/s, over the fleet) as the router sent its requests in
    the last ``window_s``, counted in buckets of ``slice_s``, as of the last request
    counted. Read as a mapping (absent: no request in the window) at each decision;
    ``add`` is O(1) but for the bucket that falls out of the window."""

    __slots__ = ("_buckets", "_first_s", "_last_s", "_totals", "slice_s", "span")

    def __init__(self, *, window_s: float = RECENT_WINDOW_S, slice_s: float = 60.0) -> None:
        if slice_s <= 0 or window_s < slice_s:
            raise ValueError(f"recent rates: a bucket of {slice_s} s must be within {window_s} s")
        self.slice_s = slice_s
        #: Buckets kept: the current one and those within the window before it.
        self.span = math.ceil(window_s / slice_s)
        self._buckets: deque[tuple[int, dict[str, int]]] = deque()
        self._totals: dict[str, int] = {}
        self._first_s = math.inf
        self._last_s = -math.inf

    def add(self, adapter: str, now_s: float) -> None:
        """A request for ``adapter`` was sent at ``now_s`` (the router's clock)."""
        bucket = math.floor(now_s / self.slice_s)
        buckets = self._buckets
        if not buckets or bucket > buckets[-1][0]:
            buckets.append((bucket, {}))
            self._expire(bucket)
        counts = buckets[-1][1]  # a clock that stepped back counts in the newest bucket
        counts[adapter] = counts.get(adapter, 0) + 1
        self._totals[adapter] = self._totals.get(adapter, 0) + 1
        self._first_s = min(self._first_s, now_s)
        self._last_s = max(self._last_s, now_s)

    def _expire(self, bucket: int) -> None:
        totals, oldest = self._totals, bucket - self.span + 1
        while self._buckets[0][0] < oldest:
            for adapter, count in self._buckets.popleft()[1].items():
                left = totals[adapter] - count
                if left > 0:
                    totals[adapter] = left
                else:
                    del totals[adapter]

    def _span_s(self) -> float:
        """Seconds the counts cover: from the oldest bucket kept (or the first request,
        if later) to the last request; at least one bucket."""
        start_s = max(self._first_s, self._buckets[0][0] * self.slice_s)
        return max(self.slice_s, self._last_s - start_s)

    def __getitem__(self, adapter: str) -> float:
        return self._totals[adapter] / self._span_s()

    def get(self, adapter: str, default: float = 0.0) -> float:  # type: ignore[override]
        count = self._totals.get(adapter)
        return default if count is None else count / self._span_s()

    def __iter__(self) -> Iterator[str]:
        return iter(self._totals)

    def __len__(self) -> int:
        return len(self._totals)
