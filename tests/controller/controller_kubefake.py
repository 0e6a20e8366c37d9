"""A fake Kubernetes API server at the HTTP level, for the official client to talk to.

It implements only what ``placement.adapters.kube`` uses: list and watch pods (with
label selectors), patch pods, get/create/replace ConfigMaps and Leases with
resourceVersion checks (a stale replace answers 409, as the real server does), and
queued faults (``inject``) so tests rehearse 500s and 409s. Runs on 127.0.0.1.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]

_CORE = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>pods|configmaps)(?:/(?P<name>[^/]+))?$"
)
_LEASES = re.compile(
    r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>leases)(?:/(?P<name>[^/]+))?$"
)
_KIND_NAMES = {"pods": "Pod", "configmaps": "ConfigMap", "leases": "Lease"}
#: A client may put its name before the API path (``api_host: http://HOST:PORT/NAME``),
#: so that a test can tell two controllers' requests apart.
_CLIENT = re.compile(r"^/(?P<who>[A-Za-z0-9-]+)(?=/apis?/)")


def make_pod(
    name: str,
    *,
    ip: str = "10.0.0.1",
    pool: str | None = "llama",
    ready: bool = True,
    port: int = 8000,
    labels: dict[str, str] | None = None,
) -> Obj:
    all_labels = {"app.kubernetes.io/component": "lora-server", **(labels or {})}
    if pool is not None:
        all_labels["lorafleet.io/pool"] = pool
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "lf", "labels": all_labels},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": "vllm",
                    "ports": [{"name": "http", "containerPort": port}],
                }
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _merge(target: Obj, patch: Obj) -> Obj:
    """JSON merge patch (RFC 7386), enough for labels and annotations."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def _selected(obj: Obj, selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "=" in term:
            key, _, value = term.partition("=")
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term not in labels:
            return False
    return True


@dataclass
class Fault:
    method: str
    kind: str
    status: int
    remaining: int


@dataclass
class Hold:
    """A request held by ``FakeApiServer.hold``: ``arrived`` is set when it comes in."""

    method: str
    kind: str
    who: str
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class Call:
    """One request: the client name before the API path ("" without one), the method,
    the API path and the status code answered (None until answered; 200 for a watch)."""

    who: str
    method: str
    path: str
    code: int | None = None


class FakeApiServer:
    """State plus an HTTP server thread; ``url`` is what the client's host is set to."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.requests: list[tuple[str, str]] = []
        #: Every request, in order: who sent it, what, and the status it was answered.
        self.calls: list[Call] = []
        self._versions = itertools.count(100)
        self._events: list[tuple[str, Obj]] = []
        self._changed = threading.Condition()
        self._closing = False
        self._faults: list[Fault] = []
        self._holds: list[Hold] = []
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's address: bytes only for AF_UNIX
        return f"http://{host}:{port}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        for held in self._holds:
            held.release.set()
        self.end_watches()
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def end_watches(self) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()

    def inject(self, method: str, kind: str, status: int, *, times: int = 1) -> None:
        """The next ``times`` requests of ``method`` on ``kind`` answer ``status``."""
        with self._lock:
            self._faults.append(Fault(method=method, kind=kind, status=status, remaining=times))

    # --- state ---------------------------------------------------------------

    def put(self, kind: str, obj: Obj, *, event: str | None = None) -> Obj:
        obj = copy.deepcopy(obj)
        obj.setdefault("kind", _KIND_NAMES[kind])
        meta = obj.setdefault("metadata", {})
        key = (kind, meta.get("namespace", "lf"), meta["name"])
        meta["namespace"] = key[1]
        meta["resourceVersion"] = str(next(self._versions))
        kind_event = event or ("MODIFIED" if key in self.objects else "ADDED")
        with self._changed:
            self.objects[key] = obj
            self._events.append((kind_event, copy.deepcopy(obj)))
            self._changed.notify_all()
        return obj

    def delete(self, kind: str, name: str, namespace: str = "lf") -> None:
        with self._changed:
            obj = self.objects.pop((kind, namespace, name))
            self._events.append(("DELETED", copy.deepcopy(obj)))
            self._changed.notify_all()

    def get(self, kind: str, name: str, namespace: str = "lf") -> Obj | None:
        return self.objects.get((kind, namespace, name))

    def hold(self, method: str, kind: str, *, who: str) -> Hold:
        """The next such request from ``who`` waits, received but not applied, until
        ``release`` is set: a client frozen between its checks and its write, as the
        server sees it (the write lands when the client wakes up)."""
        held = Hold(method=method, kind=kind, who=who)
        with self._lock:
            self._holds.append(held)
        return held

    def wait_if_held(self, method: str, kind: str, who: str) -> None:
        with self._lock:
            held = next(
                (
                    h
                    for h in self._holds
                    if (h.method, h.kind, h.who) == (method, kind, who) and not h.arrived.is_set()
                ),
                None,
            )
            if held is not None:
                held.arrived.set()
        if held is not None:
            held.release.wait(timeout=60)

    def take_fault(self, method: str, kind: str) -> int | None:
        with self._lock:
            for fault in self._faults:
                if fault.method == method and fault.kind == kind and fault.remaining > 0:
                    fault.remaining -= 1
                    return fault.status
        return None

    def events_since(self, index: int) -> tuple[int, list[tuple[str, Obj]]]:
        with self._changed:
            while index >= len(self._events) and not self._closing:
                self._changed.wait(timeout=0.05)
            return len(self._events), self._events[index:]

    @property
    def closing(self) -> bool:
        return self._closing

    def event_count(self) -> int:
        return len(self._events)


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    fake: FakeApiServer
    # HTTP/1.1 so that a watch streams in chunks, as the real server's does.
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    _call: Call | None = None

    def _send(self, code: int, body: Obj) -> None:
        if self._call is not None:
            self._call.code = code
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _dispatch(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        path, who = parts.path, ""
        if (client := _CLIENT.match(path)) is not None:
            path, who = path[client.end() :], client["who"]
        match = _CORE.match(path) or _LEASES.match(path)
        self.fake.requests.append((method, path))
        self._call = Call(who, method, path)
        self.fake.calls.append(self._call)
        if match is None:
            self._send(404, _status(404, "NotFound", f"no route {path}"))
            return
        ns, kind, name = match["ns"], match["kind"], match["name"]
        self.fake.wait_if_held(method, kind, who)
        fault = self.fake.take_fault(method, kind)
        if fault is not None:
            self._send(fault, _status(fault, "InternalError", f"injected {fault}"))
            return
        if method == "GET" and name is None:
            self._list(kind, ns, query)
        elif method == "GET":
            self._read(kind, ns, name)
        elif body is None:  # the API server's answer to a write without a body
            self._send(400, _status(400, "BadRequest", f"{method} {path}: no body"))
        elif method == "POST":
            self._create(kind, ns, body)
        elif method == "PUT":
            self._replace(kind, ns, name, body)
        elif method == "PATCH":
            self._patch(kind, ns, name, body)

    def _missing(self, kind: str, name: str) -> None:
        self._send(404, _status(404, "NotFound", f'{kind} "{name}" not found'))

    def _read(self, kind: str, ns: str, name: str) -> None:
        obj = self.fake.get(kind, name, ns)
        if obj is None:
            self._missing(kind, name)
        else:
            self._send(200, obj)

    def _create(self, kind: str, ns: str, body: Obj) -> None:
        name = body["metadata"]["name"]
        if self.fake.get(kind, name, ns) is not None:
            self._send(409, _status(409, "AlreadyExists", f'{kind} "{name}" already exists'))
            return
        body["metadata"]["namespace"] = ns
        self._send(201, self.fake.put(kind, body))

    def _replace(self, kind: str, ns: str, name: str, body: Obj) -> None:
        current = self.fake.get(kind, name, ns)
        if current is None:
            self._missing(kind, name)
            return
        version = body.get("metadata", {}).get("resourceVersion")
        if not version:
            msg = "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
            self._send(422, _status(422, "Invalid", msg))
            return
        if version != current["metadata"]["resourceVersion"]:
            msg = (
                f'Operation cannot be fulfilled on {kind} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again"
            )
            self._send(409, _status(409, "Conflict", msg))
            return
        body["metadata"]["namespace"] = ns
        self._send(200, self.fake.put(kind, body))

    def _patch(self, kind: str, ns: str, name: str, body: Obj) -> None:
        current = self.fake.get(kind, name, ns)
        if current is None:
            self._missing(kind, name)
            return
        self._send(200, self.fake.put(kind, _merge(copy.deepcopy(current), body)))

    def _list(self, kind: str, ns: str, query: dict[str, str]) -> None:
        selector = query.get("labelSelector", "")
        if query.get("watch") in {"true", "True", "1"}:
            self._watch(kind, ns, selector)
            return
        items = [
            obj
            for (k, n, _), obj in sorted(self.fake.objects.items())
            if k == kind and n == ns and _selected(obj, selector)
        ]
        self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    def _watch(self, kind: str, ns: str, selector: str) -> None:
        if self._call is not None:
            self._call.code = 200
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        start = self.fake.event_count()
        # No resourceVersion: the current state first, as synthetic ADDED events.
        initial = [
            ("ADDED", obj)
            for (k, n, _), obj in sorted(self.fake.objects.items())
            if k == kind and n == ns and _selected(obj, selector)
        ]
        self._write_events(initial)
        index = start
        while not self.fake.closing:
            index, events = self.fake.events_since(index)
            self._write_events(
                [
                    (t, o)
                    for t, o in events
                    if o.get("kind") == _KIND_NAMES[kind] and _selected(o, selector)
                ]
            )
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _write_events(self, events: list[tuple[str, Obj]]) -> None:
        for kind_event, obj in events:
            line = (json.dumps({"type": kind_event, "object": obj}) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()
