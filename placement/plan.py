"""The plan: the one artefact every part of lorafleet shares, and its JSON form.

A plan says, per pod, which adapters are hot (on a GPU slot), warm (registered in
host RAM) and pinned, and per adapter its tier, its replica pods and the share of
its traffic each takes, and (optional, since schema 1 grew them) the forecast rates it
was solved from, which the router weighs a load's victim by. ``schema_version``
changes only with a migration in ``plan_from_dict``; an optional field may be added
within a version, and a plan without it still reads. The JSON Schema is
``placement/schemas/plan.schema.json``.

Pure: conversion and queries only. Reading and writing files is the caller's.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from placement.domain import AdapterId, PodId, Tier
from placement.errors import InputError, PlanError, Problem

SCHEMA_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class PodPlan:
    hot: tuple[AdapterId, ...] = ()
    warm: tuple[AdapterId, ...] = ()
    pinned: tuple[AdapterId, ...] = ()
    hbm_bytes_used: int = 0
    host_bytes_used: int = 0
    expected_rps: float = 0.0
    #: GPU slots the plan leaves to the engine's dynamic cache (the tail reserve): the
    #: router and the replay never fill them with planned adapters, so ``hot`` holds at
    #: most the pod's slots less these, pins excepted. 0 in plans written before it.
    reserved_slots: int = 0

    @property
    def registered(self) -> tuple[AdapterId, ...]:
        """Hot then warm: everything the pod should hold in its host cache."""
        return self.hot + self.warm


@dataclass(frozen=True, kw_only=True)
class AdapterPlan:
    tier: Tier
    #: For a hot adapter, the share of its traffic each replica takes (sums to 1);
    #: for a warm one, the pods that hold it registered, weighted alike.
    pods: Mapping[PodId, float] = field(default_factory=lambda: MappingProxyType({}))
    #: The forecast the plan was solved from, over its window (req/s): the mean and
    #: the 90th percentile. None in plans written before they were recorded.
    mean_rps: float | None = None
    q90_rps: float | None = None


@dataclass(frozen=True, kw_only=True)
class Preload:
    at: datetime
    pod: PodId
    adapter: AdapterId
    reason: str


@dataclass(frozen=True, kw_only=True)
class SolverReport:
    status: str
    objective: float
    bound: float
    gap: float
    #: Seconds the solve took: the wall clock's; for a reproducible solve (a replay's
    #: planner, ``placement.solver.timing``) CP-SAT's deterministic time in seconds.
    wall_s: float


@dataclass(frozen=True, kw_only=True)
class Plan:
    id: str
    created_at: datetime
    valid_from: datetime
    valid_until: datetime
    pods: Mapping[PodId, PodPlan]
    adapters: Mapping[AdapterId, AdapterPlan]
    preloads: tuple[Preload, ...] = ()
    predicted: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    solver: SolverReport = field(
        default_factory=lambda: SolverReport(
            status="NONE", objective=0.0, bound=0.0, gap=0.0, wall_s=0.0
        )
    )
    why: Mapping[AdapterId, str] = field(default_factory=lambda: MappingProxyType({}))
    inputs_digest: str = ""
    schema_version: int = SCHEMA_VERSION

    def hot_pods(self, adapter: AdapterId) -> Mapping[PodId, float]:
        """The pods that serve ``adapter`` from a GPU slot, with their weights."""
        entry = self.adapters.get(adapter)
        if entry is None or entry.tier is not Tier.HOT:
            return {}
        return entry.pods

    def forecast_rps(self) -> dict[AdapterId, float]:
        """Each adapter's forecast mean rate (req/s), for the adapters the plan records
        one for (none in an older plan)."""
        return {
            name: entry.mean_rps
            for name, entry in self.adapters.items()
            if entry.mean_rps is not None
        }

    def tier_of(self, adapter: AdapterId) -> Tier:
        entry = self.adapters.get(adapter)
        return Tier.COLD if entry is None else entry.tier

    def placement(self) -> dict[PodId, dict[AdapterId, Tier]]:
        """Per pod, the tier of every adapter it holds."""
        placed: dict[PodId, dict[AdapterId, Tier]] = {}
        for pod_id, pod_plan in self.pods.items():
            tiers = {adapter: Tier.WARM for adapter in pod_plan.warm}
            tiers.update({adapter: Tier.HOT for adapter in pod_plan.hot})
            placed[pod_id] = tiers
        return placed


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as JSON-ready data, with keys in a stable order."""
    return {
        "schema_version": plan.schema_version,
        "id": plan.id,
        "inputs_digest": plan.inputs_digest,
        "created_at": _iso(plan.created_at),
        "valid_from": _iso(plan.valid_from),
        "valid_until": _iso(plan.valid_until),
        "pods": {pod_id: _pod_dict(pod) for pod_id, pod in sorted(plan.pods.items())},
        "adapters": {name: _adapter_dict(entry) for name, entry in sorted(plan.adapters.items())},
        "preloads": [
            {"at": _iso(p.at), "pod": p.pod, "adapter": p.adapter, "reason": p.reason}
            for p in plan.preloads
        ],
        "predicted": {key: round(value, 6) for key, value in sorted(plan.predicted.items())},
        "solver": {
            "status": plan.solver.status,
            "objective": _finite(plan.solver.objective),
            "bound": _finite(plan.solver.bound),
            "gap": _finite(plan.solver.gap),
            "wall_s": round(plan.solver.wall_s, 4),
        },
        "why": dict(sorted(plan.why.items())),
    }


def _pod_dict(pod: PodPlan) -> dict[str, Any]:
    written: dict[str, Any] = {
        "hot": list(pod.hot),
        "warm": list(pod.warm),
        "pinned": list(pod.pinned),
        "hbm_bytes_used": pod.hbm_bytes_used,
        "host_bytes_used": pod.host_bytes_used,
        "expected_rps": round(pod.expected_rps, 6),
    }
    # Optional (schema 1 grew it): a plan without a tail reserve writes none.
    if pod.reserved_slots:
        written["reserved_slots"] = pod.reserved_slots
    return written


def _adapter_dict(entry: AdapterPlan) -> dict[str, Any]:
    written: dict[str, Any] = {
        "tier": entry.tier.value,
        "pods": {pod: round(weight, 6) for pod, weight in sorted(entry.pods.items())},
    }
    # Optional (schema 1 grew them): a plan without a forecast writes neither.
    if entry.mean_rps is not None:
        written["mean_rps"] = round(entry.mean_rps, 6)
    if entry.q90_rps is not None:
        written["q90_rps"] = round(entry.q90_rps, 6)
    return written


def plan_to_json(plan: Plan) -> str:
    return json.dumps(plan_to_dict(plan), indent=2) + "\n"


class _Reader:
    """Reads raw JSON with errors that name the source and the path inside it."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, message: str) -> PlanError:
        return PlanError(f"{self.source}: {where}: {message}")

    def obj(self, value: object, where: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected an object, got {type(value).__name__}")
        return value

    def key(self, parent: Mapping[str, Any], name: str, where: str) -> Any:
        if name not in parent:
            raise self.fail(where, f"missing required key {name!r}")
        return parent[name]

    def string(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string, got {type(value).__name__}")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise self.fail(where, f"not valid Unicode text: {value!r}") from None
        return value

    def number(self, value: object, where: str, *, allow_null: bool = False) -> float:
        if value is None and allow_null:
            return math.nan
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, f"expected a number, got {type(value).__name__}")
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            raise self.fail(where, f"number out of range: {value}") from None
        if not math.isfinite(number):
            raise self.fail(where, f"expected a finite number, got {value}")
        return number

    def names(self, value: object, where: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list of names, got {type(value).__name__}")
        return tuple(self.string(item, f"{where}[{i}]") for i, item in enumerate(value))

    def time(self, value: object, where: str) -> datetime:
        text = self.string(value, where)
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise self.fail(where, f"not an ISO 8601 time: {text!r}") from None
        if moment.tzinfo is None:
            raise self.fail(where, f"time has no time zone: {text!r}")
        return moment.astimezone(UTC)


def _read_pod(reader: _Reader, raw: object, where: str) -> PodPlan:
    pod = reader.obj(raw, where)
    return PodPlan(
        hot=tuple(AdapterId(a) for a in reader.names(pod.get("hot", []), f"{where}.hot")),
        warm=tuple(AdapterId(a) for a in reader.names(pod.get("warm", []), f"{where}.warm")),
        pinned=tuple(AdapterId(a) for a in reader.names(pod.get("pinned", []), f"{where}.pinned")),
        hbm_bytes_used=int(reader.number(pod.get("hbm_bytes_used", 0), f"{where}.hbm_bytes_used")),
        host_bytes_used=int(
            reader.number(pod.get("host_bytes_used", 0), f"{where}.host_bytes_used")
        ),
        expected_rps=reader.number(pod.get("expected_rps", 0.0), f"{where}.expected_rps"),
        reserved_slots=_slots(reader, pod.get("reserved_slots", 0), f"{where}.reserved_slots"),
    )


def _slots(reader: _Reader, raw: object, where: str) -> int:
    """A count of GPU slots: a whole number, not negative."""
    number = reader.number(raw, where)
    if number < 0 or number != int(number):
        raise reader.fail(where, f"expected a whole number of slots, got {raw}")
    return int(number)


def _read_adapter(reader: _Reader, raw: object, where: str) -> AdapterPlan:
    entry = reader.obj(raw, where)
    tier_text = reader.string(reader.key(entry, "tier", where), f"{where}.tier")
    try:
        tier = Tier(tier_text)
    except ValueError:
        raise reader.fail(f"{where}.tier", f"unknown tier {tier_text!r}") from None
    pods = reader.obj(entry.get("pods", {}), f"{where}.pods")
    weights = {
        PodId(pod): reader.number(weight, f"{where}.pods.{pod}") for pod, weight in pods.items()
    }
    return AdapterPlan(
        tier=tier,
        pods=MappingProxyType(weights),
        mean_rps=_rate(reader, entry, "mean_rps", where),
        q90_rps=_rate(reader, entry, "q90_rps", where),
    )


def _rate(reader: _Reader, entry: Mapping[str, Any], name: str, where: str) -> float | None:
    """An optional forecast rate: absent in plans written before it was recorded."""
    if name not in entry:
        return None
    rate = reader.number(entry[name], f"{where}.{name}")
    if rate < 0.0:
        raise reader.fail(f"{where}.{name}", f"a rate cannot be negative, got {rate}")
    return rate


def _read_solver(reader: _Reader, raw: object) -> SolverReport:
    solver = reader.obj(raw, "solver")
    return SolverReport(
        status=reader.string(solver.get("status", "NONE"), "solver.status"),
        objective=reader.number(solver.get("objective"), "solver.objective", allow_null=True),
        bound=reader.number(solver.get("bound"), "solver.bound", allow_null=True),
        gap=reader.number(solver.get("gap"), "solver.gap", allow_null=True),
        wall_s=reader.number(solver.get("wall_s", 0.0), "solver.wall_s"),
    )


def plan_from_dict(raw: object, *, source: str = "plan") -> Plan:
    """Parse a plan, raising PlanError naming the source and the key that is wrong."""
    reader = _Reader(source)
    top = reader.obj(raw, "top level")
    version = reader.key(top, "schema_version", "top level")
    if version != SCHEMA_VERSION:
        raise reader.fail(
            "schema_version", f"unsupported version {version!r} (this build reads {SCHEMA_VERSION})"
        )
    pods = reader.obj(reader.key(top, "pods", "top level"), "pods")
    adapters = reader.obj(reader.key(top, "adapters", "top level"), "adapters")
    preloads_raw = top.get("preloads", [])
    if not isinstance(preloads_raw, list):
        raise reader.fail("preloads", "expected a list")
    preloads = []
    for i, item in enumerate(preloads_raw):
        where = f"preloads[{i}]"
        entry = reader.obj(item, where)
        preloads.append(
            Preload(
                at=reader.time(reader.key(entry, "at", where), f"{where}.at"),
                pod=PodId(reader.string(reader.key(entry, "pod", where), f"{where}.pod")),
                adapter=AdapterId(
                    reader.string(reader.key(entry, "adapter", where), f"{where}.adapter")
                ),
                reason=reader.string(entry.get("reason", ""), f"{where}.reason"),
            )
        )
    predicted = reader.obj(top.get("predicted", {}), "predicted")
    why = reader.obj(top.get("why", {}), "why")
    return Plan(
        id=reader.string(reader.key(top, "id", "top level"), "id"),
        inputs_digest=reader.string(top.get("inputs_digest", ""), "inputs_digest"),
        created_at=reader.time(reader.key(top, "created_at", "top level"), "created_at"),
        valid_from=reader.time(reader.key(top, "valid_from", "top level"), "valid_from"),
        valid_until=reader.time(reader.key(top, "valid_until", "top level"), "valid_until"),
        pods=MappingProxyType(
            {PodId(name): _read_pod(reader, raw, f"pods.{name}") for name, raw in pods.items()}
        ),
        adapters=MappingProxyType(
            {
                AdapterId(name): _read_adapter(reader, raw, f"adapters.{name}")
                for name, raw in adapters.items()
            }
        ),
        preloads=tuple(preloads),
        predicted=MappingProxyType(
            {key: reader.number(value, f"predicted.{key}") for key, value in predicted.items()}
        ),
        solver=_read_solver(reader, top.get("solver", {"status": "NONE"})),
        why=MappingProxyType({AdapterId(k): reader.string(v, f"why.{k}") for k, v in why.items()}),
    )


def plan_input_error(exc: PlanError, source: str | os.PathLike[str]) -> InputError:
    """``exc`` as the InputError of the file (or object) at ``source``, named once: a
    plan someone gave or stored that is not one is a bad input (exit 2), not a
    ``PlanError`` (exit 1, an engine or Kubernetes failure's code)."""
    name = str(source)
    message = str(exc).removeprefix(f"{name}: ")
    return InputError([Problem(source=name, message=message)])


def plan_from_json(text: str, *, source: str = "plan") -> Plan:
    """Parse plan JSON; anything wrong with it, NaN, Infinity and nesting too deep for
    the parser included, is a PlanError (so a plan watcher keeps its last good plan)."""

    def refuse(constant: str) -> float:
        raise PlanError(f"{source}: not valid JSON: {constant} is not a number a plan may hold")

    try:
        raw = json.loads(text, parse_constant=refuse)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{source}: not valid JSON: {exc}") from None
    except RecursionError:
        raise PlanError(f"{source}: not valid JSON: nested too deeply") from None
    return plan_from_dict(raw, source=source)
