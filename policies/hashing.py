"""Consistent hashing of adapter ids onto pods: the affine tier's owners.

Owns the ring and the lookup of an adapter's replica pods. Pure: the ring is a frozen
value built once from pod ids; adding or removing a pod moves about 1/N of adapters.
Must not know about pod load or residency: that is the router's business.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Virtual nodes per pod: enough that adapters spread evenly over a handful of pods.
DEFAULT_VNODES = 64


def _point(key: str) -> int:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True, kw_only=True, slots=True)
class HashRing:
    """Sorted ring points and the pod owning each point."""

    points: tuple[int, ...]
    owners: tuple[str, ...]
    pod_ids: tuple[str, ...]
    #: A memo of lookups: the ring never changes, so neither do the answers.
    _memo: dict[tuple[str, int], tuple[str, ...]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def replicas(self, adapter: str, count: int) -> tuple[str, ...]:
        """The first ``count`` distinct pods clockwise from the adapter's point."""
        key = (adapter, count)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._walk(adapter, count)
        return found

    def _walk(self, adapter: str, count: int) -> tuple[str, ...]:
        wanted = min(count, len(self.pod_ids))
        if wanted <= 0:
            return ()
        found: list[str] = []
        start = bisect_right(self.points, _point(adapter))
        size = len(self.points)
        for step in range(size):
            pod_id = self.owners[(start + step) % size]
            if pod_id not in found:
                found.append(pod_id)
                if len(found) == wanted:
                    break
        return tuple(found)


def build_ring(pod_ids: Iterable[str], *, vnodes: int = DEFAULT_VNODES) -> HashRing:
    """A ring over ``pod_ids`` with ``vnodes`` points per pod (order does not matter)."""
    unique = tuple(sorted(set(pod_ids)))
    pairs = sorted(
        (_point(f"{pod_id}#{index}"), pod_id) for pod_id in unique for index in range(vnodes)
    )
    return HashRing(
        points=tuple(point for point, _ in pairs),
        owners=tuple(pod_id for _, pod_id in pairs),
        pod_ids=unique,
    )
