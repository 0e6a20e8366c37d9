"""Parse and validate the files people write: catalog.yaml, fleet.yaml, pipelines.yaml.

Parse once, at the edge: every problem found is collected (not only the first) as a
Problem naming the file, the entry and the field, and raised together as one
InputError. What comes out is typed domain values the core trusts. Request logs are
read by ``placement.inputs.request_log``; plans by ``read_plan``/``write_plan`` here.
"""

from __future__ import annotations

import os
from pathlib import Path

from placement.domain import Catalog, Fleet
from placement.errors import InputError, PlanError, Problem
from placement.inputs.catalog import load_catalog, parse_catalog
from placement.inputs.fields import is_dns_label, parse_bytes
from placement.inputs.files import read_text, write_atomically
from placement.inputs.fleet import load_fleet, parse_fleet
from placement.inputs.pipelines import load_pipelines, parse_pipelines
from placement.inputs.request_log import RequestLog, check_request_log, load_request_log
from placement.plan import Plan, plan_from_json, plan_to_json
from placement.settings import InputSettings

__all__ = [
    "RequestLog",
    "check_request_log",
    "is_dns_label",
    "load_catalog",
    "load_fleet",
    "load_pipelines",
    "load_request_log",
    "parse_bytes",
    "read_plan",
    "validate_inputs",
    "write_plan",
]


def validate_inputs(
    *,
    catalog: str | os.PathLike[str],
    fleet: str | os.PathLike[str],
    pipelines: str | os.PathLike[str] | None = None,
    log: str | os.PathLike[str] | None = None,
    rules: InputSettings | None = None,
) -> list[Problem]:
    """Every problem in the inputs, errors and warnings, without stopping at the first;
    ``rules`` say what an adapter's ``source`` may be (default: the settings tree's)."""
    problems: list[Problem] = []
    parsed_fleet: Fleet | None = None
    parsed_catalog: Catalog | None = None
    try:
        parsed_fleet, found = parse_fleet(Path(fleet))
        problems += found
    except InputError as exc:
        problems += exc.problems
    try:
        parsed_catalog, found = parse_catalog(Path(catalog), parsed_fleet, rules=rules)
        problems += found
    except InputError as exc:
        problems += exc.problems
    if pipelines is not None:
        try:
            problems += parse_pipelines(Path(pipelines), parsed_catalog)[1]
        except InputError as exc:
            problems += exc.problems
    if log is not None:
        known = parsed_catalog.names() if parsed_catalog is not None else None
        problems += check_request_log(Path(log), known_adapters=known)
    return problems


def read_plan(path: str | os.PathLike[str]) -> Plan:
    """Read a plan JSON file; PlanError names the file and the key that is wrong."""
    try:
        text = read_text(Path(path))
    except InputError as exc:
        raise PlanError(str(exc)) from None
    return plan_from_json(text, source=str(path))


def write_plan(path: str | os.PathLike[str], plan: Plan) -> None:
    """Write a plan atomically and durably: a reader never sees half a file."""
    write_atomically(Path(path), plan_to_json(plan))
