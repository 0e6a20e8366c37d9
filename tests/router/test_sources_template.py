"""The router and adapters its catalog lacks: loaded from the source template on an
emulated pod, refused when no source can be made; the catalog file re-read when it
changes, a broken edit refused with the last good catalog kept."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import openai
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from placement.cli.app import app
from placement.domain import AdapterId
from placement.inputs.catalog import CatalogFile
from placement.router import MemoryRequestLog, build_router
from placement.router.sources import TemplateSources
from placement.router.wiring import ServedApp
from placement.settings import InputSettings
from tests.router.conftest import MANUAL, Pods, Running, emulated

TEMPLATE = "s3://adapters/{name}"


def entry(name: str, *, rank: object = 8, source: str | None = None) -> str:
    return (
        f"- name: {name}\n  base_model: base-model\n  rank: {rank}\n  size_bytes: 1000000\n"
        f"  source: {source or 's3://catalogued/' + name}\n"
    )


@contextlib.contextmanager
def router_with_catalog(
    pods: Pods, path: Path, *, template: str | None = TEMPLATE
) -> Iterator[Running]:
    settings = replace(MANUAL, inputs=InputSettings(adapter_source_template=template))
    catalog_file = CatalogFile(path, fleet=pods.domain, rules=settings.inputs)
    log, registry = MemoryRequestLog(), CollectorRegistry()
    router_app = build_router(
        fleet=pods.domain,
        catalog=catalog_file.poll(),
        catalog_file=catalog_file,
        settings=settings,
        registry=registry,
        request_log=log,
    )
    with ServedApp(router_app) as served:
        running = Running(app=router_app, served=served, log=log, registry=registry)
        try:
            yield running
        finally:
            running.close()


def loaded_from(pods: Pods, name: str) -> set[str]:
    """The paths the pods list ``name`` with."""
    return {
        handle.pod.listed[name].path for handle in pods.fleet.handles if name in handle.pod.listed
    }


def ask(router: Running, model: str) -> str:
    answer = router.client().completions.create(model=model, prompt="a", max_tokens=1)
    return answer.choices[0].text


def test_an_adapter_the_catalog_lacks_is_loaded_from_the_template(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("adapters:\n" + entry("alpha"))
    with emulated(2) as pods, router_with_catalog(pods, path) as router:
        assert ask(router, "ab-variant-7")
        assert loaded_from(pods, "ab-variant-7") == {"s3://adapters/ab-variant-7"}
        assert ask(router, "alpha")  # a catalogued adapter keeps its own source
        assert loaded_from(pods, "alpha") == {"s3://catalogued/alpha"}


@pytest.mark.parametrize(
    ("template", "model", "refusal"),
    [
        pytest.param(None, "ab-variant-7", openai.NotFoundError, id="no-template"),
        # The front door refuses a name no template could take before any lookup.
        pytest.param(TEMPLATE, "AB_Variant", openai.BadRequestError, id="not-a-dns-label"),
        pytest.param(TEMPLATE, "x/../../etc", openai.BadRequestError, id="a-path"),
    ],
)
def test_a_name_with_no_source_is_refused_and_nothing_is_loaded(
    tmp_path: Path, template: str | None, model: str, refusal: type[Exception]
) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("adapters:\n" + entry("alpha"))
    with (
        emulated(1) as pods,
        router_with_catalog(pods, path, template=template) as router,
        pytest.raises(refusal),
    ):
        ask(router, model)
    assert pods.counter("loads") == 0


def test_a_catalog_edit_is_picked_up_and_a_broken_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("adapters:\n" + entry("alpha"))
    with emulated(1) as pods, router_with_catalog(pods, path, template=None) as router:
        path.write_text("adapters:\n" + entry("alpha") + entry("beta", source="s3://b/beta"))
        router.refresh_plan()
        assert ask(router, "beta")
        assert loaded_from(pods, "beta") == {"s3://b/beta"}
        known = router.router.adapters
        path.write_text("adapters:\n" + entry("alpha", rank="eight") + entry("gamma"))
        router.refresh_plan()
        assert router.router.adapters is known  # refused: the last good catalog stays
        with pytest.raises(openai.NotFoundError):
            ask(router, "gamma")
        path.write_text("adapters:\n" + entry("gamma"))
        router.refresh_plan()
        assert router.router.adapters.sources == {AdapterId("gamma"): "s3://catalogued/gamma"}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param("s3://adapters/fixed", "holds no {name}", id="no-name"),
        pytest.param("http://{name}/x", "scheme http:// is not allowed", id="scheme"),
        pytest.param("/etc/{name}", "is not under /adapters", id="outside-roots"),
    ],
)
def test_a_bad_template_flag_is_refused_naming_it(
    tmp_path: Path, template: str, expected: str
) -> None:
    result = CliRunner().invoke(
        app,
        ["router", "--fleet", str(tmp_path / "f.yaml"), "--adapter-source-template", template],
    )
    assert result.exit_code == 2
    assert "--adapter-source-template" in result.output and expected in result.output


def test_template_sources_give_a_source_only_to_a_dns_label() -> None:
    sources = TemplateSources(TEMPLATE, rules=InputSettings())
    assert sources(AdapterId("ab-variant-7")) == "s3://adapters/ab-variant-7"
    assert sources(AdapterId("AB_Variant")) is None
    assert sources(AdapterId("a.b")) is None  # a dot could make '..'
