"""The catalog as it changes under a running process: ``CatalogFile`` re-reads it when
its bytes change and refuses a bad version; ``unannounced_adapter`` and the source
template make an entry for an adapter the catalog lacks, and only a safe one."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from placement.domain import AdapterClass
from placement.errors import InputError
from placement.inputs.catalog import CatalogFile, unannounced_adapter
from placement.inputs.fields import is_dns_label
from placement.inputs.sources import check_source, source_from_template
from placement.settings import InputSettings

RULES = InputSettings(adapter_source_template="s3://adapters/{name}")
TEMPLATES = ("s3://adapters/{name}", "gs://b/{name}/v1", "/adapters/{name}", "org/{name}")
DNS_LABELS = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)


def entry(name: str, rank: object = 8) -> str:
    return (
        f"- name: {name}\n  base_model: llama-3.1-8b\n  rank: {rank}\n"
        f"  source: s3://adapters/{name}\n"
    )


@given(name=DNS_LABELS, template=st.sampled_from(TEMPLATES))
def test_a_dns_label_fills_a_template_into_a_source_the_rules_allow(
    name: str, template: str
) -> None:
    source = source_from_template(template, name, rules=RULES)
    assert source == template.replace("{name}", name)
    assert check_source(source, rules=RULES) == source


@given(name=st.text(alphabet=string.printable + "é/\\.", max_size=80))
@example(name="../../etc/shadow")
@example(name="a/../b")
@example(name="metadata.google.internal")
@example(name="")
def test_any_other_name_is_refused_with_a_value_error(name: str) -> None:
    if is_dns_label(name):
        return
    for template in (*TEMPLATES, "s3://{name}/x"):
        with pytest.raises(ValueError, match="not a DNS label"):
            source_from_template(template, name, rules=RULES)


def test_a_name_in_the_host_is_checked_as_any_host() -> None:
    rules = InputSettings(adapter_schemes=("https",))
    assert source_from_template("https://{name}.example/x", "ab", rules=rules)
    with pytest.raises(ValueError, match="metadata"):
        source_from_template("https://{name}/x", "metadata", rules=rules)


def test_an_unannounced_adapter_takes_the_settings_defaults() -> None:
    made = unannounced_adapter("ab-variant-7", base_model="llama-3.1-8b", rules=RULES)
    assert made.source == "s3://adapters/ab-variant-7"
    assert (made.rank, made.size_bytes) == (RULES.unannounced_rank, RULES.unannounced_size_bytes)
    assert made.adapter_class is AdapterClass.EXPERIMENT
    with pytest.raises(ValueError, match="no adapter_source_template"):
        unannounced_adapter("ab", base_model="llama-3.1-8b", rules=InputSettings())


def test_the_catalog_file_answers_only_a_change(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("adapters:\n" + entry("a0"))
    source = CatalogFile(path, fleet=None, rules=RULES)
    first = source.poll()
    assert first is not None and first.names() == {"a0"}
    assert source.poll() is None
    path.write_text("adapters:\n" + entry("a0"))  # rewritten, same bytes
    assert source.poll() is None
    path.write_text("adapters:\n" + entry("a0") + entry("a1"))
    second = source.poll()
    assert second is not None and second.names() == {"a0", "a1"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("adapters:\n" + entry("a0", rank="x"), "adapter a0: rank", id="field"),
        pytest.param("adapters:\n" + entry("a0") + "- name: [\n", "line 7", id="yaml"),
        pytest.param("adapters: 3\n", "expected a mapping with a list", id="shape"),
        pytest.param("adapters:\n" + entry("a0") + entry("a0"), "used 2 times", id="twice"),
    ],
)
def test_a_bad_version_is_refused_until_the_file_changes(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("adapters:\n" + entry("a0"))
    source = CatalogFile(path, fleet=None, rules=RULES)
    good = source.poll()
    path.write_text(text)
    for _ in range(2):  # the same error again, without a second parse
        with pytest.raises(InputError) as raised:
            source.poll()
        assert str(path) in str(raised.value) and expected in str(raised.value)
    path.unlink()
    with pytest.raises(InputError, match="cannot read"):
        source.poll()
    path.write_text("adapters:\n" + entry("a0"))
    assert source.poll() == good  # good again: said once, so the refusal can end
    assert source.poll() is None
