"""A plan file the user names is an input: one that cannot be read, or is not a plan,
is an ``InputError`` (exit 2, one line naming the file), not a ``PlanError`` (exit 1,
an engine or Kubernetes failure's code)."""

from __future__ import annotations

import os

from placement.errors import InputError, PlanError, Problem
from placement.inputs import read_plan
from placement.plan import Plan


def plan_problem(exc: PlanError, path: str | os.PathLike[str]) -> InputError:
    """``exc`` as the InputError of the file at ``path``, the file named once."""
    source = str(path)
    message = str(exc).removeprefix(f"{source}: ")
    return InputError([Problem(source=source, message=message)])


def read_plan_file(path: str | os.PathLike[str]) -> Plan:
    """``read_plan``, its PlanError an InputError naming the file."""
    try:
        return read_plan(path)
    except PlanError as exc:
        raise plan_problem(exc, path) from None
