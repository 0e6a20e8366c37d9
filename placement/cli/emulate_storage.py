"""Where ``lorafleet emulate``'s pods read adapters from: a fleet.yaml pool's storage,
its fields overridden by ``--storage-kind``, ``--storage-bandwidth`` and
``--storage-first-byte-ms`` (or given by them where the pool has none), each bad flag a
problem naming it; and how that storage reads in the fleet.yaml and the note the
command prints.
"""

from __future__ import annotations

from pathlib import Path

from placement.domain import AdapterStorage
from placement.errors import InputError, Problem
from placement.inputs import load_fleet
from placement.inputs.fields import parse_bytes
from placement.inputs.fleet import STORAGE_KINDS


def storage_yaml(storage: AdapterStorage | None) -> list[str]:
    if storage is None:
        return []
    return [
        f"    storage: {{kind: {storage.kind}, bandwidth_per_s: {storage.bytes_per_s:.0f}, "
        f"first_byte_ms: {storage.first_byte_ms:g}}}"
    ]


def storage_note(storage: AdapterStorage | None) -> str:
    if storage is None:
        return "; adapters read as from local NVMe"
    return (
        f"; adapters read from {storage.kind} storage, {storage.first_byte_ms:g} ms to the "
        f"first byte, then {storage.bytes_per_s / 1e6:g} MB/s"
    )


def _pool_storage(fleet: Path | None, pool: str | None) -> AdapterStorage | None:
    """The storage of ``fleet``'s pool named ``pool`` (None: the first pool)."""
    if fleet is None:
        if pool is not None:
            raise InputError([Problem(source="--pool", message="a pool of --fleet; no --fleet")])
        return None
    pools = load_fleet(fleet).pools
    chosen = next((p for p in pools if pool is None or p.name == pool), None)
    if chosen is None:
        names = ", ".join(p.name for p in pools)
        message = f"{fleet} has no pool {pool!r} (it has {names})"
        raise InputError([Problem(source="--pool", message=message)])
    return chosen.storage


def _storage_overrides(
    kind: str | None, bandwidth: str | None, first_byte_ms: float | None
) -> tuple[dict[str, str | float], list[Problem]]:
    """The storage fields the flags give, and one problem per bad flag."""
    given: dict[str, str | float] = {}
    problems = []
    if kind is not None:
        if kind in STORAGE_KINDS:
            given["kind"] = kind
        else:
            message = f"expected one of {', '.join(STORAGE_KINDS)}, got {kind!r}"
            problems.append(Problem(source="--storage-kind", message=message))
    if bandwidth is not None:
        try:
            rate = parse_bytes(bandwidth)
        except ValueError as exc:
            problems.append(Problem(source="--storage-bandwidth", message=str(exc)))
        else:
            if rate > 0:
                given["bytes_per_s"] = float(rate)
            else:
                problems.append(Problem(source="--storage-bandwidth", message="must be above 0"))
    if first_byte_ms is not None:
        if first_byte_ms >= 0:
            given["first_byte_ms"] = first_byte_ms
        else:
            message = f"must be 0 or more, got {first_byte_ms:g}"
            problems.append(Problem(source="--storage-first-byte-ms", message=message))
    return given, problems


def pods_storage(
    *,
    fleet: Path | None,
    pool: str | None,
    kind: str | None,
    bandwidth: str | None,
    first_byte_ms: float | None,
) -> AdapterStorage | None:
    """The pods' storage: the fleet pool's, each flag given overriding its field."""
    base = _pool_storage(fleet, pool)
    given, problems = _storage_overrides(kind, bandwidth, first_byte_ms)
    if problems:
        raise InputError(problems)
    if base is None and not given:
        return None
    if base is None:
        missing = [flag for flag, key in _NEEDED if key not in given]
        if missing:
            message = f"a storage needs {' and '.join(missing)} (no --fleet pool gives one)"
            raise InputError([Problem(source="emulate", message=message)])
        base = AdapterStorage(kind="", bytes_per_s=0.0)
    return AdapterStorage(
        kind=str(given.get("kind", base.kind)),
        bytes_per_s=float(given.get("bytes_per_s", base.bytes_per_s)),
        first_byte_ms=float(given.get("first_byte_ms", base.first_byte_ms)),
    )


_NEEDED = (("--storage-kind", "kind"), ("--storage-bandwidth", "bytes_per_s"))
