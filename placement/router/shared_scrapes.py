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
Their form, encoded and decoded, is ``router.scrape_files``'s.

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
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from placement.clock import Clock
from placement.domain import PodId
from placement.router.live_pods import LivePod
from placement.router.scrape_files import (
    LISTINGS,
    SNAPSHOT,
    Listing,
    PodReport,
    Snapshot,
    decode_listings,
    encode_listings,
    encode_reports,
    encode_snapshot,
    head_of,
    load_record,
    snapshot_of,
)
from placement.router.scraping import PodScraper

log = logging.getLogger("lorafleet.router")

#: A snapshot older than this many scrape intervals (plus a scrape's timeout) is stale.
STALE_ROUNDS = 4


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
            record = load_record(data)
            last, file = self._snapshot, self._snapshot_file
            generation, written_s = head_of(record)
            same = last is not None and generation == last.generation > 0
            if last is None or not same or file.inode != self._decoded_inode:
                last = snapshot_of(record)
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
