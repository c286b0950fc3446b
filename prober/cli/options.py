"""Options several commands share, each parsed once into the type the library takes."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from prober.domain.errors import LedgerError
from prober.domain.types import Severity
from prober.ledger.location import FORMS, LedgerLocation
from prober.targets.api import Api


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


def _ledger(text: str | LedgerLocation) -> LedgerLocation:
    try:
        return LedgerLocation.parse(text)
    except LedgerError as exc:
        raise typer.BadParameter(str(exc)) from None


def _severity(text: str | Severity) -> Severity:
    if isinstance(text, Severity):  # the default, passed through the parser too
        return text
    try:
        return Severity.parse(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


LEDGER_HELP = f"Ledger: {FORMS}."
Ledger = Annotated[LedgerLocation | None, typer.Option(
    parser=_ledger, metavar="PATH|URL", help=LEDGER_HELP + " Default: the config's, else leakprobe.sqlite.")]
RequiredLedger = Annotated[LedgerLocation, typer.Option(parser=_ledger, metavar="PATH|URL", help=LEDGER_HELP)]
FailOn = Annotated[Severity | None, typer.Option(parser=_severity, metavar="SEVERITY",
                                                 help="Exit 1 at or above: info | warning | high | critical.")]
ApiOption = Annotated[Api | None, typer.Option(help="The API the target speaks (with --target).")]
Tenants = Annotated[list[str] | None, typer.Option(
    "--tenant", help="NAME=ENVVAR, repeatable: a tenant and the variable holding its API key; NAME=ENVVAR@END_USER: "
                     "an end user behind that key (tenants may then share one key).")]
Format = Annotated[OutputFormat, typer.Option("--format", help="json | table")]
Deprecated = Annotated[bool | None, typer.Option(hidden=True, help="Deprecated: --check NAME or --skip NAME.")]
