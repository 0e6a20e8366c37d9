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

Fencing: acting is more than being leader when a job starts. Before every write (the
plan ConfigMap, the hot sets, the state, the loads sent to pods) the controller calls
``fence(margin_s=api_timeout_s)``, which raises ``LeadershipLostError`` unless the last
renewal is young enough that a write begun now ends, or times out, before the renew
deadline: a solve that outlived the lease never publishes. A process paused between
that check and its write (a stopped container, a long GC) is the one gap a clock
cannot close, so each write also carries a fencing token, ``term`` (when this leader
acquired the lease): the ConfigMap adapters refuse to overwrite an object a later
term wrote (``placement.adapters.kube``). The timings are client-go's
(lease 15 s, renew deadline 10 s, retry every 2 s, and an API timeout, 5 s, shorter
than the renew deadline); ``placement.controller.config.lease_timing_problem`` checks
any others.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from placement.errors import KubeConflictError, KubeError, LeadershipLostError
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
        renew_deadline_s: float,
        clock: Callable[[], float],
        wall: Callable[[], datetime],
    ) -> None:
        self._store = store
        self.identity = identity
        self.duration_s = duration_s
        self.renew_deadline_s = renew_deadline_s
        self._clock = clock
        self._wall = wall
        self._sighting: Sighting | None = None
        self._renewed_ok_s: float | None = None
        self._term: float | None = None

    def is_leader(self) -> bool:
        """True while our last successful renewal is younger than the renew deadline."""
        if self._renewed_ok_s is None:
            return False
        age_s = self._clock() - self._renewed_ok_s
        return 0.0 <= age_s < self.renew_deadline_s

    def term(self) -> float | None:
        """The fencing token of our tenure: when we acquired the lease (Unix seconds),
        None while we do not lead. A later leader's term is larger."""
        return self._term if self.is_leader() else None

    def fence(self, *, margin_s: float) -> None:
        """Raise LeadershipLostError unless we lead with ``margin_s`` to spare before the
        renew deadline: a write started now ends before anyone else may act."""
        if self._renewed_ok_s is None:
            raise LeadershipLostError(f"{self.identity} does not hold the lease")
        age_s = self._clock() - self._renewed_ok_s
        if not 0.0 <= age_s < self.renew_deadline_s - margin_s:
            raise LeadershipLostError(
                f"{self.identity} last renewed the lease {age_s:.1f} s ago; a write now "
                f"could outlive the {self.renew_deadline_s:.0f} s renew deadline"
            )

    def tick(self) -> bool:
        """Acquire, renew or wait once. A refused or failed write means not leader."""
        now_s = self._clock()
        try:
            record = self._store.read()
            if record is not None:
                self._sighting = observe(self._sighting, record, now_s=now_s)
            move = decide(record, self._sighting, identity=self.identity, now_s=now_s)
            if move is not LeaseMove.WAIT:
                self._term = self._write(move, record)
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

    def _write(self, move: LeaseMove, record: LeaseRecord | None) -> float:
        """Make the move; the term it gives us (when we acquired the lease)."""
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
            return now.timestamp()
        if move is LeaseMove.RENEW:
            self._store.replace(replace(record, renewed_at=now, duration_s=self.duration_s))
            acquired = record.acquired_at
            if acquired is not None:
                return acquired.timestamp()
            return self._term if self._term is not None else now.timestamp()
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
        return now.timestamp()
