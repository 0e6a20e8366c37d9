"""Parse and validate the files people write: catalog.yaml, fleet.yaml, pipelines.yaml.

Parse once, at the edge: every problem found is collected (not only the first) as a
Problem naming the file, the entry and the field, and raised together as one
InputError. What comes out is typed domain values the core trusts. Request logs are
read by ``placement.request_log``; plans by ``read_plan``/``write_plan`` here.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import yaml

from placement import sizing
from placement.domain import (
    VLLM_MAX_LORA_RANKS,
    Adapter,
    AdapterId,
    Catalog,
    Engine,
    Fleet,
    ModelDims,
    Pipeline,
    Pipelines,
    PipelineStep,
    Pod,
    PodId,
    Pool,
    PoolId,
    TenantId,
)
from placement.errors import InputError, PlanError, Problem
from placement.plan import Plan, plan_from_json, plan_to_json
from placement.request_log import RequestLog, check_request_log, load_request_log

__all__ = [
    "RequestLog",
    "check_request_log",
    "load_catalog",
    "load_fleet",
    "load_pipelines",
    "load_request_log",
    "parse_bytes",
    "read_plan",
    "validate_inputs",
    "write_plan",
]

T = TypeVar("T")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_BYTES = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(value: object) -> int:
    """``2GiB``, ``65.6MB``, ``512MiB`` or a plain integer, as a whole number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative: {value}")
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a byte size like 2GiB or 65.6MB, got {value!r}")
    match = _BYTES.match(value)
    if match is None:
        raise ValueError(f"expected a byte size like 2GiB or 65.6MB, got {value!r}")
    unit = (match.group(2) or "B").lower()
    return round(float(match.group(1)) * _UNITS[unit])


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and _DNS_LABEL.match(name) is not None


@dataclass
class _Reader:
    """Collects problems for one file while reading its entries field by field."""

    source: str
    problems: list[Problem] = field(default_factory=list)

    def add(
        self,
        message: str,
        *,
        entry: str | None = None,
        field_: str | None = None,
        warn: bool = False,
    ) -> None:
        self.problems.append(
            Problem(
                source=self.source,
                entry=entry,
                field=field_,
                message=message,
                severity="warning" if warn else "error",
            )
        )

    def get(
        self,
        raw: Mapping[str, Any],
        key: str,
        convert: Callable[[Any], T],
        *,
        entry: str,
        default: T | None = None,
        required: bool = False,
    ) -> T | None:
        if key not in raw or raw[key] is None:
            if required:
                self.add("is required", entry=entry, field_=key)
            return default
        try:
            return convert(raw[key])
        except (TypeError, ValueError) as exc:
            self.add(str(exc), entry=entry, field_=key)
            return default


def _load_yaml(path: Path, top_key: str) -> tuple[_Reader, list[Any]]:
    """The list under ``top_key`` of a YAML file, or an InputError saying why not."""
    reader = _Reader(str(path))
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(
            [Problem(source=str(path), message=f"cannot read: {exc.strerror}")]
        ) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputError([Problem(source=str(path), entry=where, message=str(problem))]) from None
    if not isinstance(document, dict) or not isinstance(document.get(top_key), list):
        raise InputError(
            [Problem(source=str(path), message=f"expected a mapping with a list under {top_key!r}")]
        )
    return reader, document[top_key]


def _integer(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}")
        return value

    return convert


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    if value < 0:
        raise ValueError(f"cannot be negative, got {value}")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool) or value == "":
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return str(value)


def _name(value: Any) -> str:
    text = _text(value)
    if not is_dns_label(text):
        raise ValueError(
            f"{text!r} is not a DNS label (lower-case letters, digits and '-', at most 63)"
        )
    return text


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"expected a list of strings, got {value!r}")
    return tuple(value)


def _labels(value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of labels, got {value!r}")
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


# --------------------------------------------------------------------------- fleet


def _pool_dims(
    reader: _Reader, raw: Mapping[str, Any], *, entry: str, base: Path
) -> ModelDims | None:
    config = raw.get("model_config")
    base_model = str(raw.get("base_model", ""))
    if config is not None:
        try:
            return sizing.model_dims_from_config(base / str(config), name=base_model or None)
        except sizing.SizingError as exc:
            reader.add(str(exc), entry=entry, field_="model_config")
            return None
    dims = sizing.BUILTIN_MODELS.get(base_model.lower())
    if dims is None and base_model:
        known = ", ".join(sorted(sizing.BUILTIN_MODELS))
        reader.add(
            f"no built-in dimensions for {base_model!r} (known: {known}); give model_config",
            entry=entry,
            field_="base_model",
        )
    return dims


def _pod(
    reader: _Reader,
    raw: Any,
    defaults: Mapping[str, Any],
    *,
    pool: PoolId,
    engine: Engine,
    rank: int,
    entry: str,
) -> Pod | None:
    if not isinstance(raw, dict):
        reader.add("expected a mapping", entry=entry)
        return None
    merged = {**defaults, **raw}
    name = reader.get(merged, "name", _name, entry=entry, required=True)
    entry = f"pod {name}" if name else entry
    max_loras = reader.get(merged, "max_loras", _integer(1), entry=entry, default=1)
    max_cpu = reader.get(merged, "max_cpu_loras", _integer(1), entry=entry, default=max_loras)
    if max_loras is not None and max_cpu is not None and max_cpu < max_loras:
        reader.add(
            f"max_cpu_loras ({max_cpu}) is below max_loras ({max_loras}); vLLM refuses to start",
            entry=entry,
            field_="max_cpu_loras",
        )
    pod_rank = reader.get(merged, "max_lora_rank", _integer(1), entry=entry, default=rank)
    url = reader.get(merged, "url", _text, entry=entry, required=True)
    hbm = reader.get(merged, "hbm_adapter_bytes", parse_bytes, entry=entry, default=2 * 2**30)
    host = reader.get(merged, "host_adapter_bytes", parse_bytes, entry=entry, default=16 * 2**30)
    capacity = reader.get(merged, "capacity_rps", _number, entry=entry, default=10.0)
    zone = reader.get(merged, "zone", _text, entry=entry)
    empty: Mapping[str, str] = MappingProxyType({})
    labels = reader.get(merged, "labels", _labels, entry=entry, default=empty)
    if (
        name is None
        or url is None
        or max_loras is None
        or max_cpu is None
        or pod_rank is None
        or hbm is None
        or host is None
        or capacity is None
        or labels is None
    ):
        return None
    return Pod(
        name=PodId(name),
        pool=pool,
        url=url.rstrip("/"),
        engine=engine,
        max_loras=max_loras,
        max_cpu_loras=max_cpu,
        max_lora_rank=pod_rank,
        hbm_adapter_bytes=hbm,
        host_adapter_bytes=host,
        capacity_rps=capacity,
        zone=zone,
        labels=labels,
    )


def _pool(reader: _Reader, raw: Any, *, index: int, base: Path) -> Pool | None:
    entry = f"pools[{index}]"
    if not isinstance(raw, dict):
        reader.add("expected a mapping", entry=entry)
        return None
    name = reader.get(raw, "name", _name, entry=entry, required=True)
    entry = f"pool {name}" if name else entry
    base_model = reader.get(raw, "base_model", _text, entry=entry, required=True)
    engine = reader.get(raw, "engine", Engine, entry=entry, default=Engine.VLLM)
    rank = reader.get(raw, "max_lora_rank", _integer(1), entry=entry, default=16)
    if engine is Engine.VLLM and rank is not None and rank not in VLLM_MAX_LORA_RANKS:
        allowed = ", ".join(str(r) for r in VLLM_MAX_LORA_RANKS)
        reader.add(f"vLLM accepts only {allowed}; got {rank}", entry=entry, field_="max_lora_rank")
    dims = _pool_dims(reader, raw, entry=entry, base=base)
    defaults = raw.get("pod_defaults") or {}
    pods_raw = raw.get("pods")
    if not isinstance(defaults, dict):
        reader.add("expected a mapping", entry=entry, field_="pod_defaults")
        defaults = {}
    if not isinstance(pods_raw, list) or not pods_raw:
        reader.add("expected a non-empty list of pods", entry=entry, field_="pods")
        pods_raw = []
    pods = [
        _pod(
            reader,
            pod,
            defaults,
            pool=PoolId(name or ""),
            engine=engine or Engine.VLLM,
            rank=rank or 16,
            entry=f"{entry}: pods[{i}]",
        )
        for i, pod in enumerate(pods_raw)
    ]
    if name is None or base_model is None or engine is None or rank is None or dims is None:
        return None
    return Pool(
        name=PoolId(name),
        base_model=base_model,
        served_model_name=str(raw.get("served_model_name") or base_model),
        engine=engine,
        max_lora_rank=rank,
        dims=dims,
        pods=tuple(pod for pod in pods if pod is not None),
    )


def _parse_fleet(path: Path) -> tuple[Fleet, list[Problem]]:
    reader, pools_raw = _load_yaml(path, "pools")
    pools = [_pool(reader, raw, index=i, base=path.parent) for i, raw in enumerate(pools_raw)]
    fleet = Fleet(pools=tuple(pool for pool in pools if pool is not None))
    for kind, names in (
        ("pool", [pool.name for pool in fleet.pools]),
        ("pod", [pod.name for pod in fleet.pods]),
    ):
        for duplicate, count in Counter(names).items():
            if count > 1:
                reader.add(
                    f"{kind} name {duplicate!r} is used {count} times",
                    entry=f"{kind} {duplicate}",
                    field_="name",
                )
    return fleet, reader.problems


def load_fleet(path: str | os.PathLike[str]) -> Fleet:
    """Read fleet.yaml; raise InputError listing every problem."""
    fleet, problems = _parse_fleet(Path(path))
    _raise_errors(problems)
    return fleet


def _raise_errors(problems: list[Problem]) -> None:
    if any(problem.severity == "error" for problem in problems):
        raise InputError(problems)


# --------------------------------------------------------------------------- catalog


def _dims_for(base_model: str, fleet: Fleet | None) -> ModelDims | None:
    pool = fleet.pool_for_base(base_model) if fleet is not None else None
    if pool is not None:
        return pool.dims
    return sizing.BUILTIN_MODELS.get(base_model.lower())


def _resolve_size(
    reader: _Reader,
    raw: Mapping[str, Any],
    *,
    entry: str,
    base: Path,
    fleet: Fleet | None,
    rank: int,
    targets: tuple[str, ...],
    dtype: str,
    base_model: str,
) -> int | None:
    if raw.get("size_bytes") is not None:
        return reader.get(raw, "size_bytes", parse_bytes, entry=entry)
    source = str(raw.get("source", ""))
    local = base / source if source and "://" not in source else None
    if local is not None and local.is_dir():
        try:
            return sizing.peft_adapter_size(local).bytes
        except sizing.SizingError as exc:
            reader.add(
                f"size cannot be read from the PEFT directory: {exc}", entry=entry, field_="source"
            )
            return None
    dims = _dims_for(base_model, fleet)
    if dims is None:
        reader.add(
            f"size cannot be computed: no dimensions for base model {base_model!r}; "
            "give size_bytes, a PEFT directory as source, or a pool with model_config",
            entry=entry,
            field_="size_bytes",
        )
        return None
    try:
        return sizing.adapter_bytes(dims, rank, targets, dtype)
    except sizing.SizingError as exc:
        reader.add(f"size cannot be computed: {exc}", entry=entry, field_="target_modules")
        return None


def _pins(value: Any) -> tuple[bool, tuple[PodId, ...]]:
    if isinstance(value, bool):
        return value, ()
    return True, tuple(PodId(pod) for pod in _strings(value))


def _adapter(
    reader: _Reader, raw: Any, *, index: int, base: Path, fleet: Fleet | None
) -> Adapter | None:
    entry = f"adapters[{index}]"
    if not isinstance(raw, dict):
        reader.add("expected a mapping", entry=entry)
        return None
    name = reader.get(raw, "name", _name, entry=entry, required=True)
    entry = f"adapter {name}" if name else entry
    base_model = reader.get(raw, "base_model", _text, entry=entry, required=True)
    rank = reader.get(raw, "rank", _integer(1), entry=entry, required=True)
    default_targets: tuple[str, ...] = ("q_proj", "v_proj")
    targets = reader.get(raw, "target_modules", _strings, entry=entry, default=default_targets)
    dtype = reader.get(raw, "dtype", _text, entry=entry, default="float16") or "float16"
    source = reader.get(raw, "source", _text, entry=entry, required=True)
    no_pins: tuple[bool, tuple[PodId, ...]] = (False, ())
    pinned, pinned_pods = reader.get(raw, "pinned", _pins, entry=entry, default=no_pins) or no_pins
    min_replicas = reader.get(raw, "min_replicas", _integer(0), entry=entry, default=1)
    max_replicas = reader.get(raw, "max_replicas", _integer(1), entry=entry, default=4)
    if min_replicas is not None and max_replicas is not None and min_replicas > max_replicas:
        reader.add(
            f"min_replicas ({min_replicas}) exceeds max_replicas ({max_replicas})",
            entry=entry,
            field_="min_replicas",
        )
    timezone = reader.get(raw, "timezone", _timezone, entry=entry)
    if name is None or base_model is None or rank is None or targets is None or source is None:
        return None
    size = _resolve_size(
        reader,
        raw,
        entry=entry,
        base=base,
        fleet=fleet,
        rank=rank,
        targets=targets,
        dtype=dtype,
        base_model=base_model,
    )
    _check_against_fleet(
        reader, entry=entry, fleet=fleet, base_model=base_model, rank=rank, pinned_pods=pinned_pods
    )
    if size is None or min_replicas is None or max_replicas is None:
        return None
    tenant = reader.get(raw, "tenant", _text, entry=entry)
    return Adapter(
        name=AdapterId(name),
        base_model=base_model,
        rank=rank,
        alpha=reader.get(raw, "alpha", _number, entry=entry, default=float(rank)) or float(rank),
        target_modules=targets,
        dtype=dtype,
        source=source,
        size_bytes=size,
        tenant=TenantId(tenant) if tenant else None,
        timezone=timezone,
        pinned=pinned,
        pinned_pods=pinned_pods,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        slo_ttft_ms=reader.get(raw, "slo_ttft_ms", _number, entry=entry),
        group=reader.get(raw, "group", _text, entry=entry),
    )


def _timezone(value: Any) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    text = _text(value)
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {text!r} (use an IANA name like America/New_York)"
        ) from None
    return text


def _check_against_fleet(
    reader: _Reader,
    *,
    entry: str,
    fleet: Fleet | None,
    base_model: str,
    rank: int,
    pinned_pods: tuple[PodId, ...],
) -> None:
    if fleet is None:
        return
    pool = fleet.pool_for_base(base_model)
    if pool is None:
        served = ", ".join(sorted({p.base_model for p in fleet.pools})) or "none"
        reader.add(
            f"no pool serves base model {base_model!r} (served: {served})",
            entry=entry,
            field_="base_model",
        )
        return
    if rank > pool.max_lora_rank:
        reader.add(
            f"rank {rank} is above max_lora_rank {pool.max_lora_rank} of pool {pool.name}",
            entry=entry,
            field_="rank",
        )
    pods = {pod.name for pod in pool.pods}
    for pod in pinned_pods:
        if pod not in pods:
            reader.add(
                f"pinned to unknown pod {pod!r} (pool {pool.name} has {', '.join(sorted(pods))})",
                entry=entry,
                field_="pinned",
            )


def _parse_catalog(path: Path, fleet: Fleet | None) -> tuple[Catalog, list[Problem]]:
    reader, adapters_raw = _load_yaml(path, "adapters")
    adapters = [
        _adapter(reader, raw, index=i, base=path.parent, fleet=fleet)
        for i, raw in enumerate(adapters_raw)
    ]
    catalog = Catalog(adapters=tuple(a for a in adapters if a is not None))
    names = [raw.get("name") for raw in adapters_raw if isinstance(raw, dict)]
    for duplicate, count in Counter(n for n in names if n is not None).items():
        if count > 1:
            reader.add(
                f"adapter name {duplicate!r} is used {count} times",
                entry=f"adapter {duplicate}",
                field_="name",
            )
    return catalog, reader.problems


def load_catalog(path: str | os.PathLike[str], *, fleet: Fleet | None = None) -> Catalog:
    """Read catalog.yaml (checked against ``fleet`` when given); raise InputError on problems."""
    catalog, problems = _parse_catalog(Path(path), fleet)
    _raise_errors(problems)
    return catalog


# --------------------------------------------------------------------------- pipelines


def _step(
    reader: _Reader, raw: Any, *, entry: str, known: frozenset[AdapterId] | None
) -> PipelineStep | None:
    if not isinstance(raw, dict):
        reader.add("expected a mapping", entry=entry)
        return None
    adapter = reader.get(raw, "adapter", _name, entry=entry, required=True)
    probability = reader.get(raw, "probability", _number, entry=entry, default=1.0)
    if probability is not None and probability > 1:
        reader.add(
            f"a probability is at most 1, got {probability}", entry=entry, field_="probability"
        )
    within_s = reader.get(raw, "within_s", _number, entry=entry, default=0.0)
    after = reader.get(raw, "after", _name, entry=entry)
    for field_name, value in (("adapter", adapter), ("after", after)):
        if value is not None and known is not None and value not in known:
            reader.add(
                f"unknown adapter {value!r} (not in the catalog)", entry=entry, field_=field_name
            )
    if adapter is None or probability is None or within_s is None:
        return None
    return PipelineStep(
        adapter=AdapterId(adapter),
        probability=probability,
        within_s=within_s,
        after=AdapterId(after) if after else None,
    )


def _parse_pipelines(path: Path, catalog: Catalog | None) -> tuple[Pipelines, list[Problem]]:
    reader, pipelines_raw = _load_yaml(path, "pipelines")
    known = catalog.names() if catalog is not None else None
    pipelines = []
    for i, raw in enumerate(pipelines_raw):
        entry = f"pipelines[{i}]"
        if not isinstance(raw, dict):
            reader.add("expected a mapping", entry=entry)
            continue
        trigger = reader.get(raw, "trigger", _text, entry=entry, required=True)
        steps_raw = raw.get("steps")
        if not isinstance(steps_raw, list) or not steps_raw:
            reader.add("expected a non-empty list of steps", entry=entry, field_="steps")
            continue
        steps = [
            _step(reader, s, entry=f"pipeline {trigger}: steps[{j}]", known=known)
            for j, s in enumerate(steps_raw)
        ]
        if trigger is not None:
            pipelines.append(
                Pipeline(trigger=trigger, steps=tuple(s for s in steps if s is not None))
            )
    logins: dict[TenantId, tuple[AdapterId, ...]] = {}
    document = yaml.safe_load(path.read_text())
    logins_raw = document.get("logins") or {}
    if not isinstance(logins_raw, dict):
        reader.add("expected a mapping of tenant to adapters", entry="logins")
        logins_raw = {}
    for tenant, adapters in logins_raw.items():
        names = (
            reader.get({"adapters": adapters}, "adapters", _strings, entry=f"logins {tenant}") or ()
        )
        for name in names:
            if known is not None and name not in known:
                reader.add(
                    f"unknown adapter {name!r} (not in the catalog)",
                    entry=f"logins {tenant}",
                    field_="adapters",
                )
        logins[TenantId(str(tenant))] = tuple(AdapterId(n) for n in names)
    for duplicate, count in Counter(p.trigger for p in pipelines).items():
        if count > 1:
            reader.add(
                f"trigger {duplicate!r} is defined {count} times",
                entry=f"pipeline {duplicate}",
                field_="trigger",
            )
    return Pipelines(pipelines=tuple(pipelines), logins=MappingProxyType(logins)), reader.problems


def load_pipelines(path: str | os.PathLike[str], *, catalog: Catalog | None = None) -> Pipelines:
    """Read pipelines.yaml (adapters checked against ``catalog`` when given)."""
    pipelines, problems = _parse_pipelines(Path(path), catalog)
    _raise_errors(problems)
    return pipelines


# --------------------------------------------------------------------------- all together


def validate_inputs(
    *,
    catalog: str | os.PathLike[str],
    fleet: str | os.PathLike[str],
    pipelines: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
) -> list[Problem]:
    """Every problem in the inputs, errors and warnings, without stopping at the first."""
    problems: list[Problem] = []
    parsed_fleet: Fleet | None = None
    parsed_catalog: Catalog | None = None
    try:
        parsed_fleet, found = _parse_fleet(Path(fleet))
        problems += found
    except InputError as exc:
        problems += exc.problems
    try:
        parsed_catalog, found = _parse_catalog(Path(catalog), parsed_fleet)
        problems += found
    except InputError as exc:
        problems += exc.problems
    if pipelines is not None:
        try:
            problems += _parse_pipelines(Path(pipelines), parsed_catalog)[1]
        except InputError as exc:
            problems += exc.problems
    if log is not None:
        known = parsed_catalog.names() if parsed_catalog is not None else None
        problems += check_request_log(Path(log), known_adapters=known)
    return problems


# --------------------------------------------------------------------------- plans


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Read a plan JSON file; PlanError names the file and the key that is wrong."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PlanError(f"{path}: cannot read: {exc.strerror}") from None
    return plan_from_json(text, source=str(path))


def write_plan(path: str | os.PathLike[str], plan: Plan) -> None:
    """Write a plan atomically: a reader never sees half a file."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(plan_to_json(plan))
    temporary.replace(target)
