"""Ports for tests that need a connection refused: ``refusing_port`` holds one for as
long as its block runs, and ``is_held`` says no one else can bind it meanwhile.

A port bound, closed and then connected to can be taken in between by another process
(or picked by the client as its own source port), so a test of a refused connection
holds its port for the whole test instead.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

HOST = "127.0.0.1"


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections for as long as the block runs: bound
    (without SO_REUSEADDR) but never listening, Linux answers a connect with a reset, and
    no other process can bind it meanwhile."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((HOST, 0))
        yield int(held.getsockname()[1])


def is_held(port: int) -> bool:
    """Whether a server that would take ``port`` (with SO_REUSEADDR, as most set)
    cannot bind it now: True while ``refusing_port`` holds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            other.bind((HOST, port))
        except OSError:
            return True
    return False
