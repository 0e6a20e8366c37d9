"""`lorafleet validate` names every planted fault on its own line, with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from placement.cli.app import app

CORPUS = Path(__file__).parent / "corpus"
runner = CliRunner()


def validate(*args: str) -> tuple[int, list[str]]:
    result = runner.invoke(app, ["validate", *args])
    return result.exit_code, result.output.splitlines()


@pytest.fixture(scope="module")
def everything_wrong() -> tuple[int, list[str]]:
    return validate(
        "--catalog", str(CORPUS / "catalog-bad.yaml"),
        "--fleet", str(CORPUS / "fleet-bad.yaml"),
        "--pipelines", str(CORPUS / "pipelines-bad.yaml"),
        "--log", str(CORPUS / "log-bad.csv"),
    )  # fmt: skip


PLANTED = [
    pytest.param(
        "fleet-bad.yaml: pod pod-0: name: pod name 'pod-0' is used 2 times", id="duplicate-pod"
    ),
    pytest.param(
        "fleet-bad.yaml: pool llama-70b: pods[2]: name: 'Pod_2' is not a DNS label",
        id="pod-not-dns",
    ),
    pytest.param(
        "pod pod-3: max_cpu_loras: max_cpu_loras (4) is below max_loras (8)", id="cpu-below-gpu"
    ),
    pytest.param("pool llama-70b: max_lora_rank: vLLM accepts only", id="bad-max-rank"),
    pytest.param("pod pod-4: hbm_adapter_bytes: expected a byte size", id="bad-bytes"),
    pytest.param(
        "adapter legal-assistant-v2: name: adapter name 'legal-assistant-v2' is used 2 times",
        id="duplicate-adapter",
    ),
    pytest.param("adapters[2]: name: 'Medical_QA' is not a DNS label", id="adapter-not-dns"),
    pytest.param(
        "adapter pinned-nowhere: pinned: pinned to unknown pod 'pod-9'", id="pin-unknown-pod"
    ),
    pytest.param(
        "adapter too-big: rank: rank 128 is above max_lora_rank 24 of pool llama-70b",
        id="rank-too-high",
    ),
    pytest.param(
        "adapter orphan: base_model: no pool serves base model 'gemma-2-9b'", id="no-pool-for-base"
    ),
    pytest.param("adapter orphan: size_bytes: size cannot be computed", id="size-unknown"),
    pytest.param("adapter no-rank: rank: is required", id="missing-rank"),
    pytest.param(
        "steps[0]: probability: a probability is at most 1, got 1.5", id="bad-probability"
    ),
    pytest.param(
        "steps[1]: adapter: unknown adapter 'ghost-adapter'", id="pipeline-unknown-adapter"
    ),
    pytest.param(
        "logins acme: adapters: unknown adapter 'nobody-knows-me'", id="login-unknown-adapter"
    ),
    pytest.param("log-bad.csv: line 4: ts: 1 unparsable timestamps", id="unparsable-ts"),
    pytest.param(
        "log-bad.csv: line 5: ts: 1 timestamps earlier than the line before", id="out-of-order"
    ),
    pytest.param("log-bad.csv: line 3: prompt_tokens: 1 negative values", id="negative-tokens"),
    pytest.param("warning: ", id="unknown-adapter-in-log-is-a-warning"),
]


@pytest.mark.parametrize("expected", PLANTED)
def test_every_planted_fault_has_its_own_line(
    everything_wrong: tuple[int, list[str]], expected: str
) -> None:
    code, lines = everything_wrong
    assert code == 2
    assert sum(expected in line for line in lines) >= 1, "\n".join(lines)


def test_unknown_adapters_in_the_log_are_counted_warnings(
    everything_wrong: tuple[int, list[str]],
) -> None:
    _, lines = everything_wrong
    assert any(
        line.startswith("warning:")
        and "'stranger-adapter' is not in the catalog (1 requests)" in line
        for line in lines
    )


def test_no_traceback_for_broken_yaml() -> None:
    code, lines = validate(
        "--catalog",
        str(CORPUS / "catalog-ok.yaml"),
        "--fleet",
        str(CORPUS / "fleet-broken-yaml.yaml"),
    )
    assert code == 2
    assert any("fleet-broken-yaml.yaml: line 2:" in line for line in lines)
    assert not any("Traceback" in line for line in lines)


def test_negative_counts_in_an_aggregated_log() -> None:
    code, lines = validate(
        "--catalog", str(CORPUS / "catalog-ok.yaml"), "--fleet", str(CORPUS / "fleet-ok.yaml"),
        "--log", str(CORPUS / "log-aggregated-bad.csv"),
    )  # fmt: skip
    assert code == 2
    assert any("line 3: requests: 1 negative values" in line for line in lines)


def test_missing_file_is_named() -> None:
    code, lines = validate(
        "--catalog", str(CORPUS / "nope.yaml"), "--fleet", str(CORPUS / "fleet-ok.yaml")
    )
    assert code == 2
    assert any("nope.yaml: cannot read" in line for line in lines)


def test_good_inputs_pass() -> None:
    code, lines = validate(
        "--catalog", str(CORPUS / "catalog-ok.yaml"), "--fleet", str(CORPUS / "fleet-ok.yaml"),
        "--pipelines", str(CORPUS / "pipelines-ok.yaml"),
    )  # fmt: skip
    assert code == 0, lines
    assert lines[-1].startswith("ok: inputs are valid")


@pytest.mark.parametrize("scenario", ["war-story", "saas-50", "code-assistant", "legal-research"])
def test_shipped_scenarios_are_valid(repo_root: Path, scenario: str) -> None:
    folder = repo_root / "data" / scenario
    args = ["--catalog", str(folder / "catalog.yaml"), "--fleet", str(folder / "fleet.yaml")]
    if (folder / "pipelines.yaml").exists():
        args += ["--pipelines", str(folder / "pipelines.yaml")]
    code, lines = validate(*args)
    assert code == 0, lines
