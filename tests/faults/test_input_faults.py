"""Inputs a clumsy operator or an attacker writes: each is one clear line from
``lorafleet validate`` (exit 2), never a traceback, a hang, or a value that passes
validation and then crashes a forecast."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.cli.app import app
from placement.controller.live_ports import FileHistory
from placement.inputs import load_request_log
from placement.inputs.sources import check_source
from placement.settings import InputSettings
from tests.faults.rig import LORAFLEET

CORPUS = Path(__file__).resolve().parents[1] / "inputs" / "corpus"
FLEET = CORPUS / "fleet-ok.yaml"
ADAPTER = "{name: legal, base_model: llama-3.1-70b, rank: 16, source: s3://a/legal}"


def validate(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["validate", *args])
    assert "Traceback" not in result.output
    return result.exit_code, result.output.splitlines()


def catalog(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    return path


def errors_of(tmp_path: Path, catalog_text: str) -> list[str]:
    code, lines = validate("--catalog", str(catalog(tmp_path, catalog_text)), "--fleet", str(FLEET))
    assert code == 2, lines
    return [line for line in lines if line.startswith("error:")]


# --- YAML -------------------------------------------------------------------------------

ALIAS_BOMB = "\n".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"{c}: &{c} [{','.join(['*' + p] * 9)}]"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "adapters:",
        "- {name: *i, base_model: llama-3.1-70b, rank: 16, source: s3://a/b}",
        "",
    ]
)


def test_an_alias_bomb_is_refused_at_the_first_alias(tmp_path: Path) -> None:
    path = catalog(tmp_path, ALIAS_BOMB)
    # A process, as an operator runs it: refused at once, in one line.
    done = subprocess.run(
        [str(LORAFLEET), "validate", "--catalog", str(path), "--fleet", str(FLEET)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "catalog.yaml: line 2: the alias *a is not allowed" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "adapters:\n- {name: a, name: b, base_model: llama-3.1-70b, rank: 16, source: s3://a/b}\n",
            "catalog.yaml: line 2: key 'name' is given twice in this mapping",
            id="duplicate-field",
        ),
        pytest.param(
            f"adapters:\n- {ADAPTER}\nadapters:\n- {ADAPTER}\n",
            "catalog.yaml: line 3: key 'adapters' is given twice",
            id="duplicate-top-key",
        ),
        pytest.param("adapters: " + "[" * 5000 + "]" * 5000, "nested too deeply", id="deep"),
    ],
)
def test_yaml_that_would_be_read_silently_wrong_is_an_error(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert any(expected in line for line in errors_of(tmp_path, text))


def test_a_binary_catalog_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    code, lines = validate("--catalog", str(path), "--fleet", str(FLEET))
    assert code == 2
    (error,) = [line for line in lines if line.startswith("error:")]
    assert "catalog.yaml: not UTF-8 text (byte 0x89 at offset 0)" in error


# --- numbers where counts go -----------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        pytest.param("rank", ".nan", "rank: expected an integer, got nan", id="rank-nan"),
        pytest.param("rank", ".inf", "rank: expected an integer, got inf", id="rank-inf"),
        pytest.param("rank", "16.5", "rank: expected an integer, got 16.5", id="rank-fraction"),
        pytest.param("alpha", ".nan", "alpha: expected a finite number", id="alpha-nan"),
        pytest.param("slo_ttft_ms", "-.inf", "expected a finite number", id="slo-minus-inf"),
        pytest.param("max_replicas", "2.0", "expected an integer, got 2.0", id="replicas-float"),
        pytest.param("size_bytes", ".inf", "expected a byte size", id="size-inf"),
        pytest.param("size_bytes", "9" * 400 + "GB", "byte size out of range", id="size-huge"),
    ],
)
def test_nan_inf_and_fractions_are_errors_where_counts_go(
    tmp_path: Path, field: str, value: str, expected: str
) -> None:
    entry = (
        f"{{name: legal, base_model: llama-3.1-70b, rank: 16, source: s3://a/l, {field}: {value}}}"
    )
    if field == "rank":
        entry = entry.replace("rank: 16, ", "")
    assert any(expected in line for line in errors_of(tmp_path, f"adapters:\n- {entry}\n"))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("NaN", "requests: 1 missing counts", id="nan"),
        pytest.param("Infinity", "requests: 1 infinite values", id="inf"),
        pytest.param("2.5", "requests: 1 values that are not whole numbers", id="fraction"),
        pytest.param("null", "requests: 1 missing counts", id="null"),
    ],
)
def test_an_aggregated_log_with_a_count_that_is_no_count_fails_validate(
    tmp_path: Path, value: str, expected: str
) -> None:
    log = tmp_path / "requests.jsonl"
    log.write_text(
        '{"ts": "2026-03-10T09:00:00Z", "adapter": "legal-assistant-v2", "requests": 3}\n'
        f'{{"ts": "2026-03-10T09:10:00Z", "adapter": "legal-assistant-v2", "requests": {value}}}\n'
    )
    code, lines = validate(
        "--catalog", str(CORPUS / "catalog-ok.yaml"), "--fleet", str(FLEET), "--log", str(log)
    )
    assert code == 2
    assert any(f"line 2: {expected}" in line for line in lines), lines  # its line, not a row
    # what validate refuses, the forecast's reader refuses too: nothing crashes later
    with pytest.raises(Exception, match=expected.split(": ", 1)[1]):
        load_request_log(log)


# --- sources the engines are handed ----------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("file:///etc/shadow", "'/etc/shadow' is not under /adapters", id="file-etc"),
        pytest.param("/etc/shadow", "is not under /adapters", id="path-etc"),
        pytest.param("/adapters/../etc/shadow", "holds '..'", id="dot-dot"),
        pytest.param(
            "http://169.254.169.254/latest/meta-data/", "scheme http:// is not allowed", id="imds"
        ),
        pytest.param("s3://169.254.169.254/x", "link-local or metadata", id="s3-link-local"),
        pytest.param("gs://metadata.google.internal/x", "link-local or metadata", id="gce-meta"),
        pytest.param("s3://[fe80::1]/x", "link-local or metadata", id="ipv6-link-local"),
        pytest.param("ftp://host/x", "scheme ftp:// is not allowed", id="ftp"),
        pytest.param("adapters", "neither an absolute path", id="bare-word"),
        pytest.param("org/../name", "neither an absolute path", id="hf-dot-dot"),
    ],
)
def test_a_source_no_engine_should_load_is_refused(
    tmp_path: Path, source: str, expected: str
) -> None:
    text = (
        f"adapters:\n- {{name: legal, base_model: llama-3.1-70b, rank: 16, source: '{source}'}}\n"
    )
    errors = errors_of(tmp_path, text)
    assert any("source:" in line and expected in line for line in errors), errors


@pytest.mark.parametrize(
    "source",
    [
        "s3://adapters/legal-v2",
        "gs://bucket/path/legal",
        "/adapters/legal-v2",
        "file:///adapters/legal-v2",
        "meta-llama/Llama-3.1-8B-lora",
    ],
)
def test_what_the_engines_load_is_accepted(source: str) -> None:
    assert check_source(source, rules=InputSettings()) == source


def test_the_roots_and_schemes_are_configurable(tmp_path: Path) -> None:
    text = "adapters:\n- {name: legal, base_model: llama-3.1-70b, rank: 16, source: /models/l}\n"
    path = catalog(tmp_path, text)
    code, _ = validate("--catalog", str(path), "--fleet", str(FLEET))
    allowed, lines = validate(
        "--catalog", str(path), "--fleet", str(FLEET), "--adapter-root", "/models"
    )
    assert (code, allowed) == (2, 0), lines


# --- the router's live log ---------------------------------------------------------------


def test_an_empty_or_invalid_name_in_the_live_log_is_skipped_not_the_whole_log(
    tmp_path: Path,
) -> None:
    history = tmp_path / "requests.parquet"
    pd.DataFrame(
        {"ts": pd.to_datetime(["2026-03-12T03:00:00Z"], utc=True), "adapter": ["legal"]}
    ).to_parquet(history)
    live = tmp_path / "live.jsonl"
    rows = [
        '{"ts": "2026-03-12T05:00:00Z", "adapter": "legal"}',
        '{"ts": "2026-03-12T05:00:01Z", "adapter": ""}',
        '{"ts": "2026-03-12T05:00:02Z", "adapter": "\\ud800"}',
        '{"ts": "2026-03-12T05:00:03Z", "adapter": "legal"}',
        '{"ts": "2026-03-12T05:00',  # the router is half-way through a line
    ]
    live.write_text("\n".join(rows) + "\n")
    log = FileHistory(history, bucket_s=600, live=live)()
    assert list(log.frame["adapter"]) == ["legal"] * 3  # 1 historic + the 2 good live rows
    assert log.skipped_rows == 3
    reported = " | ".join(str(p) for p in log.skipped)
    assert "live.jsonl: line 5: 1 lines that are not JSON objects" in reported
    assert "rows without an adapter" in reported
    assert "not valid names" in reported
