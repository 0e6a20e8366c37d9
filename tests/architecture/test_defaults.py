"""One source of defaults: the settings tree, ``placement/settings.py``.

Every field of a ``*Settings`` dataclass has its default there and nowhere else. Below
the entry points a parameter or field named after a settings field (or one of the
``ALIASES``) has no default: the caller passes the value from its settings. At the
edges, controller.yaml's fields and the CLI's options default to None, "not set", and
override the tree when given. This test reads the syntax of placement/, models/ and
policies/ and fails on any other default given to such a name, ``bucket_s: int = 600``
in a signature or ``no_load_kv_usage: float = 0.85`` in a context.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from placement import settings as settings_module

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("placement", "models", "policies")
SETTINGS_FILE = "placement/settings.py"

#: The names settings fields go by where they are passed down under another name.
ALIASES = {
    "replicas": "hash_replicas",
    "lead_s": "preload_lead_s",
    "flush_interval_s": "log_flush_s",
    "concurrency": "max_concurrency",
    "deadline_s": "per_action_deadline_s",
    "bucket": "bucket_s",
    "horizon": "horizon_s",
    "ingest_s": "ingest_interval_s",
    "forecast_s": "forecast_interval_s",
    "plan_s": "plan_interval_s",
    "watchdog_s": "watchdog_interval_s",
}

#: Too generic to mean one setting: every random source has its own seed, and
#: PlannerSettings.seed is only CP-SAT's.
GENERIC = frozenset({"seed"})

#: Declarations that share a setting's name but not its meaning, each with the reason.
UNRELATED = {
    ("placement/emulator/config.py", "kv_capacity_tokens"): (
        "an emulated pod's own KV cache (the emulate command's option), not the simulator's"
    ),
    ("policies/eviction.py", "policy"): "the eviction policy, not RouterSettings.policy",
    ("placement/demo/prepare.py", "lead_s"): "wall seconds the demo's controller runs first",
    ("placement/demo/traffic.py", "concurrency"): "the demo's requests in flight, not calls",
    ("placement/adapters/http_engine.py", "max_connections"): (
        "an engine client's own pool (httpx's default), not the router's proxy pool"
    ),
}


def settings_fields() -> dict[str, list[str]]:
    """Each field name of the settings tree's sections, with the sections that have it."""
    fields: dict[str, list[str]] = {}
    for value in vars(settings_module).values():
        if (
            isinstance(value, type)
            and dataclasses.is_dataclass(value)
            and value is not settings_module.Settings  # the root: its fields are sections
        ):
            for field in dataclasses.fields(value):
                fields.setdefault(field.name, []).append(value.__name__)
    return fields


def _field_default(value: ast.expr) -> ast.expr | None:
    """The default in ``Field(...)``/``field(...)``, the value itself otherwise; None
    when the call has none (a required pydantic field with constraints only)."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) in {"Field", "field"}:
        given = {kw.arg: kw.value for kw in value.keywords}
        for key in ("default", "default_factory"):
            if key in given:
                return given[key]
        return value.args[0] if value.args else None
    return value


def declared_defaults(source: str) -> Iterator[tuple[str, int, str]]:
    """(name, line, default) for every parameter default and class-level field default
    that is not None ("not set")."""
    for node in ast.walk(ast.parse(source)):
        pairs: list[tuple[str, ast.expr | None]] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = node.args
            positional = args.posonlyargs + args.args
            skipped = len(positional) - len(args.defaults)
            pairs += [(a.arg, d) for a, d in zip(positional[skipped:], args.defaults, strict=True)]
            pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
        elif isinstance(node, ast.ClassDef):
            pairs += [
                (stmt.target.id, _field_default(stmt.value))
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.value is not None
            ]
        for name, default in pairs:
            if default is None or (isinstance(default, ast.Constant) and default.value is None):
                continue
            yield name, default.lineno, ast.unparse(default)


def second_defaults(
    files: dict[str, str], fields: dict[str, list[str]]
) -> tuple[list[str], set[tuple[str, str]]]:
    """Each default declared outside the settings tree for a setting's name, and the
    ``UNRELATED`` entries that were met."""
    found: list[str] = []
    met: set[tuple[str, str]] = set()
    for path, source in sorted(files.items()):
        for name, line, default in declared_defaults(source):
            setting = ALIASES.get(name, name)
            if setting not in fields or name in GENERIC:
                continue
            if (path, name) in UNRELATED:
                met.add((path, name))
                continue
            owners = "/".join(fields[setting])
            found.append(f"{path}:{line}: {name} = {default} ({owners}.{setting} has it)")
    return found, met


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() != SETTINGS_FILE
    }


def test_every_default_of_a_setting_is_declared_once(sources: dict[str, str]) -> None:
    found, met = second_defaults(sources, settings_fields())
    assert found == [], "pass these from the settings tree:\n" + "\n".join(found)
    assert set(UNRELATED) - met == set(), "UNRELATED entries that no longer match anything"


def documented_defaults(text: str) -> dict[tuple[str, str], str]:
    """(section, field) -> default, from docs/configuration.md's tables."""
    rows: dict[tuple[str, str], str] = {}
    section = ""
    for line in text.splitlines():
        if heading := re.match(r"### `(\w+)`", line):
            section = heading.group(1)
        elif (row := re.match(r"\| `(\w+)` \| `([^`]*)` \|", line)) and section:
            rows[section, row.group(1)] = row.group(2)
    return rows


def test_the_reference_lists_every_setting_with_its_default() -> None:
    """docs/configuration.md is a checked copy, not a second source."""
    code = {
        (section.__name__, field.name): repr(field.default)
        for section in vars(settings_module).values()
        if isinstance(section, type)
        and dataclasses.is_dataclass(section)
        and section is not settings_module.Settings
        for field in dataclasses.fields(section)
        if field.default is not dataclasses.MISSING
    }
    documented = documented_defaults((ROOT / "docs" / "configuration.md").read_text())
    assert documented == code


def test_aliases_name_settings_fields() -> None:
    assert set(ALIASES.values()) - set(settings_fields()) == set()


def test_the_check_finds_a_planted_second_default() -> None:
    planted = textwrap.dedent(
        """
        from dataclasses import dataclass, field
        from pydantic import BaseModel, Field

        def forecast(counts, *, bucket_s: int = 600, horizon_s: int) -> None: ...

        @dataclass
        class Context:
            no_load_kv_usage: float = 0.85
            reject_kv_usage: float = field(default=0.95)
            seed: int = 0

        class Section(BaseModel):
            replicate_share: float | None = Field(default=None, gt=0)
            plan_s: int = Field(default=300, ge=1)
            max_loads_per_pod: int = Field(ge=1)
            lead_s: int = 900
        """
    )
    found, _ = second_defaults({"planted.py": planted}, settings_fields())
    named = [entry.split(": ", 1)[1].split(" = ")[0] for entry in found]
    assert named == ["bucket_s", "no_load_kv_usage", "reject_kv_usage", "plan_s", "lead_s"]
