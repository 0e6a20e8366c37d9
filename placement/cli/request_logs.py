"""A request log the user names (``--log``) read as the controller reads the router's.

Every command that takes one (forecast, backtest, plan, replay, capacity, recommend
pins, review) reads it here, so the router's log is read whole the same way by each:
its rotations and its further workers' files with it, its unusable rows left out and
printed as warnings. Any other log is read strictly by ``load_request_log``.

Must not write: the router owns its files.
"""

from __future__ import annotations

from pathlib import Path

from placement.adapters.live_request_log import WorkersRequestLog, is_router_log_file
from placement.cli.app import err, print_labelled
from placement.inputs.request_log import RequestLog, load_request_log

#: What ``--log`` takes, for its help.
LOG_HELP = (
    "request log (Parquet, CSV or JSON lines), the router's --request-log directory, "
    "or its JSON-lines file (read with its rotations)"
)


def read_log(path: Path) -> RequestLog:
    """A request log file, or the router's log (``lorafleet router --request-log``) read
    as the controller's ingest reads it (``WorkersRequestLog``): its directory (hourly
    Parquet files, the parts of the hour being written, ``DIR/w1`` and on for further
    workers; a row in an hour and its parts once, hidden temporary files passed by), or
    its JSON-lines file with the rotations beside it (``<stem>.<time>[-n]<suffix>``) and
    the further workers' files (``<stem>.w1<suffix>``). Its rows that cannot be used are
    left out and printed as warnings. A log that is not the router's is read strictly:
    a bad row is an ``InputError``."""
    is_directory = path.is_dir() and path.suffix.lower() != ".parquet"  # not a dataset
    if not is_directory and not is_router_log_file(path):
        return load_request_log(path)
    log = WorkersRequestLog(path).read()
    for problem in log.skipped:
        print_labelled(err(), "yellow", "warning", f"{problem} (left out)")
    return log
