"""Parse pipelines.yaml: pipeline triggers and their steps, and tenant logins."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from types import MappingProxyType
from typing import Any

from placement.domain import AdapterId, Catalog, Pipeline, Pipelines, PipelineStep, TenantId
from placement.errors import Problem
from placement.inputs.fields import (
    Reader,
    as_dns_name,
    as_number,
    as_strings,
    as_text,
    raise_errors,
    read_yaml,
    reader_for,
)

STEP_KEYS = frozenset({"adapter", "probability", "within_s", "after"})
PIPELINE_KEYS = frozenset({"trigger", "steps"})


def _step(
    reader: Reader, raw: Any, *, entry: str, known: frozenset[AdapterId] | None
) -> PipelineStep | None:
    if not isinstance(raw, dict):
        reader.add("expected a mapping", entry=entry)
        return None
    reader.unknown(raw, STEP_KEYS, entry=entry)
    adapter = reader.get(raw, "adapter", as_dns_name, entry=entry, required=True)
    probability = reader.get(raw, "probability", as_number, entry=entry, default=1.0)
    if probability is not None and probability > 1:
        reader.add(
            f"a probability is at most 1, got {probability}", entry=entry, field_="probability"
        )
    within_s = reader.get(raw, "within_s", as_number, entry=entry, default=0.0)
    after = reader.get(raw, "after", as_dns_name, entry=entry)
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


def parse_pipelines(path: Path, catalog: Catalog | None) -> tuple[Pipelines, list[Problem]]:
    document = read_yaml(path)
    reader, pipelines_raw = reader_for(path, document, "pipelines", also=frozenset({"logins"}))
    known = catalog.names() if catalog is not None else None
    pipelines = []
    for i, raw in enumerate(pipelines_raw):
        entry = f"pipelines[{i}]"
        if not isinstance(raw, dict):
            reader.add("expected a mapping", entry=entry)
            continue
        trigger = reader.get(raw, "trigger", as_text, entry=entry, required=True)
        reader.unknown(raw, PIPELINE_KEYS, entry=f"pipeline {trigger}" if trigger else entry)
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
    logins_raw = document.get("logins") or {}
    if not isinstance(logins_raw, dict):
        reader.add("expected a mapping of tenant to adapters", entry="logins")
        logins_raw = {}
    for tenant, adapters in logins_raw.items():
        names = (
            reader.get({"adapters": adapters}, "adapters", as_strings, entry=f"logins {tenant}")
            or ()
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
    pipelines, problems = parse_pipelines(Path(path), catalog)
    raise_errors(problems)
    return pipelines
