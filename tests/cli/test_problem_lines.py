"""validate's problem lines print a path or a message as it is: brackets in them are not
Rich markup (a catalog under 'ten[/x]ant/' raised MarkupError, a traceback and exit 1)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from placement.cli.app import EXIT_BAD_INPUT, app

DATA = Path(__file__).resolve().parents[2] / "data" / "legal-research"


def test_validate_names_a_path_with_brackets_as_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "ten[" / "x]ant[bold]"
    folder.mkdir(parents=True)
    catalog = folder / "catalog.yaml"
    text = (DATA / "catalog.yaml").read_text()
    catalog.write_text(text.replace("rank: 16", "rank: -8", 1))
    args = ["validate", "--catalog", str(catalog), "--fleet", str(DATA / "fleet.yaml")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"error: {catalog}: adapter ny-jurisdiction-v3: rank: must be at least 1, got -8" in (
        result.stderr
    )
