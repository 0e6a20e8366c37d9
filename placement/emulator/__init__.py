"""Emulated vLLM and SGLang pods: the test double for every part, and the demo's fleet.

Public API: ``PodConfig``, ``Latency``, ``Faults``, ``ZERO_LATENCY``, ``build_pod``
(the app factory), ``EmulatedFleet`` (many pods in-process), ``serve_fleet`` and
``serving_in_thread`` (real sockets on 127.0.0.1).
"""

from placement.emulator.fleet import (
    EmulatedFleet,
    FleetTransport,
    PodHandle,
    build_pod,
    serve_fleet,
    serving_in_thread,
)
from placement.emulator.pod import ZERO_LATENCY, EmulatedPod, Faults, Latency, PodConfig

__all__ = [
    "ZERO_LATENCY",
    "EmulatedFleet",
    "EmulatedPod",
    "Faults",
    "FleetTransport",
    "Latency",
    "PodConfig",
    "PodHandle",
    "build_pod",
    "serve_fleet",
    "serving_in_thread",
]
