"""Reading YAML inputs field by field, collecting every problem instead of stopping.

``Reader`` keeps the problems of one file; the converters turn raw YAML values into
typed ones or raise ValueError with a message that ends up on the problem's line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import yaml

from placement.errors import InputError, Problem

T = TypeVar("T")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_BYTES = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_bytes(value: object) -> int:
    """``2GiB``, ``65.6MB``, ``512MiB`` or a plain as_integer, as a whole number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative: {value}")
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a byte size like 2GiB or 65.6MB, got {value!r}")
    match = _BYTES.match(value)
    if match is None:
        raise ValueError(f"expected a byte size like 2GiB or 65.6MB, got {value!r}")
    unit = (match.group(2) or "B").lower()
    return round(float(match.group(1)) * _UNITS[unit])


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and _DNS_LABEL.match(name) is not None


@dataclass
class Reader:
    """Collects problems for one file while reading its entries field by field."""

    source: str
    problems: list[Problem] = field(default_factory=list)

    def add(
        self,
        message: str,
        *,
        entry: str | None = None,
        field_: str | None = None,
        warn: bool = False,
    ) -> None:
        self.problems.append(
            Problem(
                source=self.source,
                entry=entry,
                field=field_,
                message=message,
                severity="warning" if warn else "error",
            )
        )

    def get(
        self,
        raw: Mapping[str, Any],
        key: str,
        convert: Callable[[Any], T],
        *,
        entry: str,
        default: T | None = None,
        required: bool = False,
    ) -> T | None:
        if key not in raw or raw[key] is None:
            if required:
                self.add("is required", entry=entry, field_=key)
            return default
        try:
            return convert(raw[key])
        except (TypeError, ValueError) as exc:
            self.add(str(exc), entry=entry, field_=key)
            return default


def load_yaml(path: Path, top_key: str) -> tuple[Reader, list[Any]]:
    """The list under ``top_key`` of a YAML file, or an InputError saying why not."""
    reader = Reader(str(path))
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(
            [Problem(source=str(path), message=f"cannot read: {exc.strerror}")]
        ) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputError([Problem(source=str(path), entry=where, message=str(problem))]) from None
    if not isinstance(document, dict) or not isinstance(document.get(top_key), list):
        raise InputError(
            [Problem(source=str(path), message=f"expected a mapping with a list under {top_key!r}")]
        )
    return reader, document[top_key]


def as_integer(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an as_integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}")
        return value

    return convert


def as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a as_number, got {value!r}")
    if value < 0:
        raise ValueError(f"cannot be negative, got {value}")
    return float(value)


def as_text(value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool) or value == "":
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return str(value)


def as_dns_name(value: Any) -> str:
    text = as_text(value)
    if not is_dns_label(text):
        raise ValueError(
            f"{text!r} is not a DNS label (lower-case letters, digits and '-', at most 63)"
        )
    return text


def as_strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"expected a list of as_strings, got {value!r}")
    return tuple(value)


def as_labels(value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of as_labels, got {value!r}")
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


def raise_errors(problems: list[Problem]) -> None:
    if any(problem.severity == "error" for problem in problems):
        raise InputError(problems)
