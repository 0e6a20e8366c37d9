"""The cluster ports on one machine: a state directory instead of ConfigMaps and a Lease.

Files (all written with ``placement.inputs.files``: unique temporary name, fsync,
rename, fsync of the directory; a crash leaves the old file or the new one):

- ``plan.json`` and ``previous.json`` play the plan ConfigMap. They are symbolic links
  into ``current/``, itself a link to one generation directory ``plans/gen-N`` that
  holds both plans. Publishing or rolling back writes a new generation and swaps the
  ``current`` link with one rename: a reader, or a crash, sees the old pair or the new
  pair, never one of each. ``plans.lock`` (``fcntl.flock``) serializes the
  read-modify-swap, so ``lorafleet rollback`` racing the controller's publish loses
  neither; the last few generations are kept, older ones removed.
- ``last-plan.json`` and ``ledger.json`` are the controller's state.
- ``controller.lock``: ``DirLock``, the state directory's Lease. Only the replica that
  holds an exclusive ``flock`` on it acts; the kernel releases it when that process
  dies, however it dies, and a standby takes it at its next lease tick.

Owns the files only; decides nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from placement.errors import InputError, LeadershipLostError, PlanError, Problem
from placement.inputs.files import fsync_directory, read_text, write_atomically
from placement.plan import Plan, plan_from_json, plan_input_error, plan_to_json
from placement.ports import StoredState

PLAN_FILE = "plan.json"
PREVIOUS_FILE = "previous.json"
STATE_PLAN_FILE = "last-plan.json"
LEDGER_FILE = "ledger.json"
LOCK_FILE = "controller.lock"
PLANS_LOCK_FILE = "plans.lock"
PLANS_DIR = "plans"
CURRENT_LINK = "current"
GENERATIONS_KEPT = 4
_GENERATION = re.compile(r"^gen-(\d{12})$")


def _read(path: Path) -> str | None:
    try:
        return read_text(path)
    except InputError:
        if not path.exists():
            return None
        raise


def _previous_plan(text: str, path: Path) -> Plan:
    """The plan a rollback restores; one that is not a plan is a bad file (exit 2), as
    one that is not UTF-8 already is (``read_text``)."""
    try:
        return plan_from_json(text, source=str(path))
    except PlanError as exc:
        raise plan_input_error(exc, path) from None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _keep_aside(path: Path) -> None:
    """Copy an unreadable state file to the first free ``<name>.unreadable-N``, unless
    the last copy already holds the same bytes (a standby resuming again)."""
    if not path.is_file():
        return
    content = path.read_bytes()
    number = 1
    while (copy := path.with_name(f"{path.name}.unreadable-{number}")).exists():
        if copy.read_bytes() == content:
            return
        number += 1
    write_atomically(copy, content)


def ensure_state_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            [Problem(source=str(path), message=f"cannot create the state directory: {exc}")]
        ) from None
    return path


@contextmanager
def _flocked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the block (waits for another holder)."""
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _swap_link(link: Path, target: str) -> None:
    """Point ``link`` at ``target`` with one rename (a fresh link beside it first)."""
    fresh = link.with_name(f".{link.name}.{os.getpid()}.link")
    fresh.unlink(missing_ok=True)
    fresh.symlink_to(target)
    os.replace(fresh, link)
    fsync_directory(link.parent)


class DirPlanStore:
    """``plan.json`` and ``previous.json`` of a state directory, swapped as one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def publish(self, plan: Plan) -> None:
        with self._locked():
            current = _read(self.directory / PLAN_FILE)
            self._install(plan_to_json(plan), current)

    def current(self) -> Plan | None:
        return self._plan(PLAN_FILE)

    def previous(self) -> Plan | None:
        return self._plan(PREVIOUS_FILE)

    def rollback(self) -> Plan:
        with self._locked():
            current, previous = (
                _read(self.directory / name) for name in (PLAN_FILE, PREVIOUS_FILE)
            )
            if current is None or previous is None:
                raise PlanError(f"{self.directory}: no previous plan to roll back to")
            restored = _previous_plan(previous, self.directory / PREVIOUS_FILE)
            self._install(previous, current)
        return restored

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with _flocked(self.directory / PLANS_LOCK_FILE):
            yield

    def _install(self, plan_text: str, previous_text: str | None) -> None:
        """A new generation holding both plans, made current by one link swap."""
        plans = self.directory / PLANS_DIR
        plans.mkdir(exist_ok=True)
        number = max((int(m.group(1)) for m in self._generations()), default=0) + 1
        generation = plans / f"gen-{number:012d}"
        for leftover in plans.glob(".gen-*.tmp"):  # a writer that died here; we hold the lock
            shutil.rmtree(leftover, ignore_errors=True)
        staging = plans / f".{generation.name}.{os.getpid()}.tmp"
        staging.mkdir()
        write_atomically(staging / PLAN_FILE, plan_text)
        if previous_text is not None:
            write_atomically(staging / PREVIOUS_FILE, previous_text)
        os.replace(staging, generation)
        fsync_directory(plans)
        _swap_link(self.directory / CURRENT_LINK, f"{PLANS_DIR}/{generation.name}")
        for name in (PLAN_FILE, PREVIOUS_FILE):
            link = self.directory / name
            wanted = f"{CURRENT_LINK}/{name}"
            if not (link.is_symlink() and os.readlink(link) == wanted):
                _swap_link(link, wanted)  # once: a directory from before generations
        self._prune(keep=generation.name)

    def _generations(self) -> list[re.Match[str]]:
        plans = self.directory / PLANS_DIR
        names = (p.name for p in plans.iterdir()) if plans.is_dir() else iter(())
        return [m for m in map(_GENERATION.match, names) if m is not None]

    def _prune(self, *, keep: str) -> None:
        numbers = sorted(int(m.group(1)) for m in self._generations())
        for number in numbers[:-GENERATIONS_KEPT]:
            name = f"gen-{number:012d}"
            if name != keep:
                shutil.rmtree(self.directory / PLANS_DIR / name, ignore_errors=True)

    def _plan(self, name: str) -> Plan | None:
        path = self.directory / name
        try:
            text = _read(path)
        except InputError as exc:
            raise PlanError(str(exc)) from None
        return None if text is None else plan_from_json(text, source=str(path))


class DirStateStore:
    """``last-plan.json`` and ``ledger.json``. One that cannot be read as JSON (torn,
    zeroed, not UTF-8) is copied to ``<name>.unreadable-N`` as it is read: the
    controller warns and starts without it, and its next save would otherwise replace
    the only copy a person could look at."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def load(self) -> StoredState:
        return StoredState(
            plan_json=self._load(STATE_PLAN_FILE), ledger_json=self._load(LEDGER_FILE)
        )

    def _load(self, name: str) -> str | None:
        path = self.directory / name
        try:
            text = _read(path)
        except InputError:
            _keep_aside(path)
            raise
        if text is not None and not _is_json(text):
            _keep_aside(path)
        return text

    def save(self, state: StoredState) -> None:
        if state.plan_json is not None:
            write_atomically(self.directory / STATE_PLAN_FILE, state.plan_json)
        if state.ledger_json is not None:
            write_atomically(self.directory / LEDGER_FILE, state.ledger_json)


class DirLock:
    """The state directory's Lease: an exclusive ``flock`` on ``controller.lock``.

    ``tick`` takes the lock when free (never waits); the holder keeps it until
    ``release`` or its death. ``fence`` also checks that the lock file is still the
    one locked: if someone removed it, another replica could lock a new one.
    """

    def __init__(self, directory: Path, *, identity: str) -> None:
        self.path = directory / LOCK_FILE
        self.identity = identity
        self._fd: int | None = None

    def is_leader(self) -> bool:
        return self._fd is not None and self._same_file()

    def tick(self) -> bool:
        if self._fd is not None:
            if self._same_file():
                return True
            self.release()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{self.identity} pid {os.getpid()}\n".encode())
        self._fd = fd
        return True

    def term(self) -> float | None:
        """No fencing token: a flock is not lost while its holder lives, even paused."""
        return None

    def fence(self, *, margin_s: float) -> None:
        """A flock cannot lapse while we live: only a lost or replaced file loses it."""
        if not self.is_leader():
            raise LeadershipLostError(f"{self.identity} does not hold {self.path}")

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def _same_file(self) -> bool:
        assert self._fd is not None
        try:
            on_disk = os.stat(self.path)
        except OSError:
            return False
        held = os.fstat(self._fd)
        return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)
