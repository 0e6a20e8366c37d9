"""The ``lorafleet`` console script: one module per command group, wired here."""

from __future__ import annotations

from placement.cli import (
    apply_cmds,  # noqa: F401  (registers apply)
    capacity_cmds,  # noqa: F401  (registers capacity)
    controller_cmds,  # noqa: F401  (registers controller, rollback)
    convert_cmds,  # noqa: F401  (registers convert servegen)
    demo_cmds,  # noqa: F401  (registers demo)
    emulate_cmds,  # noqa: F401  (registers emulate)
    forecast_cmds,  # noqa: F401  (registers forecast, backtest)
    inputs_cmds,  # noqa: F401  (registers validate, synth)
    plan_cmds,  # noqa: F401  (registers plan)
    recommend_cmds,  # noqa: F401  (registers recommend pins)
    replay_cmds,  # noqa: F401  (registers replay)
    review_cmds,  # noqa: F401  (registers review, diff)
    router_cmds,  # noqa: F401  (registers router)
    size_cmds,  # noqa: F401  (registers size)
    summary_cmds,  # noqa: F401  (registers summary)
)
from placement.cli.app import app


def main() -> None:
    app()
