"""Commands about inputs: ``validate``, ``size`` and ``synth``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from placement import sizing
from placement.cli.app import EXIT_BAD_INPUT, app, err, out, report_errors
from placement.errors import InputError, Problem
from placement.inputs import load_catalog, load_fleet, load_pipelines, parse_bytes, validate_inputs
from placement.inputs.events import check_events_against, write_events
from placement.inputs.request_log import write_request_log
from placement.settings import InputSettings
from placement.synth.generate import generate
from placement.synth.scenario import load_scenario

ExistingFile = Annotated[Path, typer.Option(exists=False, dir_okay=False)]


@app.command()
@report_errors
def validate(
    catalog: Annotated[Path, typer.Option(help="catalog.yaml")],
    fleet: Annotated[Path, typer.Option(help="fleet.yaml")],
    pipelines: Annotated[Path | None, typer.Option(help="pipelines.yaml")] = None,
    log: Annotated[Path | None, typer.Option(help="request log (.parquet, .csv, .jsonl)")] = None,
    events: Annotated[
        Path | None, typer.Option(help="event log (pipeline triggers, logins) of --log")
    ] = None,
    adapter_root: Annotated[
        list[str] | None,
        typer.Option(help="a directory local adapter sources may lie under (repeatable)"),
    ] = None,
    adapter_scheme: Annotated[
        list[str] | None,
        typer.Option(help="a URL scheme adapter sources may use, e.g. s3 (repeatable)"),
    ] = None,
) -> None:
    """Check every input and list every problem, one line each (exit 2 on errors)."""
    rules = InputSettings()
    if adapter_root:
        rules = replace(rules, adapter_roots=tuple(adapter_root))
    if adapter_scheme:
        rules = replace(rules, adapter_schemes=tuple(adapter_scheme))
    problems = validate_inputs(
        catalog=catalog, fleet=fleet, pipelines=pipelines, log=log, rules=rules
    )
    if events is not None:
        problems += check_events_against(
            events, catalog=catalog, fleet=fleet, pipelines=pipelines, log=log
        )
    console = err()
    for problem in problems:
        colour = "yellow" if problem.severity == "warning" else "red"
        console.print(f"[bold {colour}]{problem.severity}[/]: {problem}", highlight=False)
    errors = sum(problem.severity == "error" for problem in problems)
    warnings = len(problems) - errors
    if errors:
        console.print(f"{errors} errors, {warnings} warnings")
        raise typer.Exit(EXIT_BAD_INPUT)
    out().print(f"ok: inputs are valid ({warnings} warnings)")


def _size_of_catalog(catalog: Path, fleet: Path | None, budget: str) -> dict[str, object]:
    parsed_fleet = load_fleet(fleet) if fleet else None
    adapters = load_catalog(catalog, fleet=parsed_fleet).adapters
    try:
        budget_bytes = parse_bytes(budget)
    except ValueError as exc:
        raise InputError([Problem(source="--budget", message=str(exc))]) from None
    sizes = [adapter.size_bytes for adapter in adapters]
    return {
        "adapters": len(sizes),
        "budget_bytes": budget_bytes,
        "mean_bytes": round(sum(sizes) / len(sizes)) if sizes else 0,
        "max_bytes": max(sizes, default=0),
        "fit_mean": sizing.residency_budget(budget_bytes, sizes) if sizes else 0,
        "fit_largest": budget_bytes // max(sizes) if sizes else 0,
    }


def _size_of(
    peft_dir: Path | None,
    base: str | None,
    config: Path | None,
    rank: int | None,
    targets: str,
    dtype: str,
) -> sizing.AdapterSize:
    if peft_dir is not None:
        return sizing.peft_adapter_size(peft_dir)
    if rank is None or (base is None and config is None):
        raise InputError(
            [
                Problem(
                    source="lorafleet size",
                    message="give a PEFT directory, or --rank with --base or --config",
                )
            ]
        )
    dims = (
        sizing.model_dims_from_config(config)
        if config
        else sizing.BUILTIN_MODELS.get((base or "").lower())
    )
    if dims is None:
        known = ", ".join(sorted(sizing.BUILTIN_MODELS))
        raise InputError(
            [
                Problem(
                    source="--base",
                    message=f"unknown base model {base!r} (known: {known}); use --config",
                )
            ]
        )
    return sizing.adapter_size(dims, rank, targets.split(","), dtype)


@app.command()
@report_errors
def size(
    peft_dir: Annotated[Path | None, typer.Argument(help="a PEFT adapter directory")] = None,
    base: Annotated[
        str | None, typer.Option(help="built-in base model, e.g. llama-3.1-70b")
    ] = None,
    config: Annotated[
        Path | None, typer.Option(help="a Hugging Face config.json instead of --base")
    ] = None,
    rank: Annotated[int | None, typer.Option(help="LoRA rank")] = None,
    targets: Annotated[str, typer.Option(help="comma-separated target modules")] = "q_proj,v_proj",
    dtype: Annotated[str, typer.Option(help="float16, bfloat16, float32, float8")] = "float16",
    catalog: Annotated[Path | None, typer.Option(help="size a catalog against --budget")] = None,
    fleet: Annotated[
        Path | None, typer.Option(help="fleet.yaml, for base-model dimensions")
    ] = None,
    budget: Annotated[str, typer.Option(help="a pod's adapter budget, e.g. 8GiB")] = "8GiB",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Parameters and bytes of an adapter, or how many of a catalog's adapters fit a budget."""
    try:
        if catalog is not None:
            report = _size_of_catalog(catalog, fleet, budget)
        else:
            found = _size_of(peft_dir, base, config, rank, targets, dtype)
            report = {"params": found.params, "bytes": found.bytes}
    except sizing.SizingError as exc:
        raise InputError([Problem(source="lorafleet size", message=str(exc))]) from None
    if as_json:
        out().print_json(json.dumps(report))
        return
    for key, value in report.items():
        out().print(f"{key:>12}: {value:,}" if isinstance(value, int) else f"{key:>12}: {value}")


@app.command()
@report_errors
def synth(
    scenario: Annotated[Path, typer.Argument(help="scenario.yaml (beside its catalog.yaml)")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="log to write (.parquet, .csv, .jsonl)")
    ],
    days: Annotated[
        float | None, typer.Option(help="days to generate (default: the scenario's)")
    ] = None,
    seed: Annotated[int, typer.Option(help="random seed; the same seed writes the same log")] = 0,
    events: Annotated[
        Path | None,
        typer.Option(
            help="event log to write when the scenario has pipelines or logins (default:"
            " the scenario's events file when -o is its log, else <output>.events.<ext>)"
        ),
    ] = None,
) -> None:
    """Generate a synthetic request log (and its event log) for a scenario."""
    files = load_scenario(scenario)
    fleet = load_fleet(files.fleet)
    catalog = load_catalog(files.catalog, fleet=fleet)
    pipelines = load_pipelines(files.pipelines, catalog=catalog) if files.pipelines else None
    spec = files.scenario if days is None else replace(files.scenario, days=days)
    synthetic = generate(spec, catalog, rng=np.random.default_rng(seed), pipelines=pipelines)
    frame = synthetic.requests
    write_request_log(frame, output)
    err().print(
        f"wrote {len(frame):,} requests for {frame['adapter'].nunique()} adapters to {output}"
    )
    if "event_id" in frame.columns:
        target = events or _events_beside(output, files.log, files.events)
        write_events(synthetic.events, target)
        caused = int(frame["event_id"].notna().sum())
        err().print(f"wrote {len(synthetic.events):,} events ({caused:,} requests) to {target}")


def _events_beside(output: Path, scenario_log: Path, scenario_events: Path) -> Path:
    if output.resolve() == scenario_log.resolve():
        return scenario_events
    return output.with_name(f"{output.stem}.events{output.suffix}")
