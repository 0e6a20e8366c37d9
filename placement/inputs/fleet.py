"""Parse fleet.yaml: pools, their base models and engines, and their pods' budgets.

Refuses what an engine would break on: a vLLM ``max_lora_rank`` outside the ranks vLLM
accepts, a host cache below the GPU slots, and on SGLang a served model name with a
colon (SGLang reads ``model: "<served>:<adapter>"`` up to the first colon).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from placement import sizing
from placement.domain import (
    VLLM_MAX_LORA_RANKS,
    AdapterStorage,
    Engine,
    Fleet,
    ModelDims,
    Pod,
    PodId,
    Pool,
    PoolId,
)
from placement.errors import Problem
from placement.inputs.fields import (
    Reader,
    above_zero,
    as_dns_name,
    as_integer,
    as_labels,
    as_number,
    as_text,
    as_url,
    load_yaml,
    parse_bytes,
    raise_errors,
)


def _pool_dims(
    reader: Reader, raw: Mapping[str, Any], *, entry: str, base: Path
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


#: The keys of a pod, and of its pool's ``pod_defaults``; any other is an error.
POD_KEYS = frozenset(
    {
        "name",
        "url",
        "max_loras",
        "max_cpu_loras",
        "max_lora_rank",
        "hbm_adapter_bytes",
        "host_adapter_bytes",
        "capacity_rps",
        "zone",
        "labels",
    }
)
#: The keys of a pool; any other is an error.
POOL_KEYS = frozenset(
    {
        "name",
        "base_model",
        "served_model_name",
        "engine",
        "max_lora_rank",
        "model_config",
        "storage",
        "pod_defaults",
        "pods",
    }
)
STORAGE_KEYS = frozenset({"kind", "bandwidth_per_s", "first_byte_ms"})


def _pod(
    reader: Reader,
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
    name = reader.get(merged, "name", as_dns_name, entry=entry, required=True)
    entry = f"pod {name}" if name else entry
    reader.unknown(raw, POD_KEYS, entry=entry)
    max_loras = reader.get(merged, "max_loras", as_integer(1), entry=entry, default=1)
    max_cpu = reader.get(merged, "max_cpu_loras", as_integer(1), entry=entry, default=max_loras)
    if max_loras is not None and max_cpu is not None and max_cpu < max_loras:
        reader.add(
            f"max_cpu_loras ({max_cpu}) is below max_loras ({max_loras}); vLLM refuses to start",
            entry=entry,
            field_="max_cpu_loras",
        )
    pod_rank = reader.get(merged, "max_lora_rank", as_integer(1), entry=entry, default=rank)
    url = reader.get(merged, "url", as_url, entry=entry, required=True)
    hbm = reader.get(
        merged, "hbm_adapter_bytes", above_zero(parse_bytes), entry=entry, default=2 * 2**30
    )
    host = reader.get(
        merged, "host_adapter_bytes", above_zero(parse_bytes), entry=entry, default=16 * 2**30
    )
    capacity = reader.get(merged, "capacity_rps", above_zero(as_number), entry=entry, default=10.0)
    zone = reader.get(merged, "zone", as_text, entry=entry)
    empty: Mapping[str, str] = MappingProxyType({})
    labels = reader.get(merged, "labels", as_labels, entry=entry, default=empty)
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


STORAGE_KINDS = ("nvme", "volume", "object")


def _storage(reader: Reader, raw: Any, *, entry: str) -> AdapterStorage | None:
    """Optional ``storage: {kind, bandwidth_per_s: 200MB, first_byte_ms: 80}``."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        reader.add("expected a mapping", entry=entry, field_="storage")
        return None
    reader.unknown(raw, STORAGE_KEYS, entry=f"{entry}: storage")
    kind = reader.get(raw, "kind", as_text, entry=f"{entry}: storage", required=True)
    if kind is not None and kind not in STORAGE_KINDS:
        reader.add(f"expected one of {', '.join(STORAGE_KINDS)}", entry=entry, field_="storage")
        kind = None
    rate = reader.get(raw, "bandwidth_per_s", parse_bytes, entry=f"{entry}: storage", required=True)
    if rate is not None and rate <= 0:
        reader.add("must be above 0", entry=f"{entry}: storage", field_="bandwidth_per_s")
        rate = None
    first = reader.get(raw, "first_byte_ms", as_number, entry=f"{entry}: storage", default=0.0)
    if kind is None or rate is None or first is None:
        return None
    return AdapterStorage(kind=kind, bytes_per_s=float(rate), first_byte_ms=first)


def _pool(reader: Reader, raw: Any, *, index: int, base: Path) -> Pool | None:
    entry = f"pools[{index}]"
    if not isinstance(raw, dict):
        reader.add("expected a mapping", entry=entry)
        return None
    name = reader.get(raw, "name", as_dns_name, entry=entry, required=True)
    entry = f"pool {name}" if name else entry
    reader.unknown(raw, POOL_KEYS, entry=entry)
    base_model = reader.get(raw, "base_model", as_text, entry=entry, required=True)
    engine = reader.get(raw, "engine", Engine, entry=entry, default=Engine.VLLM)
    rank = reader.get(raw, "max_lora_rank", as_integer(1), entry=entry, default=16)
    if engine is Engine.VLLM and rank is not None and rank not in VLLM_MAX_LORA_RANKS:
        allowed = ", ".join(str(r) for r in VLLM_MAX_LORA_RANKS)
        reader.add(f"vLLM accepts only {allowed}; got {rank}", entry=entry, field_="max_lora_rank")
    dims = _pool_dims(reader, raw, entry=entry, base=base)
    defaults = raw.get("pod_defaults") or {}
    pods_raw = raw.get("pods")
    if not isinstance(defaults, dict):
        reader.add("expected a mapping", entry=entry, field_="pod_defaults")
        defaults = {}
    reader.unknown(defaults, POD_KEYS, entry=f"{entry}: pod_defaults")
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
    served = str(raw.get("served_model_name") or base_model or "")
    if engine is Engine.SGLANG and ":" in served:
        # SGLang reads an adapter request's model "<served>:<adapter>" up to its first colon.
        reader.add(
            f"SGLang splits a request's model '<served name>:<adapter>' at the first colon, "
            f"so the served name {served!r} would break every adapter request; serve the "
            "model under a name without a colon (SGLang's --served-model-name) and give "
            "that name here",
            entry=entry,
            field_="served_model_name" if raw.get("served_model_name") else "base_model",
        )
    storage = _storage(reader, raw.get("storage"), entry=entry)
    if name is None or base_model is None or engine is None or rank is None or dims is None:
        return None
    return Pool(
        name=PoolId(name),
        base_model=base_model,
        served_model_name=served,
        engine=engine,
        max_lora_rank=rank,
        dims=dims,
        pods=tuple(pod for pod in pods if pod is not None),
        storage=storage,
    )


def parse_fleet(path: Path) -> tuple[Fleet, list[Problem]]:
    reader, pools_raw = load_yaml(path, "pools")
    if not pools_raw:  # else only the catalog's adapters said so, naming the wrong file
        reader.add("expected a non-empty list of pools", entry="top level", field_="pools")
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
    fleet, problems = parse_fleet(Path(path))
    raise_errors(problems)
    return fleet
