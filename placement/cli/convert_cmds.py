"""``lorafleet convert``: public traces turned into request logs a replay takes.

``convert servegen DIR -o log.parquet`` reads a ServeGen client folder (one CSV per
client of one model, 600 s windows of rate and inter-arrival distribution) and writes
one adapter per client (``placement.synth.servegen``); ``--catalog-out`` and
``--fleet-out`` write stubs to replay it with. The trace stays where it is: nothing is
copied but the requests drawn from it.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from placement.cli.app import app, err, report_errors
from placement.errors import InputError, Problem
from placement.inputs.files import write_atomically
from placement.inputs.request_log import write_request_log
from placement.synth.servegen import (
    Lengths,
    catalog_stub,
    fleet_stub,
    read_servegen,
    scale_for,
    servegen_requests,
)

convert = typer.Typer(
    help="Turn public traces into request logs (and catalog and fleet stubs) to replay.",
    no_args_is_help=True,
)
app.add_typer(convert, name="convert")


def _start(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            [Problem(source="--start", message=f"not an ISO time: {text!r}")]
        ) from None
    if moment.tzinfo is None:
        raise InputError([Problem(source="--start", message=f"give an offset or Z: {text!r}")])
    return moment


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise InputError([Problem(source=name, message=f"must be above 0, got {value}")])


@convert.command()
@report_errors
def servegen(
    folder: Annotated[Path, typer.Argument(help="a ServeGen folder of chunk-<id>-trace.csv")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="log to write (.parquet, .csv, .jsonl)")
    ],
    days: Annotated[
        float | None, typer.Option(help="convert the first DAYS days (default: all)")
    ] = None,
    rps: Annotated[
        float, typer.Option(help="mean requests/s of the whole log (the trace is rescaled)")
    ] = 10.0,
    scale: Annotated[
        float | None, typer.Option(help="multiply the trace's rates by this instead of --rps")
    ] = None,
    start: Annotated[
        str, typer.Option(help="the moment the trace's midnight (t = 0) becomes, with offset")
    ] = "2026-03-09T00:00:00+00:00",
    seed: Annotated[int, typer.Option(help="random seed; the same seed writes the same log")] = 0,
    prompt_median: Annotated[float, typer.Option(help="median prompt tokens")] = 1020.0,
    output_median: Annotated[float, typer.Option(help="median output tokens")] = 129.0,
    prefix: Annotated[str, typer.Option(help="adapter name before the client number")] = "client-",
    catalog_out: Annotated[
        Path | None, typer.Option(help="also write a catalog.yaml stub (one adapter per client)")
    ] = None,
    fleet_out: Annotated[Path | None, typer.Option(help="also write a fleet.yaml stub")] = None,
    base_model: Annotated[str, typer.Option(help="the stubs' base model")] = "llama-3.1-8b",
    pods: Annotated[int, typer.Option(help="pods in the fleet stub")] = 8,
    max_loras: Annotated[int, typer.Option(help="GPU adapter slots per pod in the stub")] = 4,
) -> None:
    """Turn a ServeGen client folder into a request log: one client = one adapter."""
    for name, value in (("--days", days), ("--rps", rps), ("--scale", scale)):
        _positive(name, value)
    moment = _start(start)
    clients = read_servegen(folder, days=days, prefix=prefix)
    if not clients:
        raise InputError([Problem(source=str(folder), message="no client has any demand")])
    for path in (output, catalog_out, fleet_out):
        if path is not None:  # a new folder for the converted trace, as `-o out/requests.parquet`
            path.parent.mkdir(parents=True, exist_ok=True)
    factor = scale if scale is not None else scale_for(clients, rps)
    lengths = Lengths(prompt_median=prompt_median, output_median=output_median)
    frame = servegen_requests(
        clients, rng=np.random.default_rng(seed), start=moment, scale=factor, lengths=lengths
    )
    write_request_log(frame, output)
    err().print(
        f"wrote {len(frame):,} requests of {frame['adapter'].nunique()} clients to {output}"
        f" (rates x {factor:.3g})"
    )
    if catalog_out is not None:
        write_atomically(
            catalog_out, catalog_stub(clients, base_model=base_model, folder=folder.name)
        )
        err().print(f"wrote a catalog of {len(clients)} adapters to {catalog_out}")
    if fleet_out is not None:
        stub = fleet_stub(
            base_model=base_model, pods=pods, max_loras=max_loras, max_cpu_loras=4 * max_loras
        )
        write_atomically(fleet_out, stub)
        err().print(f"wrote a fleet of {pods} pods to {fleet_out}")
