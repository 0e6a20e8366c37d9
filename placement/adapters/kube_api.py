"""The Kubernetes API client, where lorafleet's objects live, and the client's errors
turned into lorafleet's, shared by the cluster ports of ``adapters.kube`` and
``adapters.kube_configmaps``.

Every client exception leaves through ``translated`` as a ``KubeError`` subclass: 409
becomes ``KubeConflictError``; 429, 5xx and transport failures ``RetryableKubeError``.
Each call gives up after ``KubeTarget.request_timeout_s`` (the controller passes
``ControllerSettings.api_timeout_s``, shorter than the lease's renew deadline).

Must not decide anything, nor read or write an object itself: the ports do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from placement.errors import KubeConflictError, KubeError, RetryableKubeError
from placement.ports import POOL_LABEL

#: The labels of the objects lorafleet creates.
OWNED_LABELS = {"app.kubernetes.io/managed-by": "lorafleet"}


@dataclass(frozen=True, kw_only=True)
class KubeTarget:
    """Where lorafleet's objects live and how serving pods are found."""

    namespace: str
    selector: str = "app.kubernetes.io/component=lora-server"
    pool_label: str = POOL_LABEL
    #: A pod's pool when it lacks ``pool_label``; None leaves such pods out.
    default_pool: str | None = None
    port_name: str = "http"
    default_port: int = 8000
    plan_configmap: str = "lorafleet-plan"
    state_configmap: str = "lorafleet-state"
    hot_sets_configmap: str = "lorafleet-hot-sets"
    lease_name: str = "lorafleet-controller"
    request_timeout_s: float = 5.0


def connect(*, host: str | None = None) -> client.ApiClient:
    """An API client: to ``host`` when given (tests, proxies), else in-cluster or kubeconfig."""
    if host is not None:
        configuration = client.Configuration(host=host, retries=False)
        return client.ApiClient(configuration)
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            raise KubeError(f"no Kubernetes configuration found: {exc}") from None
    return client.ApiClient()


def _api_message(exc: ApiException) -> str:
    """The Status object's message; else the reason, with the start of a body that is
    not a Status (a proxy's plain-text or HTML answer says what failed)."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError, RecursionError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    reason = str(exc.reason or "no reason given")
    raw = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body
    text = " ".join(str(raw or "").split())
    return f"{reason}: {text[:300]}" if text and body is None else reason


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn the client's exceptions into lorafleet's KubeError tree."""
    try:
        yield
    except ApiException as exc:
        status = int(exc.status or 0)
        message = f"{what}: HTTP {status}: {_api_message(exc)}"
        if status == 409:
            raise KubeConflictError(message, status=status) from None
        if status in {0, 429} or status >= 500:
            raise RetryableKubeError(message, status=status) from None
        raise KubeError(message, status=status) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise RetryableKubeError(f"{what}: {type(exc).__name__}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # the client could not parse the answer
        raise KubeError(f"{what}: malformed answer: {type(exc).__name__}: {exc}") from None


def not_found(exc: KubeError) -> bool:
    return exc.status == 404
