"""How an audit and a log scan report while they run: a rich progress bar on a terminal, plain log lines
otherwise.  Findings are announced only after they are persisted."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TextIO, assert_never

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from prober.probing.events import (
    CheckDone,
    Event,
    FindingRecorded,
    Observed,
    PlanReady,
    StepDone,
    SurveyDone,
    TargetFailed,
)


class AuditProgress:
    def __init__(self, stream: TextIO | None = None, interactive: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.console = Console(file=self.stream, highlight=False)
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> AuditProgress:
        if self.interactive:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=True)
            self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()

    def _line(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False)
        else:
            print(text, file=self.stream, flush=True)

    def __call__(self, event: Event) -> None:
        match event:
            case PlanReady(plan=plan):
                self._line(f"plan {plan.target}: {len(plan.boundaries)} boundaries, {len(plan.exchanges)} "
                           f"exchanges, {plan.tokens:,} tokens")
                if self._bar is not None:
                    self._task = self._bar.add_task(f"auditing {plan.target}",
                                                    total=sum(len(e.steps) for e in plan.exchanges))
            case StepDone(result=result):
                s = result.step
                if self._bar is not None and self._task is not None:
                    if s.role != "control":  # the bar counts the plan's requests
                        self._bar.advance(self._task)
                else:
                    self._line(f"step {s.id} {s.role} tenant={s.tenant} tokens={result.sent_tokens:,} "
                               f"boundary={s.boundary} expect={'served' if s.expect_served else 'refused'} "
                               f"outcome={result.outcome} status={result.answer.status} "
                               f"findings={len(result.findings)}")
            case CheckDone(target=target, result=result):
                self._line(f"{result.check} {target}: {result.summary()}")
            case FindingRecorded(finding=finding):
                self._line(finding.describe())
            case TargetFailed(target=target, message=message):
                self._line(f"error: {target}: {message}")
            case SurveyDone() | Observed():
                pass  # the report shows what it learned; what a request observed is for incidents
            case _:
                assert_never(event)


class ScanProgress:
    """A log scan's progress bar on a terminal (bytes read of the inputs' total where it is known, records
    scanned); nothing elsewhere, since the scan's report is its output."""

    def __init__(self, total_bytes: int | None, stream: TextIO | None = None, interactive: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.total = total_bytes
        self.records = 0
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> ScanProgress:
        if self.interactive:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeElapsedColumn(),
                                 console=Console(file=self.stream, highlight=False), transient=True)
            self._bar.start()
            self._task = self._bar.add_task("scanning", total=self.total)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, size: int, records: int) -> None:
        self.records += records
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=size, description=f"scanning: {self.records:,} records")
