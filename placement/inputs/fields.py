"""Reading YAML inputs field by field, collecting every problem instead of stopping.

``Reader`` keeps the problems of one file; the converters turn raw YAML values into
typed ones or raise ValueError with a message that ends up on the problem's line.

``parse_yaml`` is the one YAML parser of the files people write (catalog, fleet,
pipelines, controller.yaml): PyYAML's safe loader made strict. A key given twice
in one mapping is an error naming the key and its line (YAML says keys are unique;
PyYAML would silently keep the last). Aliases (``*name``) are refused: an "alias
bomb" of nested aliases expands to billions of nodes from a few lines, and nothing
lorafleet reads needs them. Nesting deeper than the parser's stack, a file that is
not UTF-8, and any other YAML error are one line each, never a traceback.

``validation_problems`` gives the problems of a file read into a pydantic model
(controller.yaml, a scenario): one per error, named by its field.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from placement.errors import InputError, Problem
from placement.inputs.files import read_text

T = TypeVar("T")

#: Matched whole (``fullmatch``): ``$`` alone would accept a trailing newline.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
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
    """``2GiB``, ``65.6MB``, ``512MiB`` or a plain integer, as a whole number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {_shown(value)}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte size cannot be negative: {value}")
        return value
    if isinstance(value, float) and value >= 0 and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a byte size like 2GiB or 65.6MB, got {_shown(value)}")
    match = _BYTES.match(value)
    if match is None:
        raise ValueError(f"expected a byte size like 2GiB or 65.6MB, got {_shown(value)}")
    unit = (match.group(2) or "B").lower()
    size = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(size):
        raise ValueError(f"a byte size out of range: {_shown(value)}")
    return round(size)


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and _DNS_LABEL.fullmatch(name) is not None


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

    def unknown(self, raw: Mapping[Any, Any], known: frozenset[str], *, entry: str) -> None:
        """An error per key of ``raw`` outside ``known``, with the nearest known key: a
        typo (``p:`` for ``probability:``, ``max_lora:``) read silently would leave the
        default in force, as controller.yaml and scenario.yaml already refuse."""
        for key in raw:
            if str(key) in known:
                continue
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(sorted(known))}"
            self.add(f"unknown key ({hint})", entry=entry, field_=str(key))


class _StrictLoader(yaml.SafeLoader):
    """The safe loader, refusing aliases and keys repeated within one mapping."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event: yaml.AliasEvent = self.peek_event()  # type: ignore[no-untyped-call]
            mark: Any = event.start_mark
            raise yaml.composer.ComposerError(
                None,
                None,
                f"the alias *{event.anchor} is not allowed (aliases are refused: "
                "write each value out)",
                mark,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice in this mapping",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, *, source: str) -> Any:
    """One YAML document, strictly (see the module's docstring); InputError names the
    file and the line of the first problem."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputError([Problem(source=source, entry=where, message=str(problem))]) from None
    except RecursionError:
        raise InputError([Problem(source=source, message="nested too deeply")]) from None


def read_yaml(path: Path) -> Any:
    """The YAML document of a file (``parse_yaml``), InputError when unreadable."""
    return parse_yaml(read_text(path), source=str(path))


def load_yaml(path: Path, top_key: str) -> tuple[Reader, list[Any]]:
    """The list under ``top_key`` of a YAML file, or an InputError saying why not."""
    document = read_yaml(path)
    return reader_for(path, document, top_key)


def reader_for(
    path: Path, document: Any, top_key: str, *, also: frozenset[str] = frozenset()
) -> tuple[Reader, list[Any]]:
    """The list under ``top_key`` of a parsed document, with a Reader for the file that
    already holds an error per top-level key other than ``top_key`` and ``also``."""
    if not isinstance(document, dict) or not isinstance(document.get(top_key), list):
        raise InputError(
            [Problem(source=str(path), message=f"expected a mapping with a list under {top_key!r}")]
        )
    reader = Reader(str(path))
    reader.unknown(document, also | {top_key}, entry="top level")
    return reader, document[top_key]


def validation_problems(exc: ValidationError, *, source: str) -> list[Problem]:
    """One problem of ``source`` per error of a pydantic model's validation, its field
    the error's location joined by dots."""
    return [
        Problem(
            source=source,
            field=".".join(str(part) for part in error["loc"]) or None,
            message=error["msg"],
        )
        for error in exc.errors(include_url=False)
    ]


def as_integer(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"must be at least {minimum}, got {value}")
        return value

    return convert


def as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"number out of range: {value}") from None
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {value!r}")
    if number < 0:
        raise ValueError(f"cannot be negative, got {value}")
    return number


def above_zero(convert: Callable[[Any], T]) -> Callable[[Any], T]:
    """``convert``, then refuse 0: a pod of 0 requests/s or 0 GPU bytes, an adapter of
    0 bytes or an SLO of 0 ms passed validation and planned as nonsense."""

    def checked(value: Any) -> T:
        converted = convert(value)
        if not converted > 0:  # type: ignore[operator]
            raise ValueError(f"must be above 0, got {value!r}")
        return converted

    return checked


def as_text(value: Any) -> str:
    if not isinstance(value, str | int | float) or isinstance(value, bool) or value == "":
        raise ValueError(f"expected a non-empty string, got {_shown(value)}")
    return str(value)


def _shown(value: Any, limit: int = 60) -> str:
    """``repr`` cut short: a value may be a huge structure."""
    simple = isinstance(value, str | int | float | bool | None)
    text = repr(value) if simple else type(value).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def as_url(value: Any) -> str:
    """An engine's base URL: ``http://`` or ``https://`` and a host (``url: 5`` or
    ``url: pod-0:8000`` passed, and every call to the pod failed later)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a URL like http://pod-0:8000, got {_shown(value)}")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises on a port that is not a number in range)
    except ValueError:
        raise ValueError(f"not a valid URL: {_shown(value)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL with a host, got {_shown(value)}")
    return value


def as_dns_name(value: Any) -> str:
    text = as_text(value)
    if not is_dns_label(text):
        raise ValueError(
            f"{_shown(text)} is not a DNS label (lower-case letters, digits and '-', at most 63)"
        )
    return text


def as_strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"expected a list of strings, got {_shown(value)}")
    return tuple(value)


def as_labels(value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of labels, got {_shown(value)}")
    return MappingProxyType({str(k): str(v) for k, v in value.items()})


def raise_errors(problems: list[Problem]) -> None:
    if any(problem.severity == "error" for problem in problems):
        raise InputError(problems)
