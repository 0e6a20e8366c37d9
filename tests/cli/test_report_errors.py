"""``report_errors``: a file that cannot be read or written is one line and exit 2; a
network failure or a timeout (also OSErrors) is not a bad input and keeps its traceback;
every message is printed as it is, never read as Rich markup."""

from __future__ import annotations

import errno
import io
from pathlib import Path

import pytest
import typer
from rich.console import Console

from placement.cli.app import EXIT_BAD_INPUT, EXIT_FAILED, print_labelled, report_errors
from placement.errors import EngineError, InputError, Problem


def _raising(exc: BaseException) -> None:
    @report_errors
    def command() -> None:
        raise exc

    command()


def test_a_file_that_cannot_be_written_is_a_bad_input(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(typer.Exit) as stopped:
        _raising(FileNotFoundError(errno.ENOENT, "no such directory", str(missing)))
    assert stopped.value.exit_code == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    "exc", [TimeoutError(), ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")]
)
def test_a_timeout_or_a_refused_connection_is_not_a_bad_input(exc: OSError) -> None:
    # asyncio.TimeoutError is TimeoutError, an OSError, and its message is empty: caught
    # as a file error it printed "error: " and exit 2, with nothing to say what timed out.
    with pytest.raises(type(exc)):
        _raising(exc)


@pytest.mark.parametrize("name", ["runs/[tenant]/requests.parquet", "runs/[/x]/requests.parquet"])
def test_the_file_is_named_as_it_is(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Brackets in a path are not markup: read as markup, "[tenant]" vanished from the
    # line that says which file, and "[/x]" raised MarkupError out of the handler.
    with pytest.raises(typer.Exit):
        _raising(FileNotFoundError(errno.ENOENT, "No such file or directory", name))
    assert name in capsys.readouterr().err.replace("\n", "")


_MARKUP = "pods[3]: rank [bold]64[/] is not one of [8, 16]"


def test_an_input_error_is_printed_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    # The problem's text is not markup: read as markup, "[bold]" vanished from the line
    # and "[/]" with nothing open raised MarkupError out of the handler.
    problem = Problem(source="fleet[a].yaml", entry="pods[3]", field="rank", message=_MARKUP)
    with pytest.raises(typer.Exit) as stopped:
        _raising(InputError([problem]))
    assert stopped.value.exit_code == EXIT_BAD_INPUT
    assert str(problem) in capsys.readouterr().err.replace("\n", "")


def test_a_lorafleet_error_is_printed_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as stopped:
        _raising(EngineError(_MARKUP))
    assert stopped.value.exit_code == EXIT_FAILED
    assert _MARKUP in capsys.readouterr().err.replace("\n", "")


def test_a_labelled_line_prints_its_label_and_message_as_they_are() -> None:
    # Every CLI warning, note and per-pod line goes through print_labelled: the style is
    # markup, the label (a pod name) and the message (a plan's warning) are not.
    written = io.StringIO()
    print_labelled(Console(file=written, width=200, color_system=None), "bold", "pod[a]", _MARKUP)
    assert written.getvalue() == f"pod[a]: {_MARKUP}\n"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        pytest.param(
            PermissionError(errno.EACCES, "Permission denied", "out/plan.json"),
            "error: out/plan.json: Permission denied",
            id="file-not-in-message",
        ),
        pytest.param(
            FileNotFoundError(
                errno.ENOENT, "cannot write out/x/p.json: out/x does not exist", "out/x"
            ),
            "error: cannot write out/x/p.json: out/x does not exist",
            id="file-in-message",
        ),
    ],
)
def test_an_os_error_names_its_file_once_without_the_errno(
    exc: OSError, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Printed as str(exc): "[Errno 2] cannot write out/x/p.json: out/x does not exist:
    # 'out/x'", the folder twice.
    with pytest.raises(typer.Exit):
        _raising(exc)
    assert capsys.readouterr().err.strip() == expected
