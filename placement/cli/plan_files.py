"""A plan file the user names is an input: one that cannot be read, or is not a plan,
is an ``InputError`` (exit 2, one line naming the file), not a ``PlanError`` (exit 1,
an engine or Kubernetes failure's code)."""

from __future__ import annotations

import os

from placement.errors import PlanError
from placement.inputs import read_plan
from placement.plan import Plan, plan_input_error


def read_plan_file(path: str | os.PathLike[str]) -> Plan:
    """``read_plan``, its PlanError an InputError naming the file."""
    try:
        return read_plan(path)
    except PlanError as exc:
        raise plan_input_error(exc, path) from None
