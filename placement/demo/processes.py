"""Local processes for the demo and the end-to-end test, and their certain end.

Each child runs ``python -m placement ...`` in its own process group, with its output
in a log file; ``LocalProcesses`` stops every child (SIGTERM, then SIGKILL) when its
block ends, however it ends: normally, by an error, or by Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from placement.errors import LorafleetError


class ProcessError(LorafleetError):
    """A child process died or never became ready; the message names its log."""


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


@dataclass
class LocalProcesses:
    """Starts ``lorafleet`` subcommands as children and stops them all on exit."""

    workdir: Path
    children: list[Child] = field(default_factory=list)

    def start(
        self,
        name: str,
        args: Sequence[str],
        *,
        ready_url: str | None = None,
        timeout_s: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> Child:
        log_path = self.workdir / f"{name}.log"
        handle = log_path.open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "placement", *args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.workdir,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        handle.close()
        child = Child(name=name, process=process, log_path=log_path)
        self.children.append(child)
        if ready_url is not None:
            self.wait_ready(child, ready_url, timeout_s=timeout_s)
        return child

    def wait_ready(self, child: Child, url: str, *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _raise_if_exited(child)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=1.0).status_code < 500:
                    return
            time.sleep(0.1)
        raise ProcessError(
            f"{child.name} was not ready at {url} within {timeout_s:.0f} s:\n{child.tail()}"
        )

    def wait_for_file(self, child: Child, path: Path, *, timeout_s: float) -> str:
        """The text of ``path`` once ``child`` has written it (whole: children write by
        rename); a ProcessError if the child exits first or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _raise_if_exited(child)
            with contextlib.suppress(FileNotFoundError):
                return path.read_text()
            time.sleep(0.1)
        raise ProcessError(
            f"{child.name} did not write {path} within {timeout_s:.0f} s:\n{child.tail()}"
        )

    def wait_for_line(self, child: Child, pattern: re.Pattern[str], *, timeout_s: float) -> str:
        """The first match of ``pattern`` in ``child``'s log (its group 1 when it has
        one), once written; a ProcessError if the child exits first or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _raise_if_exited(child)
            with contextlib.suppress(FileNotFoundError):
                found = pattern.search(child.log_path.read_text(errors="replace"))
                if found is not None:
                    return found.group(1) if pattern.groups else found.group(0)
            time.sleep(0.1)
        raise ProcessError(
            f"{child.name} did not log {pattern.pattern!r} within {timeout_s:.0f} s:\n"
            f"{child.tail()}"
        )

    def stop(self, child: Child, *, grace_s: float = 5.0) -> None:
        self._stop([child], grace_s=grace_s)

    def stop_all(self, *, grace_s: float = 5.0) -> None:
        """Stop every child within one grace period, however many there are."""
        self._stop(list(reversed(self.children)), grace_s=grace_s)

    def _stop(self, children: Sequence[Child], *, grace_s: float) -> None:
        # SIGTERM to every group first, then one shared deadline: stopping N children
        # one after the other could take N grace periods on a loaded machine.
        for child in children:
            _signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(child, signal.SIGKILL)
        for child in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(timeout=grace_s)  # SIGKILL cannot be refused
            if child in self.children:
                self.children.remove(child)


def _signal_group(child: Child, signum: signal.Signals) -> None:
    if child.process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signum)


def _raise_if_exited(child: Child) -> None:
    if child.process.poll() is not None:
        raise ProcessError(f"{child.name} exited with {child.process.returncode}:\n{child.tail()}")


@contextlib.contextmanager
def local_processes(workdir: Path) -> Iterator[LocalProcesses]:
    """Children started inside the block are gone when it ends, on Ctrl-C too."""
    processes = LocalProcesses(workdir=workdir)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield processes
    finally:
        processes.stop_all()
        signal.signal(signal.SIGTERM, previous)
