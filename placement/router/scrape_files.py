"""The shared scrape files' form: what worker 0 writes and the other workers decode.

``scrapes.json`` (``SNAPSHOT``) holds a ``Snapshot``: its generation, its time and one
``PodReport`` per pod (the scraper's verdict and the pod's parsed ``PodMetrics``), as
compact JSON lists; ``listings.json`` (``LISTINGS``) each pod's numbered ``Listing``
(its ``/v1/models``). Both carry a format version. Decoding checks every field's type
and raises ``SnapshotError`` naming the pod and the field.

Pure: bytes in, values out. Must not read or write files, nor decide who scrapes: that
is ``router.shared_scrapes``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from placement.domain import AdapterId, PodId
from placement.ports import PodMetrics

SNAPSHOT = "scrapes.json"
LISTINGS = "listings.json"
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


def load_record(data: bytes) -> dict[str, Any]:
    try:
        record = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"not JSON: {exc}") from None
    if not isinstance(record, dict) or record.get("v") != _FORMAT:
        raise SnapshotError(f"not a version {_FORMAT} record")
    return record


def decode_snapshot(data: bytes) -> Snapshot:
    """``scrapes.json``'s bytes; ``SnapshotError`` saying what is wrong."""
    return snapshot_of(load_record(data))


def head_of(record: dict[str, Any]) -> tuple[int, float]:
    """A snapshot record's generation and time."""
    generation = int(_of(int, record.get("g", 0), "its generation"))
    return generation, float(_of((int, float), record.get("t"), "its time"))


def snapshot_of(record: dict[str, Any]) -> Snapshot:
    generation, written_s = head_of(record)
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
    for pod, entry in _of(dict, load_record(data).get("pods"), "its pods").items():
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
