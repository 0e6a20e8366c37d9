"""Parse catalog.yaml: adapters, their sizes, pins and replication, checked against the fleet.

Also owns the two ways the catalog changes while a process runs: ``CatalogFile``
re-reads the file when its bytes change (an edit, or the kubelet swapping a mounted
ConfigMap's files), refusing a bad version with the problems the first read would
have named; and ``unannounced_adapter`` is the entry an adapter the catalog lacks
gets from ``InputSettings.adapter_source_template`` and the ``unannounced_*`` defaults.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from placement import sizing
from placement.domain import (
    Adapter,
    AdapterClass,
    AdapterId,
    Catalog,
    Fleet,
    ModelDims,
    PodId,
    TenantId,
)
from placement.errors import InputError, Problem
from placement.inputs.fields import (
    Reader,
    above_zero,
    as_dns_name,
    as_integer,
    as_number,
    as_strings,
    as_text,
    load_yaml,
    parse_bytes,
    parse_yaml,
    raise_errors,
    reader_for,
)
from placement.inputs.files import read_text
from placement.inputs.sources import check_source, source_from_template
from placement.settings import InputSettings


def _dims_for(base_model: str, fleet: Fleet | None) -> ModelDims | None:
    pool = fleet.pool_for_base(base_model) if fleet is not None else None
    if pool is not None:
        return pool.dims
    return sizing.BUILTIN_MODELS.get(base_model.lower())


def _resolve_size(
    reader: Reader,
    raw: Mapping[str, Any],
    *,
    entry: str,
    base: Path | None,
    fleet: Fleet | None,
    rank: int,
    targets: tuple[str, ...],
    dtype: str,
    base_model: str,
) -> int | None:
    if raw.get("size_bytes") is not None:
        return reader.get(raw, "size_bytes", above_zero(parse_bytes), entry=entry)
    source = str(raw.get("source", ""))
    # A PEFT directory beside the file; a catalog read from elsewhere (a ConfigMap) has none.
    local = base / source if base is not None and source and "://" not in source else None
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
    return True, tuple(PodId(pod) for pod in as_strings(value))


#: The keys an adapter's entry may have (ARCHITECTURE.md, Formats); any other is an error.
ADAPTER_KEYS = frozenset(
    {
        "name",
        "base_model",
        "rank",
        "alpha",
        "target_modules",
        "dtype",
        "source",
        "size_bytes",
        "tenant",
        "timezone",
        "pinned",
        "min_replicas",
        "max_replicas",
        "slo_ttft_ms",
        "group",
        "class",
    }
)


def _adapter(
    reader: Reader,
    raw: Any,
    *,
    index: int,
    base: Path | None,
    fleet: Fleet | None,
    rules: InputSettings,
) -> Adapter | None:
    entry = f"adapters[{index}]"
    if not isinstance(raw, dict):
        reader.add("expected a mapping", entry=entry)
        return None
    name = reader.get(raw, "name", as_dns_name, entry=entry, required=True)
    entry = f"adapter {name}" if name else entry
    reader.unknown(raw, ADAPTER_KEYS, entry=entry)
    base_model = reader.get(raw, "base_model", as_text, entry=entry, required=True)
    rank = reader.get(raw, "rank", as_integer(1), entry=entry, required=True)
    default_targets: tuple[str, ...] = ("q_proj", "v_proj")
    targets = reader.get(
        raw, "target_modules", as_target_modules, entry=entry, default=default_targets
    )
    dtype = reader.get(raw, "dtype", as_dtype, entry=entry, default="float16") or "float16"
    source = reader.get(
        raw,
        "source",
        lambda value: check_source(as_text(value), rules=rules),
        entry=entry,
        required=True,
    )
    no_pins: tuple[bool, tuple[PodId, ...]] = (False, ())
    pinned, pinned_pods = reader.get(raw, "pinned", _pins, entry=entry, default=no_pins) or no_pins
    min_replicas = reader.get(raw, "min_replicas", as_integer(0), entry=entry, default=1)
    max_replicas = reader.get(raw, "max_replicas", as_integer(1), entry=entry, default=4)
    if min_replicas is not None and max_replicas is not None and min_replicas > max_replicas:
        reader.add(
            f"min_replicas ({min_replicas}) exceeds max_replicas ({max_replicas})",
            entry=entry,
            field_="min_replicas",
        )
    timezone = reader.get(raw, "timezone", as_timezone, entry=entry)
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
    tenant = reader.get(raw, "tenant", as_text, entry=entry)
    return Adapter(
        name=AdapterId(name),
        base_model=base_model,
        rank=rank,
        # 0 was taken for "not given" (the rank) without a word; an error now, as the
        # default is only for an alpha left out
        alpha=reader.get(raw, "alpha", above_zero(as_number), entry=entry, default=float(rank))
        or float(rank),
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
        slo_ttft_ms=reader.get(raw, "slo_ttft_ms", above_zero(as_number), entry=entry),
        group=reader.get(raw, "group", as_text, entry=entry),
        adapter_class=reader.get(
            raw, "class", as_adapter_class, entry=entry, default=AdapterClass.PRODUCTION
        )
        or AdapterClass.PRODUCTION,
    )


def as_target_modules(value: Any) -> tuple[str, ...]:
    """A non-empty list of projections: ``[]`` was an adapter of 0 bytes."""
    modules = as_strings(value)
    if not modules:
        raise ValueError("expected at least one target module")
    return modules


def as_dtype(value: Any) -> str:
    """One of the dtypes an adapter's size is computed in (it was reported under
    target_modules, as the size that could not be computed)."""
    text = as_text(value)
    if text.lower() not in sizing.DTYPE_BYTES:
        allowed = ", ".join(sorted(sizing.DTYPE_BYTES))
        raise ValueError(f"unknown dtype {text!r}; expected one of {allowed}")
    return text


def as_adapter_class(value: Any) -> AdapterClass:
    """``production``, ``batch`` or ``experiment``: what the adapter serves."""
    text = as_text(value)
    try:
        return AdapterClass(text)
    except ValueError:
        allowed = ", ".join(c.value for c in AdapterClass)
        raise ValueError(f"unknown class {text!r} (allowed: {allowed})") from None


def as_timezone(value: Any) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    text = as_text(value)
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {text!r} (use an IANA name like America/New_York)"
        ) from None
    return text


def _check_against_fleet(
    reader: Reader,
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


def parse_catalog(
    path: Path, fleet: Fleet | None, *, rules: InputSettings | None = None
) -> tuple[Catalog, list[Problem]]:
    """The catalog and every problem in it; ``rules`` (default: the settings tree's)
    say what an adapter's ``source`` may be (``placement.inputs.sources``)."""
    reader, adapters_raw = load_yaml(path, "adapters")
    return _catalog_of(reader, adapters_raw, base=path.parent, fleet=fleet, rules=rules)


def catalog_from_text(
    text: str, *, source: str, fleet: Fleet | None, rules: InputSettings | None = None
) -> Catalog:
    """A catalog given as text (a ConfigMap's key), ``source`` naming it in problems;
    InputError on any. Its local sources have no directory to be sized from."""
    reader, adapters_raw = reader_for(Path(source), parse_yaml(text, source=source), "adapters")
    catalog, problems = _catalog_of(reader, adapters_raw, base=None, fleet=fleet, rules=rules)
    raise_errors(problems)
    return catalog


def _catalog_of(
    reader: Reader,
    adapters_raw: list[Any],
    *,
    base: Path | None,
    fleet: Fleet | None,
    rules: InputSettings | None,
) -> tuple[Catalog, list[Problem]]:
    adapters = [
        _adapter(reader, raw, index=i, base=base, fleet=fleet, rules=rules or InputSettings())
        for i, raw in enumerate(adapters_raw)
    ]
    catalog = Catalog(adapters=tuple(a for a in adapters if a is not None))
    names = [raw.get("name") for raw in adapters_raw if isinstance(raw, dict)]
    for duplicate, count in Counter(n for n in names if isinstance(n, str)).items():
        if count > 1:
            reader.add(
                f"adapter name {duplicate!r} is used {count} times",
                entry=f"adapter {duplicate}",
                field_="name",
            )
    return catalog, reader.problems


def load_catalog(
    path: str | os.PathLike[str], *, fleet: Fleet | None = None, rules: InputSettings | None = None
) -> Catalog:
    """Read catalog.yaml (checked against ``fleet`` when given); raise InputError on problems."""
    catalog, problems = parse_catalog(Path(path), fleet, rules=rules)
    raise_errors(problems)
    return catalog


def unannounced_adapter(name: str, *, base_model: str, rules: InputSettings) -> Adapter:
    """The catalog entry of an adapter seen in traffic but not in the catalog: its
    source from ``rules.adapter_source_template``, its rank, size and class from the
    ``unannounced_*`` settings. ValueError saying why when there is none to give (no
    template, a name that is no DNS label, a source the rules refuse)."""
    template = rules.adapter_source_template
    if template is None:
        raise ValueError("no adapter_source_template is set")
    source = source_from_template(template, name, rules=rules)
    rank = rules.unannounced_rank
    return Adapter(
        name=AdapterId(name),
        base_model=base_model,
        rank=rank,
        alpha=float(rank),
        target_modules=("q_proj", "v_proj"),
        dtype="float16",
        source=source,
        size_bytes=rules.unannounced_size_bytes,
        adapter_class=as_adapter_class(rules.unannounced_class),
    )


class CatalogFile:
    """catalog.yaml, re-read whenever its bytes change.

    ``poll`` returns the catalog on the first call and whenever the file's content
    differs from the last version read, None while it is the same, and raises
    ``InputError`` (the problems naming the file, the entry or the line) for a
    version that cannot be read or parsed: the caller keeps the catalog it had. A bad
    version is parsed once; until the file changes again, ``poll`` raises the same
    error without reading the YAML again.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fleet: Fleet | None, rules: InputSettings
    ) -> None:
        self.path = Path(path)
        self._fleet = fleet
        self._rules = rules
        self._digest: str | None = None
        self._error: InputError | None = None

    def poll(self) -> Catalog | None:
        digest = hashlib.sha256(read_text(self.path).encode()).hexdigest()
        if digest == self._digest:
            if self._error is not None:
                raise self._error
            return None
        self._digest = digest
        try:
            catalog = load_catalog(self.path, fleet=self._fleet, rules=self._rules)
        except InputError as exc:
            self._error = exc
            raise
        self._error = None
        return catalog
