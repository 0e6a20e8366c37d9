"""Leader election over a Lease, so that two controller replicas never both act.

The decision (``decide``) is pure. ``LeaderElector`` around it reads and writes the
lease through a ``LeaseStore`` port and keeps what it observed.

Expiry is judged the way client-go judges it: not from the ``renewTime`` another
replica wrote (its clock may differ from ours), but from how long the lease has
stayed unchanged as seen on our own monotonic clock. A follower takes over only
after it saw the same record for a whole ``duration_s``; the holder stops acting
once ``renew_deadline_s`` (shorter) passed since its last successful renewal. The
holder's last write precedes the follower's first sight of it, so their windows
never overlap while both clocks run at the same rate.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from placement.errors import KubeConflictError, KubeError
from placement.ports import LeaseRecord, LeaseStore


class LeaseMove(enum.Enum):
    CREATE = "create"
    RENEW = "renew"
    TAKE_OVER = "take_over"
    WAIT = "wait"


@dataclass(frozen=True, kw_only=True)
class Sighting:
    """A lease record as first seen, on our monotonic clock."""

    version: str | None
    holder: str | None
    renewed_at: datetime | None
    seen_at_s: float

    def same_record(self, record: LeaseRecord) -> bool:
        return (self.version, self.holder, self.renewed_at) == (
            record.version,
            record.holder,
            record.renewed_at,
        )


def observe(previous: Sighting | None, record: LeaseRecord, *, now_s: float) -> Sighting:
    """The sighting after reading ``record``: kept if unchanged, else restarted at ``now_s``."""
    if previous is not None and previous.same_record(record):
        return previous
    return Sighting(
        version=record.version, holder=record.holder, renewed_at=record.renewed_at, seen_at_s=now_s
    )


def decide(
    record: LeaseRecord | None, sighting: Sighting | None, *, identity: str, now_s: float
) -> LeaseMove:
    """What to do with the lease. Pure: the record, what we saw of it, and the time."""
    if record is None:
        return LeaseMove.CREATE
    if record.holder == identity:
        return LeaseMove.RENEW
    if not record.holder:
        return LeaseMove.TAKE_OVER
    if sighting is not None and now_s - sighting.seen_at_s >= record.duration_s:
        return LeaseMove.TAKE_OVER
    return LeaseMove.WAIT


class LeaderElector:
    """Acquires, renews and takes over one lease; ``is_leader`` says whether to act now."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        identity: str,
        duration_s: int,
        renew_deadline_s: float | None = None,
        clock: Callable[[], float],
        wall: Callable[[], datetime],
    ) -> None:
        self._store = store
        self.identity = identity
        self.duration_s = duration_s
        self.renew_deadline_s = (
            renew_deadline_s if renew_deadline_s is not None else duration_s * 2 / 3
        )
        self._clock = clock
        self._wall = wall
        self._sighting: Sighting | None = None
        self._renewed_ok_s: float | None = None

    def is_leader(self) -> bool:
        """True while our last successful renewal is younger than the renew deadline."""
        if self._renewed_ok_s is None:
            return False
        age_s = self._clock() - self._renewed_ok_s
        return 0.0 <= age_s < self.renew_deadline_s

    def tick(self) -> bool:
        """Acquire, renew or wait once. A refused or failed write means not leader."""
        now_s = self._clock()
        try:
            record = self._store.read()
            if record is not None:
                self._sighting = observe(self._sighting, record, now_s=now_s)
            move = decide(record, self._sighting, identity=self.identity, now_s=now_s)
            if move is not LeaseMove.WAIT:
                self._write(move, record)
                self._renewed_ok_s = now_s
        except KubeConflictError:
            # Someone else wrote first: they hold it until we see it unchanged long enough.
            self._renewed_ok_s = None
        except KubeError:
            # Keep acting only within the renew deadline of the last success.
            pass
        return self.is_leader()

    def release(self) -> None:
        """Give the lease up at shutdown so a standby takes over at once."""
        self._renewed_ok_s = None
        try:
            record = self._store.read()
            if record is not None and record.holder == self.identity:
                self._store.replace(replace(record, holder=None))
        except KubeError:
            pass

    def _write(self, move: LeaseMove, record: LeaseRecord | None) -> None:
        now = self._wall()
        if move is LeaseMove.CREATE or record is None:
            self._store.create(
                LeaseRecord(
                    holder=self.identity,
                    duration_s=self.duration_s,
                    acquired_at=now,
                    renewed_at=now,
                    transitions=0,
                )
            )
            return
        if move is LeaseMove.RENEW:
            self._store.replace(replace(record, renewed_at=now, duration_s=self.duration_s))
            return
        self._store.replace(
            replace(
                record,
                holder=self.identity,
                duration_s=self.duration_s,
                acquired_at=now,
                renewed_at=now,
                transitions=record.transitions + 1,
            )
        )
