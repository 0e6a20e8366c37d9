"""Faults a replay meets: pods restarting empty, pods gone for a while, slow loads.

A fault spec (``lorafleet replay --faults``) is a YAML file or an inline list of
comma-separated items:

- ``restart=POD@T``: the pod restarts empty at ``T`` (its adapters gone; the requests
  it runs finish, those it queues are loaded again);
- ``outage=POD@T+M``: the pod is gone from ``T`` for ``M`` minutes (its queue routed
  elsewhere, no request reaches it), then comes back empty;
- ``slow=F@T+M``: adapter loads starting in that window take ``F`` times as long
  (``slow=F@T+M@POD`` on one pod only);
- ``seed=N``, ``restarts=K``, ``outages=K``, ``slowdowns=K``: K more of each at pods
  and times drawn from ``random.Random(N)`` over the log's span (``outage_minutes``,
  ``slow_factor``, ``slow_minutes`` size them).

``T`` is an offset from the first request (``90s``, ``30m``, ``2h``). The YAML file has
the same keys, with ``restart``, ``outage`` and ``slow`` as lists. ``schedule`` turns a
spec into the same ``FaultStep`` values for every policy, deterministic for a seed.
Pure: the CLI reads the file.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from placement.errors import InputError, Problem

RESTART, DOWN, UP = "restart", "down", "up"
_OFFSET = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
_COUNTS = ("restarts", "outages", "slowdowns")
_SIZES = {"outage_minutes": 10.0, "slow_factor": 3.0, "slow_minutes": 15.0}


@dataclass(frozen=True, kw_only=True)
class FaultStep:
    """One change to one pod at one moment (replay seconds)."""

    at_s: float
    kind: str
    pod_id: str


@dataclass(frozen=True, kw_only=True)
class Slowdown:
    """Loads starting in ``[start_s, end_s)`` take ``factor`` times as long."""

    start_s: float
    end_s: float
    factor: float
    pod_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    restarts: tuple[tuple[str, float], ...] = ()
    outages: tuple[tuple[str, float, float], ...] = ()
    slowdowns: tuple[Slowdown, ...] = ()
    seed: int = 0
    random_counts: Mapping[str, int] = field(default_factory=dict)
    sizes: Mapping[str, float] = field(default_factory=lambda: dict(_SIZES))


@dataclass(frozen=True, kw_only=True)
class FaultSchedule:
    steps: tuple[FaultStep, ...] = ()
    slowdowns: tuple[Slowdown, ...] = ()

    def describe(self) -> str:
        kinds = [step.kind for step in self.steps]
        return (
            f"{kinds.count(RESTART)} restarts, {kinds.count(DOWN)} outages,"
            f" {len(self.slowdowns)} slowdowns"
        )

    def load_factor(self, pod_id: str, now_s: float) -> float:
        factor = 1.0
        for slow in self.slowdowns:
            if slow.start_s <= now_s < slow.end_s and slow.pod_id in (None, pod_id):
                factor *= slow.factor
        return factor


def _bad(source: str, item: str, why: str) -> InputError:
    return InputError([Problem(source=source, entry=item, message=why)])


def _offset_s(text: str, source: str, item: str) -> float:
    found = _OFFSET.match(text.strip())
    if found is None:
        raise _bad(source, item, f"{text!r} is not an offset such as 90s, 30m or 2h")
    return float(found.group(1)) * _UNIT_S[found.group(2)]


def _number(text: object, source: str, item: str) -> float:
    try:
        value = float(str(text))
    except ValueError:
        raise _bad(source, item, f"{text!r} is not a number") from None
    if not value >= 0:  # negative, or NaN
        raise _bad(source, item, f"{text!r} must be a number at least 0")
    return value


@dataclass
class _Parts:
    """A spec being read, item by item."""

    restarts: list[tuple[str, float]] = field(default_factory=list)
    outages: list[tuple[str, float, float]] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)
    seed: int = 0
    random_counts: dict[str, int] = field(default_factory=dict)
    sizes: dict[str, float] = field(default_factory=lambda: dict(_SIZES))

    def spec(self) -> FaultSpec:
        return FaultSpec(
            restarts=tuple(self.restarts),
            outages=tuple(self.outages),
            slowdowns=tuple(self.slowdowns),
            seed=self.seed,
            random_counts=dict(self.random_counts),
            sizes=dict(self.sizes),
        )


def _item(key: str, value: str, source: str, parts: _Parts) -> None:
    item = f"{key}={value}"
    if key == "restart":
        pod, _, at = value.partition("@")
        parts.restarts.append((pod, _offset_s(at, source, item)))
    elif key in ("outage", "slow"):
        head, _, rest = value.partition("@")
        at, _, tail = rest.partition("+")
        minutes, _, pod = tail.partition("@")
        start_s = _offset_s(at, source, item)
        length_s = _number(minutes, source, item) * 60.0
        if key == "outage":
            parts.outages.append((head, start_s, length_s))
        else:
            factor = _number(head.rstrip("x"), source, item)
            parts.slowdowns.append(
                Slowdown(
                    start_s=start_s, end_s=start_s + length_s, factor=factor, pod_id=pod or None
                )
            )
    elif key == "seed":
        parts.seed = int(_number(value, source, item))
    elif key in _COUNTS:
        parts.random_counts[key] = int(_number(value, source, item))
    elif key in _SIZES:
        parts.sizes[key] = _number(value, source, item)
    else:
        known = ", ".join(("restart", "outage", "slow", "seed", *_COUNTS, *_SIZES))
        raise _bad(source, item, f"unknown key {key!r}; use {known}")


def parse_inline(text: str, *, source: str = "--faults") -> FaultSpec:
    """An inline spec: ``restart=pod-1@30m,outage=pod-2@1h+15,seed=7,restarts=2``."""
    parts = _Parts()
    for raw in (piece.strip() for piece in text.split(",")):
        if not raw:
            continue
        key, sep, value = raw.partition("=")
        if not sep:
            raise _bad(source, raw, "expected key=value")
        _item(key.strip(), value.strip(), source, parts)
    return parts.spec()


def parse_yaml(raw: object, *, source: str) -> FaultSpec:
    """A YAML spec, already loaded: the inline keys, ``restart``/``outage``/``slow`` as
    lists of their inline values."""
    if not isinstance(raw, Mapping):
        raise _bad(source, "top", "expected a mapping of fault keys")
    parts = _Parts()
    for key, value in raw.items():
        values = value if isinstance(value, list) else [value]
        for one in values:
            _item(str(key), str(one), source, parts)
    return parts.spec()


def schedule(spec: FaultSpec, pod_ids: Sequence[str], duration_s: float) -> FaultSchedule:
    """The spec's faults and its seeded random ones, as steps in time order."""
    known = set(pod_ids)
    unknown = sorted(
        {pod for pod, _ in spec.restarts}
        | {pod for pod, _, _ in spec.outages}
        | {slow.pod_id for slow in spec.slowdowns if slow.pod_id is not None}
    )
    unknown = [pod for pod in unknown if pod not in known]
    if unknown:
        raise InputError(
            [Problem(source="--faults", message=f"no pod {pod!r} in the fleet") for pod in unknown]
        )
    rng = random.Random(spec.seed)
    counts = spec.random_counts
    sizes = spec.sizes
    restarts = list(spec.restarts)
    outages = list(spec.outages)
    slowdowns = list(spec.slowdowns)
    for _ in range(counts.get("restarts", 0)):
        restarts.append((rng.choice(list(pod_ids)), rng.uniform(0.0, duration_s)))
    for _ in range(counts.get("outages", 0)):
        at_s = rng.uniform(0.0, duration_s)
        outages.append((rng.choice(list(pod_ids)), at_s, sizes["outage_minutes"] * 60.0))
    for _ in range(counts.get("slowdowns", 0)):
        at_s = rng.uniform(0.0, duration_s)
        slowdowns.append(
            Slowdown(
                start_s=at_s,
                end_s=at_s + sizes["slow_minutes"] * 60.0,
                factor=sizes["slow_factor"],
            )
        )
    steps = [FaultStep(at_s=at_s, kind=RESTART, pod_id=pod) for pod, at_s in restarts]
    for pod, at_s, length_s in outages:
        steps.append(FaultStep(at_s=at_s, kind=DOWN, pod_id=pod))
        steps.append(FaultStep(at_s=at_s + length_s, kind=UP, pod_id=pod))
    ordered = sorted(steps, key=lambda step: (step.at_s, step.pod_id, step.kind))
    return FaultSchedule(steps=tuple(ordered), slowdowns=tuple(slowdowns))
