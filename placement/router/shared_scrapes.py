"""One scrape of the pods for all router workers: worker 0 scrapes, the others read.

With ``--workers N`` every worker used to scrape every pod's ``/metrics`` each
``scrape_interval_s`` and parse the Prometheus text, and read each ``/v1/models`` every
``listing_every_scrapes``: N times the same fixed work, a larger share of each
worker's CPU as proxied requests got cheaper. Now worker 0 (``ScrapePublisher``)
scrapes as before and, after each round, writes what it learnt into the workers'
shared directory: each pod's verdict (healthy, fresh metrics this round, why it left
the rotation, ``/metrics`` missing) and its parsed ``PodMetrics`` in ``scrapes.json``;
the listings, numbered per pod, in ``listings.json`` whenever it read one. Each file
is written whole under a temporary name and renamed over the last.

The snapshot carries a generation, raised only when some pod's report changed: a round
that learnt nothing new (idle pods report the same figures round after round) does not
rewrite the file but sets its mtime (``os.utime``, on the scraper's clock), and a
reader takes the later of the two as the snapshot's time.

The other workers (``ScrapeFollower``) read those files on their own scrape rounds: a
stat per file, and a read only when the file changed (a new inode, size or mtime); the
pods' reports are decoded only when the generation moved. They apply each pod's
report on every round the snapshot is current, as a scrape would (``PodScraper.take``:
``observe``, the health verdict, the listing into the ledger), with their own requests
in flight kept, and each listing once. A heartbeat keeps the file (its inode); a
changed report makes a new one, so a follower decodes again when either the generation
or the inode moved (a restarted scraper counts from 1 again).

A worker scrapes a pod itself when the snapshot has no word of it (a pod it knows and
the scraper does not yet, another URL), when its own listing of the pod is due (it was
told "already loaded" of a name it did not know), and every pod when the snapshot is
missing, unreadable (a warning names the file) or stale: older than ``STALE_ROUNDS``
scrape intervals plus a scrape's timeout (the scraper is dead or stuck), so that no
worker is ever blind.

Must not scrape over HTTP or judge health itself: that is ``router.scraping``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from placement.clock import Clock
from placement.domain import AdapterId, PodId
from placement.ports import PodMetrics
from placement.router.live_pods import LivePod
from placement.router.scraping import PodScraper

log = logging.getLogger("lorafleet.router")

SNAPSHOT = "scrapes.json"
LISTINGS = "listings.json"
#: A snapshot older than this many scrape intervals (plus a scrape's timeout) is stale.
STALE_ROUNDS = 4
_FORMAT = 1


class SnapshotError(ValueError):
    """A shared scrape file that is not what the scraper writes."""


@dataclass(frozen=True, slots=True)
class PodReport:
    """One pod as the scraper's last round left it."""

    pod: PodId
    url: str
    #: This round's scrape succeeded: ``metrics`` are new.
    fresh: bool
    healthy: bool
    #: Why the pod left the rotation (its last failure), empty when it has not.
    why: str
    metrics_missing: bool
    metrics: PodMetrics


@dataclass(frozen=True, slots=True)
class Snapshot:
    #: When the scraper last wrote it or found it unchanged (system clock seconds).
    written_s: float
    pods: Mapping[PodId, PodReport]
    #: Raised by the scraper whenever some pod's report changed.
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Listing:
    """A pod's ``/v1/models`` as the scraper read it: its ``seq``-th listing."""

    seq: int
    adapters: Mapping[AdapterId, str]


# -- the files' form -----------------------------------------------------------------


def _metrics_out(m: PodMetrics) -> list[Any]:
    return [m.running, m.waiting, m.kv_usage, sorted(m.running_adapters),
            sorted(m.waiting_adapters), m.max_loras, m.lora_slots_used, m.lora_slots_total,
            m.healthy]  # fmt: skip


def encode_reports(pods: Mapping[PodId, PodReport]) -> bytes:
    """The pods' part of a snapshot (what its generation numbers)."""
    reports = [
        [r.pod, r.url, r.fresh, r.healthy, r.why, r.metrics_missing, _metrics_out(r.metrics)]
        for r in pods.values()
    ]
    return json.dumps(reports, separators=(",", ":")).encode()


def encode_snapshot(snapshot: Snapshot, *, reports: bytes | None = None) -> bytes:
    """``scrapes.json``'s bytes; ``reports``: ``encode_reports(snapshot.pods)`` if made."""
    head = {"v": _FORMAT, "g": snapshot.generation, "t": snapshot.written_s}
    pods = encode_reports(snapshot.pods) if reports is None else reports
    return json.dumps(head, separators=(",", ":")).encode()[:-1] + b',"pods":' + pods + b"}"


def encode_listings(listings: Mapping[PodId, Listing]) -> bytes:
    record = {pod: [listing.seq, dict(listing.adapters)] for pod, listing in listings.items()}
    return json.dumps({"v": _FORMAT, "pods": record}, separators=(",", ":")).encode()


def _of(kind: type | tuple[type, ...], value: Any, what: str) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise SnapshotError(f"{what} is {value!r}")
    return value


def _optional_int(value: Any, what: str) -> int | None:
    return None if value is None else int(_of(int, value, what))


def _names(value: Any, what: str) -> frozenset[AdapterId]:
    return frozenset(AdapterId(_of(str, name, what)) for name in _of(list, value, what))


def _metrics_in(value: Any, pod: str) -> PodMetrics:
    fields = _of(list, value, f"pod {pod}'s metrics")
    if len(fields) != 9:
        raise SnapshotError(f"pod {pod}'s metrics have {len(fields)} fields, not 9")
    running, waiting, kv, run_a, wait_a, max_loras, used, total, healthy = fields
    kv_usage = float(_of((int, float), kv, f"pod {pod}'s kv_usage"))
    if not math.isfinite(kv_usage):
        raise SnapshotError(f"pod {pod}'s kv_usage is {kv_usage}")
    return PodMetrics(
        running=int(_of(int, running, f"pod {pod}'s running")),
        waiting=int(_of(int, waiting, f"pod {pod}'s waiting")),
        kv_usage=kv_usage,
        running_adapters=_names(run_a, f"pod {pod}'s running adapters"),
        waiting_adapters=_names(wait_a, f"pod {pod}'s waiting adapters"),
        max_loras=_optional_int(max_loras, f"pod {pod}'s max_loras"),
        lora_slots_used=_optional_int(used, f"pod {pod}'s lora_slots_used"),
        lora_slots_total=_optional_int(total, f"pod {pod}'s lora_slots_total"),
        healthy=bool(_of(bool, healthy, f"pod {pod}'s metrics' healthy")),
    )


def _load(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"not JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("v") != _FORMAT:
        raise SnapshotError(f"not a version {_FORMAT} record")
    return record


def decode_snapshot(data: bytes) -> Snapshot:
    """``scrapes.json``'s bytes; ``SnapshotError`` saying what is wrong."""
    return _snapshot_of(_load(data))


def _head_of(record: dict[str, Any]) -> tuple[int, float]:
    """A snapshot record's generation and time."""
    generation = int(_of(int, record.get("g", 0), "its generation"))
    return generation, float(_of((int, float), record.get("t"), "its time"))


def _snapshot_of(record: dict[str, Any]) -> Snapshot:
    generation, written_s = _head_of(record)
    pods: dict[PodId, PodReport] = {}
    for entry in _of(list, record.get("pods"), "its pods"):
        fields = _of(list, entry, "a pod's record")
        if len(fields) != 7:
            raise SnapshotError(f"a pod's record has {len(fields)} fields, not 7")
        pod = PodId(_of(str, fields[0], "a pod's name"))
        pods[pod] = PodReport(
            pod=pod,
            url=_of(str, fields[1], f"pod {pod}'s url"),
            fresh=_of(bool, fields[2], f"pod {pod}'s fresh"),
            healthy=_of(bool, fields[3], f"pod {pod}'s healthy"),
            why=_of(str, fields[4], f"pod {pod}'s why"),
            metrics_missing=_of(bool, fields[5], f"pod {pod}'s metrics_missing"),
            metrics=_metrics_in(fields[6], pod),
        )
    return Snapshot(written_s=written_s, pods=MappingProxyType(pods), generation=generation)


def decode_listings(data: bytes) -> dict[PodId, Listing]:
    """``listings.json``'s bytes; ``SnapshotError`` saying what is wrong."""
    listings: dict[PodId, Listing] = {}
    for pod, entry in _of(dict, _load(data).get("pods"), "its pods").items():
        listing = _of(list, entry, f"pod {pod}'s listing")
        if len(listing) != 2:
            raise SnapshotError(f"pod {pod}'s listing is not [number, adapters]: {listing!r:.80}")
        seq, adapters = listing
        paths = _of(dict, adapters, f"pod {pod}'s adapters")
        for name, path in paths.items():
            _of(str, path, f"pod {pod}'s path of {name}")
        listings[PodId(pod)] = Listing(
            seq=int(_of(int, seq, f"pod {pod}'s listing number")),
            adapters=MappingProxyType({AdapterId(n): p for n, p in paths.items()}),
        )
    return listings


def write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all: a reader sees the last file or this."""
    temporary = f"{path.parent}/.{path.name}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(temporary, path)


class _Changed:
    """A file's bytes when it changed since the last read (a stat otherwise)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        #: The file's inode and mtime (system clock seconds) at the last read.
        self.inode = 0
        self.mtime_s = 0.0

    def read(self) -> bytes | None:
        """The new bytes; None when unchanged; ``FileNotFoundError`` when missing."""
        stat = os.stat(self.path)
        seen = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if seen == self._seen:
            return None
        self._seen = seen
        self.inode, self.mtime_s = stat.st_ino, stat.st_mtime
        return self.path.read_bytes()


# -- the two roles -------------------------------------------------------------------


class ScrapePublisher:
    """Worker 0: scrapes every pod itself and writes what it learnt for the others."""

    def __init__(self, directory: Path, *, scraper: PodScraper, clock: Clock) -> None:
        self.snapshot_path = directory / SNAPSHOT
        self.listings_path = directory / LISTINGS
        self.scraper = scraper
        self.clock = clock
        self._listings: dict[PodId, Listing] = {}
        self._generation = 0
        #: The pods' part of the last snapshot written (None: none yet).
        self._reports: bytes | None = None
        scraper.keeps_listings = True

    def follow(self, states: Sequence[LivePod]) -> list[LivePod]:
        """The pods to scrape this round: all of them."""
        return list(states)

    def publish(self, states: Sequence[LivePod], fresh: Sequence[bool]) -> None:
        """After a round over ``states`` (``fresh``: which scrapes succeeded)."""
        scraper, known = self.scraper, {state.pod_id for state in states}
        read, scraper.listings_read = scraper.listings_read, {}
        for pod, adapters in read.items():
            last = self._listings.get(pod)
            self._listings[pod] = Listing((last.seq if last else 0) + 1, adapters)
        gone = [pod for pod in self._listings if pod not in known]
        for pod in gone:
            del self._listings[pod]
        if read or gone:  # first: a reader that sees the new snapshot finds its listings
            write_whole(self.listings_path, encode_listings(self._listings))
        reports = {
            PodId(state.pod_id): PodReport(
                pod=PodId(state.pod_id),
                url=state.upstream.url,
                fresh=ok,
                healthy=state.healthy,
                why="" if state.healthy else scraper.why.get(state.upstream.pod, ""),
                metrics_missing=state.metrics_missing,
                metrics=state.metrics,
            )
            for state, ok in zip(states, fresh, strict=True)
        }
        self._write(reports)

    def _write(self, reports: Mapping[PodId, PodReport]) -> None:
        """A new snapshot if some report changed, else the last one's mtime moved on."""
        encoded = encode_reports(reports)
        if encoded == self._reports:
            now_s = self.clock()
            try:
                os.utime(self.snapshot_path, (now_s, now_s))
                return
            except FileNotFoundError:  # removed under it: written again below
                pass
        else:
            self._generation += 1
        snapshot = Snapshot(written_s=self.clock(), pods=reports, generation=self._generation)
        write_whole(self.snapshot_path, encode_snapshot(snapshot, reports=encoded))
        self._reports = encoded


class ScrapeFollower:
    """Workers 1..N-1: learn the pods from the publisher's files, scrape only where
    those say nothing (or nothing recent)."""

    def __init__(
        self, directory: Path, *, scraper: PodScraper, clock: Clock, stale_after_s: float
    ) -> None:
        self.scraper = scraper
        self.clock = clock
        self.stale_after_s = stale_after_s
        self._snapshot_file = _Changed(directory / SNAPSHOT)
        self._listings_file = _Changed(directory / LISTINGS)
        self._snapshot: Snapshot | None = None
        #: The inode of the file ``_snapshot`` was decoded from.
        self._decoded_inode = -1
        self._listings: dict[PodId, Listing] = {}
        self._applied: dict[PodId, int] = {}
        #: Whether the last round scraped every pod itself (for the log's transitions).
        self.blind = False

    def publish(self, states: Sequence[LivePod], fresh: Sequence[bool]) -> None:
        """Nothing: only the publisher writes."""

    def follow(self, states: Sequence[LivePod]) -> list[LivePod]:
        """Apply what changed in the publisher's files; the pods to scrape itself."""
        new = self._read_snapshot()
        snapshot = self._snapshot
        stale = snapshot is None or self.clock() - snapshot.written_s > self.stale_after_s
        self._fall_back(stale, snapshot)
        if stale or snapshot is None:
            return list(states)
        self._read_listings()
        own: list[LivePod] = []
        for state in states:
            report = snapshot.pods.get(PodId(state.pod_id))
            if report is None or report.url != state.upstream.url or state.listing_due:
                own.append(state)
                continue
            listing = self._listings.get(report.pod)
            if listing is not None and self._applied.get(report.pod) != listing.seq:
                self._applied[report.pod] = listing.seq
                self.scraper.take_listing(state, listing.adapters)
            if new:
                self.scraper.take(state, report)
        return own

    def _read_snapshot(self) -> bool:
        """Whether the snapshot was read anew (a missing or bad one forgets the last).
        A snapshot of the generation already decoded only moves its time on."""
        try:
            data = self._snapshot_file.read()
            if data is None:
                return False
            record = _load(data)
            last, file = self._snapshot, self._snapshot_file
            generation, written_s = _head_of(record)
            same = last is not None and generation == last.generation > 0
            if last is None or not same or file.inode != self._decoded_inode:
                last = _snapshot_of(record)
                self._decoded_inode = file.inode
            # A heartbeat moved the file's mtime, not its time inside.
            self._snapshot = replace(last, written_s=max(written_s, file.mtime_s))
            return True
        except FileNotFoundError:
            self._snapshot = None
        except (OSError, ValueError) as exc:  # SnapshotError is a ValueError
            log.warning(
                "the shared scrape snapshot %s is unreadable (%s): scraping the pods myself",
                self._snapshot_file.path,
                exc,
            )
            self._snapshot = None
        return False

    def _read_listings(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            try:
                data = self._listings_file.read()
                if data is not None:
                    self._listings = decode_listings(data)
            except FileNotFoundError:
                raise  # none written yet: not a warning
            except (OSError, ValueError) as exc:
                log.warning(
                    "the shared listings %s are unreadable (%s): keeping the last",
                    self._listings_file.path,
                    exc,
                )

    def _fall_back(self, stale: bool, snapshot: Snapshot | None) -> None:
        if stale and not self.blind and snapshot is not None:
            age_s = self.clock() - snapshot.written_s
            log.warning(
                "the shared scrape snapshot %s is %.1f s old: scraping the pods myself",
                self._snapshot_file.path,
                age_s,
            )
        elif not stale and self.blind:
            log.info("the shared scrape snapshot %s is current again", self._snapshot_file.path)
        self.blind = stale


def stale_after_s(*, scrape_interval_s: float, scrape_timeout_s: float) -> float:
    """How old a snapshot may be before a follower scrapes itself."""
    return STALE_ROUNDS * scrape_interval_s + scrape_timeout_s
