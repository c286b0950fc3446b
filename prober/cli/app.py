"""The command tree, and the one place a `LeakprobeError` becomes `error: <message>` and exit 2.

A command raises what went wrong; it never formats or catches leakprobe's own errors itself, so every
command reports them the same way and a bug (anything else) still shows its traceback."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from prober import __version__
from prober.domain.errors import LeakprobeError

EXIT_ERROR = 2


class _Reporting(TyperGroup):
    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context
        try:
            return super().invoke(ctx)
        except LeakprobeError as exc:
            raise fail(str(exc)) from None


def fail(message: str) -> typer.Exit:
    """Print one error line; the caller raises what this returns."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_ERROR)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"leakprobe {__version__}")
        raise typer.Exit(0)


app = typer.Typer(name="leakprobe", help="Catch one tenant's data in another tenant's LLM answer.", cls=_Reporting,
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
testbed_app = typer.Typer(help="The reference multi-tenant paged-KV engine (a real HTTP target).",
                          no_args_is_help=True)
canaries_app = typer.Typer(help="Mint and inspect canaries.", no_args_is_help=True)
drill_app = typer.Typer(help="Fire drills: the incident's fault in an engine of your own (staging only).",
                        no_args_is_help=True)
app.add_typer(testbed_app, name="testbed")
app.add_typer(canaries_app, name="canaries")
app.add_typer(drill_app, name="drill")


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """leakprobe: a semantic cross-tenant leakage detector and canary prober."""


def print_table(header: list[str], rows: list[list[str]]) -> None:
    from prober.report.terminal import Terminal

    typer.echo(Terminal.of(sys.stdout).table(header, rows), nl=False)
