"""Saturation: whether a pool of pods has room for one more request, and which requests
an endpoint picker sheds when it has none.

Modelled on the Gateway API Inference Extension's endpoint picker (EPP), the reference
implementation llm-d builds on (kubernetes-sigs/gateway-api-inference-extension):

- ``pkg/epp/saturationdetector/saturationdetector.go``, ``Detector.IsSaturated``: the
  pool is saturated when *no* pod has good capacity, where good capacity is a waiting
  queue of at most ``QueueDepthThreshold`` requests and a KV-cache use of at most
  ``KVCacheUtilThreshold``; with no pods at all it is saturated too. Its defaults
  (``pkg/epp/saturationdetector/config.go``) are 5 and 0.8.
- ``pkg/epp/requestcontrol/admission.go``, ``rejectIfSheddableAndSaturated`` (used by
  ``LegacyAdmissionController.Admit``): a sheddable request (priority below 0,
  ``IsSheddable``) is refused while the pool is saturated ("system saturated,
  sheddable request dropped", ResourceExhausted); any other request is admitted and
  scheduled whatever the load.
- The earlier scheduler (``pkg/epp/scheduling/scheduler.go``, ``sheddableRequestFilter``
  with ``noQueueAndLessThanKVCacheThresholdPredicate`` in ``filter.go``) did the same
  per request: a sheddable request went on only if some pod had at most
  ``queueThresholdCritical`` (5) waiting requests and KV use at most 0.8, and was
  dropped otherwise; critical requests were never dropped.

What is kept: the two thresholds, the "no pod has capacity" rule and shedding by
criticality. What is not: metric staleness (the simulator's view is always fresh) and
the flow-control queue that newer releases put in front of the scheduler.

Pure: plain values in, a boolean out; no IO, no clock, no state. Must not import
``placement``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

#: The reference EPP's defaults (``saturationdetector/config.go``).
DEFAULT_QUEUE_DEPTH_THRESHOLD = 5
DEFAULT_KV_CACHE_UTIL_THRESHOLD = 0.8


class PodLoad(Protocol):
    """What the detector reads about one pod (``routing.PodLike`` satisfies it)."""

    @property
    def queue_depth(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...


class Criticality(enum.StrEnum):
    """A request's criticality, as the extension's InferenceModel named it; its later
    InferenceObjective gives an integer priority instead (below 0 is sheddable)."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"

    @classmethod
    def of_priority(cls, priority: int) -> Criticality:
        """A priority below 0 is sheddable (``IsSheddable``); 0, the default, is not."""
        return cls.SHEDDABLE if priority < 0 else cls.STANDARD


@dataclass(frozen=True, kw_only=True, slots=True)
class SaturationThresholds:
    """When a pod has no good capacity left: more waiting requests than
    ``queue_depth``, or KV-cache use above ``kv_usage`` (a share, 0 to 1)."""

    queue_depth: int = DEFAULT_QUEUE_DEPTH_THRESHOLD
    kv_usage: float = DEFAULT_KV_CACHE_UTIL_THRESHOLD

    def __post_init__(self) -> None:
        if self.queue_depth < 0:
            raise ValueError(f"saturation queue_depth must be 0 or more, not {self.queue_depth}")
        if not 0.0 <= self.kv_usage <= 1.0:
            raise ValueError(f"saturation kv_usage must be within 0-1, not {self.kv_usage}")


#: The reference EPP's saturation detector as it ships.
REFERENCE_EPP = SaturationThresholds()


def has_capacity(pod: PodLoad, thresholds: SaturationThresholds) -> bool:
    """Whether ``pod`` can take one more request without queueing past the thresholds."""
    return pod.queue_depth <= thresholds.queue_depth and pod.kv_usage <= thresholds.kv_usage


def is_saturated(pods: Iterable[PodLoad], thresholds: SaturationThresholds) -> bool:
    """True when no pod of ``pods`` has capacity (and when there is no pod)."""
    queue_depth, kv_usage = thresholds.queue_depth, thresholds.kv_usage
    # has_capacity, inlined: this runs once per routed request.
    return not any(pod.queue_depth <= queue_depth and pod.kv_usage <= kv_usage for pod in pods)


def sheds(criticality: Criticality, *, saturated: bool) -> bool:
    """Whether a request of ``criticality`` is refused: sheddable ones, while saturated."""
    return saturated and criticality is Criticality.SHEDDABLE
