"""Emulated vLLM and SGLang pods: the test double for every part, and the demo's fleet.

Public API: ``PodConfig``, ``Latency``, ``BatchTiming`` (the replay's batch model),
``Faults``, ``ZERO_LATENCY``, ``build_pod``
(the app factory), ``EmulatedFleet`` (many pods in-process), ``listening_sockets`` and
``ports_of`` (sockets bound on port 0, and their ports), ``serve_fleet`` and
``serving_in_thread`` (real sockets on 127.0.0.1).
"""

from placement.emulator.config import ZERO_LATENCY, BatchTiming, Faults, Latency, PodConfig
from placement.emulator.fleet import (
    EmulatedFleet,
    FleetTransport,
    PodHandle,
    build_pod,
    listening_sockets,
    ports_of,
    serve_fleet,
    serving_in_thread,
)
from placement.emulator.pod import EmulatedPod

__all__ = [
    "ZERO_LATENCY",
    "BatchTiming",
    "EmulatedFleet",
    "EmulatedPod",
    "Faults",
    "FleetTransport",
    "Latency",
    "PodConfig",
    "PodHandle",
    "build_pod",
    "listening_sockets",
    "ports_of",
    "serve_fleet",
    "serving_in_thread",
]
