"""The typer application every command module registers on, and its error handling.

A user mistake ends with one line per problem on stderr and exit code 2; an engine
or Kubernetes failure with exit code 1; never a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from placement.errors import InputError, LorafleetError

app = typer.Typer(
    name="lorafleet",
    help="Keep the right LoRA adapters on the right GPU pods before the requests arrive.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

P = ParamSpec("P")
R = TypeVar("R")

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def out() -> Console:
    """The console for results (stdout)."""
    return Console(soft_wrap=True)


def err() -> Console:
    """The console for problems and progress (stderr)."""
    return Console(stderr=True, soft_wrap=True)


def print_labelled(console: Console, style: str, label: str, message: object) -> None:
    """Print one line "label: message", the label in the Rich ``style``.

    The label and the message are printed as they are: brackets in a path, a name or a
    problem are not Rich markup (read as markup, "[tenant]" vanished from the line and a
    stray "[/]" raised MarkupError).
    """
    console.print(f"[{style}]{escape(label)}[/]: {escape(str(message))}", highlight=False)


def os_error_line(exc: OSError) -> str:
    """An OSError as "file: what is wrong", each file named once and without the errno.

    ``str(exc)`` is "[Errno 2] what: 'file'": with a message that already names the file
    (``write_through``'s "cannot write X: D does not exist"), D was printed twice.
    """
    what = exc.strerror or str(exc)
    names = [os.fsdecode(n) for n in (exc.filename, exc.filename2) if isinstance(n, str | bytes)]
    unnamed = [name for name in names if name not in what]
    return f"{' -> '.join(unnamed)}: {what}" if unnamed else what


def report_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn lorafleet's errors into clear lines and exit codes instead of tracebacks."""

    @wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except InputError as exc:
            console = err()
            for problem in exc.problems:
                label = "warning" if problem.severity == "warning" else "error"
                print_labelled(console, "bold red", label, problem)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except LorafleetError as exc:
            print_labelled(err(), "bold red", "error", exc)
            raise typer.Exit(EXIT_FAILED) from None
        except (TimeoutError, ConnectionError):
            # OSErrors too (asyncio's timeout among them, with no message), but not a
            # file: they keep their traceback rather than read "error: " and exit 2.
            raise
        except OSError as exc:  # a file that cannot be read or written: named, no traceback
            print_labelled(err(), "bold red", "error", os_error_line(exc))
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:
            err().print("interrupted")
            sys.exit(130)

    return wrapper
