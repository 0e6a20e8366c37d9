"""The one exception tree of lorafleet.

::

    LorafleetError
    ├── InputError                  bad user input; carries every Problem found
    ├── PlanError                   a plan file that cannot be read or has the wrong schema
    ├── SolverError
    │   └── InfeasibleError         the placement cannot satisfy its constraints; says why
    ├── ForecastError               no forecast can be made from this history
    ├── EngineError                 a pod answered badly or not at all
    │   ├── RetryableEngineError    5xx, connection refused, timeout: try again later
    │   │   └── EngineTimeoutError  no answer within the client's timeout (a hung pod)
    │   └── PermanentEngineError    bad path, rank too large, runtime updating off: do not retry
    ├── LeadershipLostError         this controller no longer holds the lease: it must not write
    ├── KubeError                   the Kubernetes API refused or failed
    │   ├── KubeConflictError       409: someone else changed the object first
    │   └── RetryableKubeError      5xx and transport failures
    └── HistorySourceError          a history source (Prometheus) answered badly
        └── RetryableHistorySourceError  down, 5xx, timeout: try again later

Retryable errors are separate from permanent ones so that the executor and the
controller decide retries by type, never by parsing messages.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong with one input: where it is and what is wrong."""

    source: str
    message: str
    entry: str | None = None
    field: str | None = None
    severity: str = "error"

    def __str__(self) -> str:
        where = self.source
        if self.entry is not None:
            where += f": {self.entry}"
        if self.field is not None:
            where += f": {self.field}"
        return f"{where}: {self.message}"


class LorafleetError(Exception):
    """Base of every error lorafleet raises on purpose."""


class InputError(LorafleetError):
    """One or more inputs are invalid; ``problems`` lists every one found."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))


class PlanError(LorafleetError):
    """A plan cannot be read, or it was written with an unknown schema version."""


class SolverError(LorafleetError):
    """The placement solver failed to produce a plan."""


class InfeasibleError(SolverError):
    """No placement satisfies the constraints; ``reasons`` say what to change."""

    def __init__(self, reasons: list[str] | tuple[str, ...]) -> None:
        self.reasons = tuple(reasons)
        super().__init__("; ".join(self.reasons) or "the placement problem is infeasible")


class ForecastError(LorafleetError):
    """No forecast can be made from the history given."""


class EngineError(LorafleetError):
    """A pod answered with an error, or did not answer."""

    def __init__(self, message: str, *, pod: str | None = None, status: int | None = None) -> None:
        self.pod = pod
        self.status = status
        super().__init__(f"{pod}: {message}" if pod else message)


class RetryableEngineError(EngineError):
    """Worth retrying later: a 5xx, a refused connection, a timeout.

    ``retry_after_s``: the wait the pod asked for in a ``Retry-After`` header, as read
    by the engine client (seconds from now, never negative), or None when it asked
    for none we could read. Whoever retries decides how much of it to honour.
    """

    def __init__(
        self,
        message: str,
        *,
        pod: str | None = None,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message, pod=pod, status=status)


class EngineTimeoutError(RetryableEngineError):
    """The pod did not answer within the engine client's ``timeout_s``. Retryable as any
    other, but a caller that must not wait on one hung pod (the controller's tick
    listings, ``EngineActuator.registered``) tries it once."""


class PermanentEngineError(EngineError):
    """Not worth retrying: the request itself is wrong for this pod."""


class LeadershipLostError(LorafleetError):
    """The lease (or the state directory's lock) is no longer ours, or not with time to
    spare for one more write: the write is not made, the job stops."""


class KubeError(LorafleetError):
    """The Kubernetes API refused a request."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class KubeConflictError(KubeError):
    """409 Conflict: the object changed since it was read."""


class RetryableKubeError(KubeError):
    """A 5xx or a transport failure talking to the Kubernetes API."""


class HistorySourceError(LorafleetError):
    """A request-history source (Prometheus) gave an answer that cannot be used."""


class RetryableHistorySourceError(HistorySourceError):
    """The history source is down, timed out or answered 5xx: try again later."""
