"""Emulated vLLM and SGLang pods: the test double for every part, and the demo's fleet.

Public API: ``PodConfig``, ``Latency``, ``Faults``, ``ZERO_LATENCY``, ``build_pod``
(the app factory), ``free_base_port``, ``EmulatedFleet`` (many pods in-process), ``serve_fleet`` and
``serving_in_thread`` (real sockets on 127.0.0.1).
"""

from placement.emulator.config import ZERO_LATENCY, Faults, Latency, PodConfig
from placement.emulator.fleet import (
    EmulatedFleet,
    FleetTransport,
    PodHandle,
    build_pod,
    free_base_port,
    serve_fleet,
    serving_in_thread,
)
from placement.emulator.pod import EmulatedPod

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
    "free_base_port",
    "serve_fleet",
    "serving_in_thread",
]
