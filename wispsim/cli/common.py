"""What every command module shares: the consoles, option types, parsers, tables, progress bar.

Commands print results on ``console`` (stdout) and progress, status and errors on
``err_console`` (stderr), so output can be piped while the user still sees what is running.
The option types here carry the help texts several commands share word for word; the parsers
turn option strings (``2,4,6,8``, ``10:200:10``, ``2:500,4:500``) into values or raise a one-line
:class:`~wispsim.errors.ConfigError`. Nothing here runs a simulation.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

# Output that is not a terminal (piped, redirected to a log, captured) has no width to fit:
# rich would cut a wide table to 80 columns and turn its numbers into "0.0…". There every table
# is printed at its full width, so a logged run keeps every number; COLUMNS still sets a width.
UNCUT_WIDTH = 100_000


def make_console(stderr: bool = False) -> Console:
    c = Console(stderr=stderr)
    if not c.is_terminal and "COLUMNS" not in os.environ:
        c = Console(stderr=stderr, width=UNCUT_WIDTH)
    return c


console = make_console()
err_console = make_console(stderr=True)


def fmt(v: Any) -> str:
    """One table cell: floats with 3 decimals (whole numbers from 100 on), NaN as ``-``."""
    if isinstance(v, float | np.floating):
        x = float(v)
        if x != x:
            return "-"
        return f"{x:.3f}" if abs(x) < 100 else f"{x:.0f}"
    return str(v)


def table(
    df: pd.DataFrame, title: str, columns: list[str] | None = None, left: Collection[str] = ()
) -> FitTable:
    """A table of ``df`` (or of its ``columns``), cells by :func:`fmt`, right-aligned except the
    ``left`` columns, that never cuts a value: too wide for the terminal, it is transposed, or
    split into groups of columns (:class:`FitTable`)."""
    cols = columns or list(df.columns)
    rows = [[fmt(v) for v in row] for row in df[cols].itertuples(index=False)]  # keeps each column's type
    return FitTable([str(c) for c in cols], rows, title, {str(c) for c in left})


class FitTable:
    """Rendered at the console's width: as is when every value fits whole, else transposed (a
    row per column), else in groups of columns that fit, each repeating the first (key) column.
    A header may wrap between words; a value is never cut."""

    def __init__(self, headers: list[str], rows: list[list[str]], title: str, left: set[str]) -> None:
        self.headers, self.rows, self.title, self.left = headers, rows, title, left

    @staticmethod
    def _width(headers: list[str], rows: list[list[str]]) -> int:
        """Columns needed with every cell whole (headers may wrap between words): rich's box
        draws 1 border per column plus 1, and pads each cell by 1 on each side."""
        widths = [
            max([max(len(w) for w in h.split()) if h.strip() else 1] + [len(r[i]) for r in rows])
            for i, h in enumerate(headers)
        ]
        return sum(widths) + 3 * len(widths) + 1

    def _table(self, headers: list[str], rows: list[list[str]], title: str, left: set[str]) -> Table:
        # a title longer than the table would wrap mid-phrase above it: it goes in the table's
        # full width instead (rich centres a title within the table, wrapping it to fit)
        wide = len(title) > self._width(headers, rows) - 2
        t = Table(title=title, min_width=len(title) + 4 if wide else None)
        for h in headers:
            t.add_column(h, justify="left" if h in left else "right", overflow="fold")
        for r in rows:
            t.add_row(*r)
        return t

    def __rich_console__(self, console: Console, options: Any) -> Iterator[Table]:
        width = options.max_width
        if self._width(self.headers, self.rows) <= width or not self.rows:
            yield self._table(self.headers, self.rows, self.title, self.left)
            return
        key = self.headers[0]
        flipped_headers = [key] + [r[0] for r in self.rows]
        flipped = [[h] + [r[i] for r in self.rows] for i, h in enumerate(self.headers) if i]
        if self._width(flipped_headers, flipped) <= width:
            yield self._table(flipped_headers, flipped, f"{self.title} (one row per column)", {key})
            return
        groups: list[list[int]] = []
        for i in range(1, len(self.headers)):
            grown = [*groups[-1], i] if groups else [i]
            cells = [[r[0]] + [r[j] for j in grown] for r in self.rows]
            if groups and self._width([key] + [self.headers[j] for j in grown], cells) <= width:
                groups[-1] = grown
            else:
                groups.append([i])
        for n, group in enumerate(groups, 1):
            yield self._table(
                [key] + [self.headers[j] for j in group],
                [[r[0]] + [r[j] for j in group] for r in self.rows],
                f"{self.title} ({n}/{len(groups)})",
                self.left,
            )


def markdown_table(df: pd.DataFrame) -> str:
    """The same table as Markdown, for reports written beside results."""
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


class LoggedProgress(Progress):
    """A progress bar that, when stderr is not a terminal (a log file, CI), prints a plain line
    per task instead: when it starts, at most every :data:`LOG_EVERY_S` seconds while it runs,
    and when it ends, so a long command piped to a log is never silent."""

    def __init__(self, *columns: Any, **kw: Any) -> None:
        super().__init__(*columns, **kw)
        self._logged: dict[Any, float] = {}

    def _log(self, task_id: Any, force: bool = False) -> None:
        if self.console.is_terminal:
            return
        task = self._tasks.get(task_id)
        if task is None:
            return
        now = time.monotonic()
        last = self._logged.get(task_id)
        done = task.total is not None and task.completed >= task.total
        if not force and not done and last is not None and now - last < LOG_EVERY_S:
            return
        if done and last == -1.0:
            return  # its end is logged once
        self._logged[task_id] = -1.0 if done else now
        total = f"/{task.total:g}" if task.total is not None else ""
        if not task.completed and last in (None, -1.0):  # a start (of the task or a phase): its work
            todo = "" if task.total is None else f", {task.total:g} to do"
            line = f"{task.description}: started{todo}"
        else:
            line = f"{task.description}: {task.completed:g}{total} after {task.elapsed or 0.0:.0f} s"
        self.console.print(line, markup=False, highlight=False)

    def add_task(self, *args: Any, **kw: Any) -> Any:
        task_id = super().add_task(*args, **kw)
        self._log(task_id, force=True)
        return task_id

    def update(self, task_id: Any, *args: Any, **kw: Any) -> None:
        super().update(task_id, *args, **kw)
        self._log(task_id)

    def advance(self, task_id: Any, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)


LOG_EVERY_S = 30.0  # a progress line at most this often when stderr is not a terminal


def progress(eta: bool = False) -> Progress:
    """A progress bar on stderr: the task's description, bar, done/total, elapsed (and the
    estimated time left with ``eta``); plain lines when stderr is not a terminal."""
    columns: list[ProgressColumn] = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    if eta:
        columns.append(TimeRemainingColumn())
    return LoggedProgress(*columns, console=err_console)


@contextmanager
def reporting(description: str, eta: bool = False) -> Iterator[Callable[..., None]]:
    """A progress bar that appears with the first report, so a command whose options fail
    prints only its one-line error: ``with reporting("sweep") as report: run(..., report)``.
    ``report(done, total)`` moves it (total None while unknown); ``report(done, total, text)``
    also replaces its description."""
    bar: list[Any] = []

    def report(done: float, total: float | None = None, text: str | None = None) -> None:
        if not bar:
            bar.append(progress(eta))
            bar[0].start()
            bar.append(bar[0].add_task(description, total=None))
        fields = {} if text is None else {"description": text}
        bar[0].update(bar[1], completed=done, total=total, **fields)

    try:
        yield report
    finally:
        if bar:
            bar[0].stop()


class LoggedStatus:
    """A spinner's plain twin for a stderr that is not a terminal: every :data:`LOG_EVERY_S`
    seconds while the step runs, its latest text and the time since it started (a step that
    ends sooner, or fails with its one-line error, prints nothing)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.t0 = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, args=(LOG_EVERY_S,), daemon=True)

    def _tick(self, every: float) -> None:
        while not self._done.wait(every):
            err_console.print(
                f"{self.text} ({time.monotonic() - self.t0:.0f} s)", markup=False, highlight=False
            )

    def update(self, text: str) -> None:
        self.text = text

    def __enter__(self) -> LoggedStatus:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()


def status(text: str) -> Any:
    """A spinner with ``text`` on stderr (``.update(text)`` replaces it); where stderr is not a
    terminal (a log file, CI) plain timed lines instead, so a long step piped to a log is never
    silent."""
    return err_console.status(text) if err_console.is_terminal else LoggedStatus(text)


# the summary columns `run` and `swarm` print (summary.csv keeps them all)
SUMMARY_COLUMNS = [
    "class",
    "devices",
    "responses",
    "violation_rate",
    "speed_p50",
    "budget_miss_rate",
    "goodput_tps",
    "acceptance_ratio",
    "queue_p95_ms",
    "verify_p95_ms",
    "gpu_utilization",
    "mean_batch_size",
]
