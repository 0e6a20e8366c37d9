"""catalog.yaml's ``class``: production, batch or experiment, production by default;
anything else is one line naming the adapter, the field and the allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import AdapterClass, AdapterId
from placement.errors import InputError
from placement.inputs.catalog import load_catalog, parse_catalog

CATALOG = """adapters:
  - {{name: support-v1, base_model: llama-3.1-8b, rank: 16, source: /adapters/s1{first}}}
  - {{name: support-v2, base_model: llama-3.1-8b, rank: 16, source: /adapters/s2{second}}}
"""


def write(tmp_path: Path, first: str = "", second: str = "") -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(CATALOG.format(first=first, second=second))
    return path


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        pytest.param("", AdapterClass.PRODUCTION, id="default"),
        pytest.param(", class: production", AdapterClass.PRODUCTION, id="production"),
        pytest.param(", class: batch", AdapterClass.BATCH, id="batch"),
        pytest.param(", class: experiment", AdapterClass.EXPERIMENT, id="experiment"),
    ],
)
def test_class_is_read(tmp_path: Path, field: str, expected: AdapterClass) -> None:
    catalog = load_catalog(write(tmp_path, second=field))
    classes = {a.name: a.adapter_class for a in catalog.adapters}
    assert classes == {
        AdapterId("support-v1"): AdapterClass.PRODUCTION,
        AdapterId("support-v2"): expected,
    }


@pytest.mark.parametrize(
    ("field", "shown"),
    [
        pytest.param(", class: prod", "'prod'", id="misspelt"),
        pytest.param(", class: Production", "'Production'", id="case"),
        pytest.param(", class: 3", "'3'", id="number"),
    ],
)
def test_unknown_class_names_adapter_field_and_allowed_values(
    tmp_path: Path, field: str, shown: str
) -> None:
    _, problems = parse_catalog(write(tmp_path, first=field), None)
    assert [str(p) for p in problems] == [
        f"{tmp_path / 'catalog.yaml'}: adapter support-v1: class: unknown class {shown} "
        "(allowed: production, batch, experiment)"
    ]
    with pytest.raises(InputError):
        load_catalog(write(tmp_path, first=field))


def test_validate_prints_the_class_problem_as_one_line(tmp_path: Path) -> None:
    catalog = write(tmp_path, second=", class: canary").read_text()
    path = tmp_path / "catalog-70b.yaml"
    path.write_text(catalog.replace("llama-3.1-8b", "llama-3.1-70b"))
    fleet = Path(__file__).parent / "corpus" / "fleet-ok.yaml"
    result = CliRunner().invoke(app, ["validate", "--catalog", str(path), "--fleet", str(fleet)])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"error: {path}: adapter support-v2: class: unknown class 'canary' "
        "(allowed: production, batch, experiment)",
        "1 errors, 0 warnings",
    ]
