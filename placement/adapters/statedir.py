"""The cluster ports on one machine: a state directory instead of ConfigMaps.

``plan.json`` and ``previous.json`` play the plan ConfigMap (``lorafleet rollback``
swaps them); ``last-plan.json`` and ``ledger.json`` the controller's state. Every
write goes to a temporary file first and is renamed into place, so a crash never
leaves half a file. Owns the files only; decides nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

from placement.errors import InputError, PlanError, Problem
from placement.plan import Plan, plan_from_json, plan_to_json
from placement.ports import StoredState

PLAN_FILE = "plan.json"
PREVIOUS_FILE = "previous.json"
STATE_PLAN_FILE = "last-plan.json"
LEDGER_FILE = "ledger.json"


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def ensure_state_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            [Problem(source=str(path), message=f"cannot create the state directory: {exc}")]
        ) from None
    return path


class DirPlanStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def publish(self, plan: Plan) -> None:
        current = _read(self.directory / PLAN_FILE)
        if current is not None:
            _write_atomically(self.directory / PREVIOUS_FILE, current)
        _write_atomically(self.directory / PLAN_FILE, plan_to_json(plan))

    def current(self) -> Plan | None:
        return self._plan(PLAN_FILE)

    def previous(self) -> Plan | None:
        return self._plan(PREVIOUS_FILE)

    def rollback(self) -> Plan:
        current, previous = (_read(self.directory / name) for name in (PLAN_FILE, PREVIOUS_FILE))
        if current is None or previous is None:
            raise PlanError(f"{self.directory}: no previous plan to roll back to")
        restored = plan_from_json(previous, source=str(self.directory / PREVIOUS_FILE))
        _write_atomically(self.directory / PREVIOUS_FILE, current)
        _write_atomically(self.directory / PLAN_FILE, previous)
        return restored

    def _plan(self, name: str) -> Plan | None:
        text = _read(self.directory / name)
        return None if text is None else plan_from_json(text, source=str(self.directory / name))


class DirStateStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def load(self) -> StoredState:
        return StoredState(
            plan_json=_read(self.directory / STATE_PLAN_FILE),
            ledger_json=_read(self.directory / LEDGER_FILE),
        )

    def save(self, state: StoredState) -> None:
        if state.plan_json is not None:
            _write_atomically(self.directory / STATE_PLAN_FILE, state.plan_json)
        if state.ledger_json is not None:
            _write_atomically(self.directory / LEDGER_FILE, state.ledger_json)
