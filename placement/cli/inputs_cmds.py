"""Commands about inputs: ``validate``, ``size`` and ``synth``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from placement.cli.app import EXIT_BAD_INPUT, app, err, out, print_labelled, report_errors
from placement.inputs import load_catalog, load_fleet, load_pipelines, validate_inputs
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
        print_labelled(console, f"bold {colour}", problem.severity, problem)
    errors = sum(problem.severity == "error" for problem in problems)
    warnings = len(problems) - errors
    if errors:
        console.print(f"{errors} errors, {warnings} warnings")
        raise typer.Exit(EXIT_BAD_INPUT)
    out().print(f"ok: inputs are valid ({warnings} warnings)")


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
