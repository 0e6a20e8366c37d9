"""What a catalog adapter's ``source`` may be: only what the engines can load.

The source goes to the pods as vLLM's and SGLang's ``lora_path``, so a catalog entry
must not become a way to make a pod read its own secrets (``file:///etc/shadow``) or
fetch from the cloud's metadata service (``http://169.254.169.254/...``). Accepted:

- an absolute local path under one of ``InputSettings.adapter_roots`` (the directories
  the pods mount adapters at), or the same as a ``file://`` URL; no ``..`` anywhere;
- a Hugging Face repository id, ``org/name``;
- a URL whose scheme is in ``InputSettings.adapter_schemes`` (``s3``, ``gs`` by
  default), whose host is not a link-local address (169.254.0.0/16, fe80::/10) or a
  cloud metadata name.

An adapter the catalog lacks may be resolved through ``adapter_source_template``
(``s3://adapters/{name}``): ``source_from_template`` fills in its name, which must be a
DNS label (so it can add no ``/``, ``..`` or host of its own), and checks the result
as any source; ``check_source_template`` checks the template itself at start-up.

Pure: string checks only, no file system and no name resolution.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from urllib.parse import urlsplit

from placement.inputs.fields import is_dns_label
from placement.settings import InputSettings

MAX_SOURCE_CHARS = 1024
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: Names that resolve to a cloud's instance metadata service.
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "100.100.100.200",  # Alibaba Cloud's metadata address (not link-local)
        "fd00:ec2::254",  # AWS's metadata address over IPv6
    }
)
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
#: What a source template must hold, once or more: the adapter's name.
NAME_FIELD = "{name}"
#: The name a template is tried with at start-up.
_PROBE_NAME = "example-adapter"


def check_source(source: str, *, rules: InputSettings) -> str:
    """``source`` when an engine may be given it, else ValueError saying why not."""
    if len(source) > MAX_SOURCE_CHARS:
        raise ValueError(f"longer than {MAX_SOURCE_CHARS} characters")
    if not source.isprintable() or any(c.isspace() for c in source):
        raise ValueError(f"{source[:80]!r} holds spaces or control characters")
    scheme = _SCHEME.match(source)
    if scheme is not None:
        return _check_url(source, scheme.group(1).lower(), rules=rules)
    if source.startswith("/"):
        _check_under_roots(source, rules=rules)
        return source
    if _HF_REPO.match(source) and ".." not in source:
        return source
    raise ValueError(
        f"{source[:80]!r} is neither an absolute path under {_roots(rules)}, a Hugging Face "
        f"repository id (org/name), nor a URL with scheme {_schemes(rules)}"
    )


def check_source_template(template: str, *, rules: InputSettings) -> str:
    """``template`` when every adapter name fills it into a source an engine may be
    given, else ValueError saying why not (no ``{name}``, another ``{...}``, or a
    source ``check_source`` refuses)."""
    if NAME_FIELD not in template:
        raise ValueError(f"{template[:80]!r} holds no {NAME_FIELD} for the adapter's name")
    rest = template.replace(NAME_FIELD, "")
    if "{" in rest or "}" in rest:
        raise ValueError(f"{template[:80]!r}: only {NAME_FIELD} may stand in braces")
    check_source(template.replace(NAME_FIELD, _PROBE_NAME), rules=rules)
    return template


def source_from_template(template: str, name: str, *, rules: InputSettings) -> str:
    """The source ``template`` gives adapter ``name``, else ValueError saying why none:
    a name that is not a DNS label (it would change the source's shape), or a source
    ``check_source`` refuses."""
    if not is_dns_label(name):
        raise ValueError(
            f"{name[:80]!r} is not a DNS label (lower-case letters, digits and '-', at "
            f"most 63): no source is made from it"
        )
    check_source_template(template, rules=rules)
    return check_source(template.replace(NAME_FIELD, name), rules=rules)


def _check_url(source: str, scheme: str, *, rules: InputSettings) -> str:
    parts = urlsplit(source)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URL with a host ({parts.netloc!r}) is not a local path")
        _check_under_roots(parts.path, rules=rules)
        return source
    if scheme not in {s.lower() for s in rules.adapter_schemes}:
        raise ValueError(f"scheme {scheme}:// is not allowed (allowed: {_schemes(rules)})")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise ValueError(f"{source[:80]!r} names no host or bucket")
    if host in METADATA_HOSTS or _is_link_local(host):
        raise ValueError(f"{host} is a link-local or metadata address")
    return source


def _is_link_local(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in network for network in _LINK_LOCAL)


def _check_under_roots(path: str, *, rules: InputSettings) -> None:
    if ".." in path.split("/"):
        raise ValueError(f"{path[:80]!r} holds '..'")
    normal = posixpath.normpath(path)
    for root in rules.adapter_roots:
        base = posixpath.normpath(root)
        if normal == base or normal.startswith(base.rstrip("/") + "/"):
            return
    raise ValueError(f"{path[:80]!r} is not under {_roots(rules)}")


def _roots(rules: InputSettings) -> str:
    return ", ".join(rules.adapter_roots) or "no root (local paths are off)"


def _schemes(rules: InputSettings) -> str:
    return ", ".join(f"{s}://" for s in rules.adapter_schemes) or "none"
