"""Bad files given to the CLI: each is exit 2 and one line naming the file, where in it
(the entry, the key, the line) and what is wrong; never a traceback, never a value read
silently wrong (a typo'd key leaving its default in force), and nothing written."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from placement.adapters.statedir import DirPlanStore, DirStateStore
from placement.cli.app import EXIT_BAD_INPUT, app
from placement.errors import InputError
from placement.plan import plan_to_json
from placement.ports import StoredState
from tests.factories import make_plan

DATA = Path(__file__).resolve().parents[2] / "data" / "legal-research"
CATALOG = (DATA / "catalog.yaml").read_text()
FLEET = (DATA / "fleet.yaml").read_text()
PIPELINES = "pipelines:\n- trigger: brief.filed\n  steps:\n  - {adapter: ny-jurisdiction-v3}\n"


def _errors(result: object) -> list[str]:
    output = getattr(result, "output", "")
    assert "Traceback" not in output
    return [line for line in output.splitlines() if line.startswith("error:")]


def validate(
    tmp_path: Path, *, catalog: str = CATALOG, fleet: str = FLEET, pipelines: str = PIPELINES
) -> tuple[int, list[str]]:
    files = {"catalog": catalog, "fleet": fleet, "pipelines": pipelines}
    args = []
    for name, text in files.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        args += [f"--{name}", str(path)]
    result = CliRunner().invoke(app, ["validate", *args])
    return result.exit_code, _errors(result)


# --- a key no reader knows -------------------------------------------------------------


@pytest.mark.parametrize(
    ("file", "before", "after", "expected"),
    [
        pytest.param(
            "catalog",
            "  rank: 16\n",
            "  rank: 16\n  min_replica: 2\n",
            "catalog.yaml: adapter ny-jurisdiction-v3: min_replica: unknown key (did you mean"
            " 'min_replicas'?)",
            id="catalog-adapter",
        ),
        pytest.param(
            "catalog",
            "adapters:\n",
            "adapter_defaults: {rank: 8}\nadapters:\n",
            "catalog.yaml: top level: adapter_defaults: unknown key (did you mean 'adapters'?)",
            id="catalog-top-level",
        ),
        pytest.param(
            "fleet",
            "  engine: vllm\n",
            "  engine: vllm\n  engnie: sglang\n",
            "fleet.yaml: pool llama-70b: engnie: unknown key (did you mean 'engine'?)",
            id="fleet-pool",
        ),
        pytest.param(
            "fleet",
            "zone: west}\n",
            "zone: west, max_lora: 8}\n",
            "fleet.yaml: pod pod-2: max_lora: unknown key (did you mean 'max_loras'?)",
            id="fleet-pod",
        ),
        pytest.param(
            "fleet",
            "max_loras: 4,",
            "max_lora: 8, max_loras: 4,",
            "fleet.yaml: pool llama-70b: pod_defaults: max_lora: unknown key (did you mean"
            " 'max_loras'?)",
            id="fleet-pod-defaults",
        ),
        pytest.param(
            "fleet",
            "first_byte_ms: 80}",
            "first_byte_ms: 80, first_byte_s: 1}",
            "fleet.yaml: pool llama-70b: storage: first_byte_s: unknown key (did you mean"
            " 'first_byte_ms'?)",
            id="fleet-storage",
        ),
        pytest.param(
            "pipelines",
            "{adapter: ny-jurisdiction-v3}",
            "{adapter: ny-jurisdiction-v3, p: 0.4}",
            "pipelines.yaml: pipeline brief.filed: steps[0]: p: unknown key",
            id="pipeline-step",
        ),
        pytest.param(
            "pipelines",
            "  steps:\n",
            "  stpes: []\n  steps:\n",
            "pipelines.yaml: pipeline brief.filed: stpes: unknown key (did you mean 'steps'?)",
            id="pipeline",
        ),
        pytest.param(
            "pipelines",
            "pipelines:\n",
            "login:\n  firm-east: [ny-jurisdiction-v3]\npipelines:\n",
            "pipelines.yaml: top level: login: unknown key (did you mean 'logins'?)",
            id="pipelines-top-level",
        ),
    ],
)
def test_a_key_no_reader_knows_is_an_error_naming_it(
    tmp_path: Path, file: str, before: str, after: str, expected: str
) -> None:
    # Read silently, a typo left the default in force: "p: 0.4" was a probability of 1,
    # "max_lora: 8" a pod of one GPU slot, and validate said "ok".
    texts = {"catalog": CATALOG, "fleet": FLEET, "pipelines": PIPELINES}
    original = texts[file]
    texts[file] = original.replace(before, after, 1)
    assert texts[file] != original
    code, errors = validate(tmp_path, **texts)
    assert code == EXIT_BAD_INPUT, errors
    assert any(expected in line for line in errors), errors


# --- fleet.yaml --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param("5", "url: expected a URL like http://pod-0:8000, got 5", id="number"),
        pytest.param(
            "pod-3:8000", "url: expected an http:// or https:// URL with a host", id="no-scheme"
        ),
        pytest.param("'http://10.0.0.3:80000'", "url: not a valid URL", id="port-out-of-range"),
    ],
)
def test_a_pod_url_that_is_no_url_is_an_error(tmp_path: Path, url: str, expected: str) -> None:
    fleet = FLEET.replace("url: 'http://127.0.0.1:18303'", f"url: {url}")
    assert fleet != FLEET
    code, errors = validate(tmp_path, fleet=fleet)
    assert code == EXIT_BAD_INPUT
    assert any(f"fleet.yaml: pod pod-3: {expected}" in line for line in errors), errors


def test_a_fleet_without_pools_is_an_error_of_the_fleet(tmp_path: Path) -> None:
    # Only the catalog's 80 adapters said so ("no pool serves base model ..."), each
    # naming catalog.yaml: nothing named the file that was wrong.
    code, errors = validate(tmp_path, fleet="pools: []\n")
    assert code == EXIT_BAD_INPUT
    assert any("fleet.yaml: top level: pools: expected a non-empty list" in e for e in errors)


# --- plan --current ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b'{"pods": {"pod-0": {"hot": "\xff"}}}', "not UTF-8 text", id="not-utf-8"),
        pytest.param(
            b'{"pods": {"pod-0": {"hot": 5}}}',
            "pods.pod-0: hot: expected a list of adapter names",
            id="hot-a-number",
        ),
        pytest.param(
            b'{"pods": {"pod-0": {"warm": "ny-jurisdiction-v3"}}}',
            "pods.pod-0: warm: expected a list of adapter names",
            id="warm-a-string",
        ),
        pytest.param(b"[" * 100_000, "nested too deeply", id="deep"),
        pytest.param(
            b'{"pods": {"pod-0": {"hot": [], "wram": ["ny-jurisdiction-v3"]}}}',
            "pods.pod-0: wram: unknown key",
            id="unknown-key",
        ),
    ],
)
def test_a_bad_current_placement_is_one_line_and_no_plan(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    # Read with path.read_text() and iterated as it came: a non-UTF-8 file and "hot": 5
    # were tracebacks, and "warm": "ny-..." was 18 one-letter adapter names.
    current = tmp_path / "current.json"
    current.write_bytes(content)
    log = tmp_path / "requests.parquet"
    pd.read_parquet(DATA / "requests.parquet").head(500).to_parquet(log)
    inputs = ["--catalog", str(DATA / "catalog.yaml"), "--fleet", str(DATA / "fleet.yaml")]
    args = ["plan", *inputs, "--log", str(log), "--at", "2026-03-08T19:00:00Z"]
    output = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [*args, "--current", str(current), "-o", str(output)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert any(f"error: {current}: {expected}" in line for line in _errors(result)), result.output
    assert not output.exists()


# --- request logs and forecasts ---------------------------------------------------------


CATALOG_FLEET = ["--catalog", "{catalog}", "--fleet", "{fleet}"]


def _rows_none(path: Path) -> None:
    frame = pd.read_parquet(DATA / "requests.parquet").head(0)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)  # a header line and nothing under it
    else:
        frame.to_parquet(path)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["validate", *CATALOG_FLEET], id="validate"),
        pytest.param(["forecast", "--at", "2026-03-08T19:00:00Z", "-o", "{out}"], id="forecast"),
        pytest.param(
            ["plan", *CATALOG_FLEET, "--at", "2026-03-08T19:00:00Z", "-o", "{out}"], id="plan"
        ),
        pytest.param(["backtest"], id="backtest"),
    ],
)
def test_a_log_with_no_rows_is_a_bad_input_naming_it(
    tmp_path: Path, command: list[str], suffix: str
) -> None:
    # validate said "ok: inputs are valid"; forecast and plan exited 1 with "cannot
    # forecast from this log" or "the request log has no requests before ...", no file.
    log = tmp_path / f"requests{suffix}"
    _rows_none(log)
    out = tmp_path / "out.parquet"
    names = {"{catalog}": DATA / "catalog.yaml", "{fleet}": DATA / "fleet.yaml", "{out}": out}
    args = [str(names.get(a, a)) for a in command]
    result = CliRunner().invoke(app, [*args, "--log", str(log)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"error: {log}: no requests: the log has no rows" in _errors(result)
    assert not out.exists()


def test_a_forecast_outside_the_plan_names_its_file(tmp_path: Path) -> None:
    forecast = tmp_path / "forecast.parquet"
    pd.DataFrame(
        {
            "ts": pd.to_datetime(["2026-03-01T00:00:00Z"], utc=True),
            "adapter": ["ny-jurisdiction-v3"],
            "mean": [1.0],
            "q90": [2.0],
        }
    ).to_parquet(forecast)
    inputs = ["--catalog", str(DATA / "catalog.yaml"), "--fleet", str(DATA / "fleet.yaml")]
    args = ["plan", *inputs, "--forecast", str(forecast), "--at", "2026-03-08T19:00:00Z"]
    result = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "plan.json")])
    assert result.exit_code != 0
    [line] = _errors(result)
    assert line.startswith(f"error: {forecast}: the forecast has no bucket between"), line


# --- scenario.yaml, ServeGen traces ------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"name: \xff\n", "not UTF-8 text (byte 0xff at offset 6)", id="not-utf-8"),
        pytest.param(
            b"name: x\ndays: 1\ndays: 2\n",
            "line 3: key 'days' is given twice in this mapping",
            id="key-given-twice",
        ),
    ],
)
def test_a_bad_scenario_is_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    # Read by yaml.safe_load(path.read_text()): a non-UTF-8 file was a traceback, and a
    # key given twice kept the last silently (catalog.yaml's reader refuses both).
    for name in ("catalog.yaml", "fleet.yaml", "pipelines.yaml"):
        (tmp_path / name).write_bytes((DATA / name).read_bytes())
    scenario = tmp_path / "scenario.yaml"
    scenario.write_bytes(content)
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(app, ["synth", str(scenario), "-o", str(out)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert any(f"error: {scenario}: {expected}" in line for line in _errors(result)), result.output
    assert not out.exists()


@pytest.mark.parametrize(("t", "line"), [("inf", 2), ("-600", 1)])
def test_a_servegen_window_at_no_time_is_named_by_its_line(
    tmp_path: Path, t: str, line: int
) -> None:
    # A window at t = inf was converted into requests with no time (NaT rows written to
    # the log), one at t < 0 into requests before --start.
    folder = tmp_path / "trace"
    folder.mkdir()
    rows = ["0,1,1,Gamma,1,1", f"{t},1,1,Gamma,1,1"] if line == 2 else [f"{t},1,1,Gamma,1,1"]
    trace = folder / "chunk-1-trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "requests.parquet"
    result = CliRunner().invoke(app, ["convert", "servegen", str(folder), "-o", str(out)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    [error] = _errors(result)
    assert error.startswith(f"error: {trace}: line {line}: not a ServeGen client trace"), error
    assert not out.exists()


# --- PEFT directories and config.json -----------------------------------------------------


def _safetensors(header: bytes) -> bytes:
    return len(header).to_bytes(8, "little") + header


@pytest.mark.parametrize(
    "shape",
    [
        pytest.param(b'["x"]', id="text"),
        pytest.param(b"5", id="a-number"),
        pytest.param(b"[-5, 3]", id="negative"),
        pytest.param(b"[1.5e300]", id="huge-float"),
    ],
)
def test_a_peft_tensor_with_a_bad_shape_is_one_line(tmp_path: Path, shape: bytes) -> None:
    # ["x"] and 5 were tracebacks; [-5, 3] an adapter of -30 bytes, [1.5e300] one of 3e300.
    peft = tmp_path / "adapter"
    peft.mkdir()
    (peft / "adapter_config.json").write_text('{"r": 8, "target_modules": ["q_proj"]}')
    weights = peft / "adapter_model.safetensors"
    weights.write_bytes(_safetensors(b'{"a.lora_A.weight": {"shape": %s, "dtype": "F16"}}' % shape))
    result = CliRunner().invoke(app, ["size", str(peft)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{weights}: tensor 'a.lora_A.weight': shape is not a list of whole numbers" in (
        result.output.replace("\n", "")
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"\xff{}", "not UTF-8 text (byte at offset 0)", id="not-utf-8"),
        pytest.param(
            b'{"hidden_size": 4096, "num_attention_heads": 0, "num_hidden_layers": 32,'
            b' "intermediate_size": 14336}',
            "num_attention_heads: expected a whole number above 0, got 0",
            id="zero-heads",
        ),
        pytest.param(
            b'{"hidden_size": -4096, "num_attention_heads": 32, "num_hidden_layers": 32,'
            b' "intermediate_size": 14336}',
            "hidden_size: expected a whole number above 0, got -4096",
            id="negative",
        ),
    ],
)
def test_a_bad_model_config_is_one_line_in_size_and_in_the_fleet(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    # Zero heads divided by zero and a non-UTF-8 file raised, as tracebacks, out of both
    # `size --config` and a fleet's model_config; a negative size gave negative bytes.
    config = tmp_path / "config.json"
    config.write_bytes(content)
    result = CliRunner().invoke(app, ["size", "--config", str(config), "--rank", "16"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{config}: {expected}" in result.output.replace("\n", "")
    fleet = FLEET.replace("  engine: vllm\n", "  engine: vllm\n  model_config: config.json\n")
    code, errors = validate(tmp_path, fleet=fleet)
    assert code == EXIT_BAD_INPUT
    assert any(f"pool llama-70b: model_config: {config}: {expected}" in e for e in errors), errors


def test_an_event_log_directory_with_no_parquet_files_says_so(tmp_path: Path) -> None:
    # It read "ts: missing required column 'ts' (columns: )", as the request log did
    # before it said what is wrong.
    events = tmp_path / "events.parquet"
    events.mkdir()
    inputs = ["--catalog", str(DATA / "catalog.yaml"), "--fleet", str(DATA / "fleet.yaml")]
    log = ["--log", str(DATA / "requests.parquet")]
    result = CliRunner().invoke(app, ["validate", *inputs, *log, "--events", str(events)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"error: {events}: a directory with no Parquet files" in _errors(result)


# --- the controller's state directory ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "content"),
    [
        pytest.param("ledger.json", b"\x00" * 64, id="ledger-zeroed"),
        pytest.param("ledger.json", b'{"ledger": {"pod-0": [', id="ledger-torn"),
        pytest.param("last-plan.json", b"\xff\xfe{", id="plan-not-utf-8"),
    ],
)
def test_an_unreadable_state_file_is_kept_before_the_next_save_replaces_it(
    tmp_path: Path, name: str, content: bytes
) -> None:
    # The controller warns and starts without it ("saved ledger unreadable, starting
    # with an empty one"); its next save replaced the file, the only copy of what was
    # there, with the empty ledger.
    store = DirStateStore(tmp_path)
    (tmp_path / name).write_bytes(content)
    (tmp_path / "other.json").write_text("{}")
    with contextlib.suppress(InputError):  # not UTF-8: resume warns with it, goes on
        store.load()
    store.save(StoredState(plan_json='{"new": 1}', ledger_json='{"new": 1}'))
    assert (tmp_path / name).read_text() == '{"new": 1}'
    assert (tmp_path / f"{name}.unreadable-1").read_bytes() == content
    store.load()  # read again, once replaced: no second copy, and none of a good file
    assert sorted(p.name for p in tmp_path.glob("*.unreadable-*")) == [f"{name}.unreadable-1"]


# --- values no pod or adapter can have ----------------------------------------------------


@pytest.mark.parametrize(
    ("file", "before", "after", "expected"),
    [
        pytest.param(
            "fleet",
            "capacity_rps: 4",
            "capacity_rps: 0",
            "fleet.yaml: pod pod-0: capacity_rps: must be above 0, got 0",
            id="capacity-0",
        ),
        pytest.param(
            "fleet",
            "hbm_adapter_bytes: 1GiB",
            "hbm_adapter_bytes: 0",
            "fleet.yaml: pod pod-0: hbm_adapter_bytes: must be above 0, got 0",
            id="gpu-bytes-0",
        ),
        pytest.param(
            "fleet",
            "host_adapter_bytes: 8GiB",
            "host_adapter_bytes: 0B",
            "fleet.yaml: pod pod-0: host_adapter_bytes: must be above 0, got '0B'",
            id="host-bytes-0",
        ),
        pytest.param(
            "catalog",
            "  rank: 16\n",
            "  rank: 16\n  size_bytes: 0\n",
            "catalog.yaml: adapter ny-jurisdiction-v3: size_bytes: must be above 0, got 0",
            id="size-0",
        ),
        pytest.param(
            "catalog",
            "  rank: 16\n",
            "  rank: 16\n  slo_ttft_ms: 0\n",
            "catalog.yaml: adapter ny-jurisdiction-v3: slo_ttft_ms: must be above 0, got 0",
            id="slo-0",
        ),
        pytest.param(
            "catalog",
            "  rank: 16\n",
            "  rank: 16\n  alpha: 0\n",
            "catalog.yaml: adapter ny-jurisdiction-v3: alpha: must be above 0, got 0",
            id="alpha-0",
        ),
        pytest.param(
            "catalog",
            "target_modules: [q_proj, k_proj, v_proj, o_proj]",
            "target_modules: []",
            "catalog.yaml: adapter ny-jurisdiction-v3: target_modules: expected at least one",
            id="no-target-modules",
        ),
        pytest.param(
            "catalog",
            "  rank: 16\n",
            "  rank: 16\n  dtype: int3\n",
            "catalog.yaml: adapter ny-jurisdiction-v3: dtype: unknown dtype 'int3'",
            id="dtype-named-as-dtype",
        ),
    ],
)
def test_a_value_no_pod_or_adapter_can_have_is_an_error(
    tmp_path: Path, file: str, before: str, after: str, expected: str
) -> None:
    # Each passed validate and planned: a pod of 0 requests/s or 0 GPU bytes, an
    # adapter of 0 bytes (size_bytes: 0, or no target module) or an SLO of 0 ms, and
    # alpha: 0 became the rank; an unknown dtype was reported under target_modules.
    texts = {"catalog": CATALOG, "fleet": FLEET}
    original = texts[file]
    texts[file] = original.replace(before, after, 1)
    assert texts[file] != original
    code, errors = validate(tmp_path, **texts)
    assert code == EXIT_BAD_INPUT, errors
    assert any(expected in line for line in errors), errors


# --- replay --faults ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(
            b"restart: [\xff]\n", "not UTF-8 text (byte 0xff at offset 10)", id="not-utf-8"
        ),
        pytest.param(
            b"restart: [pod-0@1m]\nrestart: [pod-1@2m]\n",
            "line 2: key 'restart' is given twice in this mapping",
            id="key-given-twice",
        ),
    ],
)
def test_a_bad_fault_file_is_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    # Read by yaml.safe_load(path.read_text()): not UTF-8 was a traceback, and the
    # second "restart:" replaced the first without a word.
    faults = tmp_path / "faults.yaml"
    faults.write_bytes(content)
    log = tmp_path / "requests.parquet"
    pd.read_parquet(DATA / "requests.parquet").head(300).to_parquet(log)
    inputs = ["--catalog", str(DATA / "catalog.yaml"), "--fleet", str(DATA / "fleet.yaml")]
    args = ["replay", *inputs, "--log", str(log), "--policy", "hash", "--faults", str(faults)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert any(f"error: {faults}: {expected}" in line for line in _errors(result)), result.output


# --- apply --ledger, size --gpu --config -------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b'{"pinned": {"pod-0": ["\xff"]}}', "not UTF-8 text", id="not-utf-8"),
        pytest.param(
            b'{"pods": {"pod-0": {"engine": "bogus", "max_loras": 1, "max_cpu_loras": 1}}}',
            "not a ledger: 'bogus' is not a valid EngineModel",
            id="unknown-engine",
        ),
        pytest.param(b"[" * 100_000, "not a ledger", id="deep"),
    ],
)
def test_a_bad_apply_ledger_is_one_line_and_left_as_it_is(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    # Each was a traceback (only JSON errors, TypeError and AttributeError were caught).
    ledger = tmp_path / "ledger.json"
    ledger.write_bytes(content)
    plan = tmp_path / "plan.json"
    plan.write_text(plan_to_json(make_plan({"pod-0": ["ny-jurisdiction-v3"]}, plan_id="p")))
    inputs = ["--catalog", str(DATA / "catalog.yaml"), "--fleet", str(DATA / "fleet.yaml")]
    result = CliRunner().invoke(app, ["apply", str(plan), *inputs, "--ledger", str(ledger)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert any(f"error: {ledger}: {expected}" in line for line in _errors(result)), result.output
    assert ledger.read_bytes() == content


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"\xff{}", "not UTF-8 text (byte at offset 0)", id="not-utf-8"),
        pytest.param(
            b'{"hidden_size": 8192, "num_attention_heads": 0, "num_hidden_layers": 80,'
            b' "intermediate_size": 28672, "vocab_size": 128256}',
            "num_attention_heads: expected a whole number above 0, got 0",
            id="zero-heads",
        ),
    ],
)
def test_a_bad_config_for_the_three_ledgers_is_one_line(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    # `size --gpu` read config.json itself: not UTF-8 and zero heads were tracebacks.
    config = tmp_path / "config.json"
    config.write_bytes(content)
    result = CliRunner().invoke(app, ["size", "--gpu", "h100-80gb", "--config", str(config)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{config}: {expected}" in result.output.replace("\n", "")


# --- an output in a folder that is not there ---------------------------------------------


@pytest.mark.parametrize("parent", ["absent/dir", "a-file"])
def test_an_output_in_a_missing_folder_names_it_once(tmp_path: Path, parent: str) -> None:
    # "error: [Errno 2] cannot write .../absent/dir/plan.json: .../absent/dir does not
    # exist: '.../absent/dir'": the folder twice, the second time quoted by OSError.
    (tmp_path / "a-file").write_text("")
    log = tmp_path / "requests.parquet"
    pd.read_parquet(DATA / "requests.parquet").head(500).to_parquet(log)
    inputs = ["--catalog", str(DATA / "catalog.yaml"), "--fleet", str(DATA / "fleet.yaml")]
    output = tmp_path / parent / "plan.json"
    args = ["plan", *inputs, "--log", str(log), "--at", "2026-03-08T19:00:00Z", "-o", str(output)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    what = "is not a directory" if parent == "a-file" else "does not exist"
    [line] = _errors(result)
    assert line == f"error: cannot write {output}: {output.parent} {what}"


# --- rollback: the state directory's previous.json -----------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b'{"id": "\xff"}', "not UTF-8 text (byte 0xff at offset 8)", id="not-utf-8"),
        pytest.param(b'{"id": "p1",', "not valid JSON", id="torn"),
        pytest.param(b"[" * 100_000, "not valid JSON: nested too deeply", id="deep"),
        pytest.param(
            b'{"id": "p1"}', "top level: missing required key 'schema_version'", id="not-a-plan"
        ),
    ],
)
def test_a_bad_previous_plan_is_a_bad_input_naming_it_and_nothing_is_swapped(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    # Not UTF-8 was exit 2 (read_text's InputError), a torn or foreign previous.json
    # exit 1 (plan_from_json's PlanError, an engine or Kubernetes failure's code).
    for name in ("catalog.yaml", "fleet.yaml", "pipelines.yaml"):
        (tmp_path / name).write_bytes((DATA / name).read_bytes())
    config = tmp_path / "controller.yaml"
    config.write_text(
        "catalog: catalog.yaml\nfleet: fleet.yaml\npipelines: pipelines.yaml\n"
        "history: {log: requests.parquet}\nstate_dir: state\n"
    )
    (tmp_path / "state").mkdir()
    store = DirPlanStore(tmp_path / "state")
    store.publish(make_plan(plan_id="p1"))
    store.publish(make_plan(plan_id="p2"))
    previous = tmp_path / "state" / "previous.json"
    previous.write_bytes(content)  # through the link, into the current generation
    result = CliRunner().invoke(app, ["rollback", "--config", str(config)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    [line] = _errors(result)
    assert line.startswith(f"error: {previous}: {expected}"), line
    assert line.count(str(previous)) == 1, line
    assert store.current() == make_plan(plan_id="p2")
    assert previous.read_bytes() == content
