"""What every command module shares: the consoles, option types, parsers, tables, progress bar.

Commands print results on ``console`` (stdout) and progress, status and errors on
``err_console`` (stderr), so output can be piped while the user still sees what is running.
The option types here carry the help texts several commands share word for word; the parsers
turn option strings (``2,4,6,8``, ``10:200:10``, ``2:500,4:500``) into values or raise a one-line
:class:`~wispsim.errors.ConfigError`. Nothing here runs a simulation.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import typer
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

from wispsim.config import POLICY_NAMES, DeviceGroup, Scenario, parse_set
from wispsim.errors import ConfigError
from wispsim.sim.inputs import load_scenario

console = Console()
err_console = Console(stderr=True)

ScenarioArg = Annotated[
    Path | None, typer.Argument(help="Scenario YAML (merged over the default scenario).", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a scenario field, e.g. --set server.delta_ms=3 (repeatable)."),
]
OutOpt = Annotated[
    Path | None, typer.Option("--out", "-o", help="Output folder (default: a new folder under results/).")
]
JobsOpt = Annotated[
    int, typer.Option("--jobs", "-j", help="Parallel simulations (local processes, or Ray tasks in flight).")
]
BackendOpt = Annotated[str, typer.Option(help="Where simulations run: local (process pool) or ray.")]
AddressOpt = Annotated[
    str | None, typer.Option(help="Ray cluster address (with --backend ray; default: a local Ray instance).")
]
PolicyOpt = Annotated[str | None, typer.Option(help=f"Policy preset: {', '.join(POLICY_NAMES)}.")]
RouterOpt = Annotated[str | None, typer.Option(help="round-robin, least-work or affinity.")]
StartOpt = Annotated[int, typer.Option(help="First N of the doubling bracket.")]
MaxDevicesOpt = Annotated[int, typer.Option(help="Largest N the search tries.")]


# ------------------------------------------------------------------------------------------
# option parsing
# ------------------------------------------------------------------------------------------


def parse_classes(text: str | None, option: str = "--classes") -> tuple[float, ...] | None:
    """``2,4,6,8`` -> SLO classes in tokens/s; None when the option was not given."""
    if text is None:
        return None
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(
            option, "", f"expected comma-separated token speeds like 2,4,6,8, got {text!r}"
        ) from None
    if not vals or any(v <= 0 for v in vals):
        raise ConfigError(option, "", f"token speeds must be > 0, got {text!r}")
    return vals


def parse_devices(text: str | None) -> tuple[int, ...]:
    """``10:200:10`` (inclusive range) or ``10,20,50``."""
    if not text:
        return ()
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) == 2:
                parts.append(1)
            lo, hi, step = parts
            if lo < 1 or hi < lo or step < 1:
                raise ValueError
            return tuple(range(lo, hi + 1, step))
        vals = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
        if not vals or vals[0] < 1:
            raise ValueError
        return vals
    except ValueError:
        raise ConfigError(
            "--devices", "", f"expected LO:HI:STEP or a list like 10,20,50 with values >= 1, got {text!r}"
        ) from None


def parse_policies(text: str) -> list[str]:
    """``wisp,sled`` -> policy preset names, each checked."""
    pols = [p.strip() for p in text.split(",") if p.strip()]
    for p in pols:
        if p not in POLICY_NAMES:
            raise ConfigError("--policies", "", f"unknown policy {p!r}; allowed: {', '.join(POLICY_NAMES)}")
    if not pols:
        raise ConfigError("--policies", "", "needs at least one policy")
    return pols


def parse_fleet(text: str) -> tuple[DeviceGroup, ...]:
    """``2:500,4:500`` -> device groups (class:count)."""
    groups = []
    for part in text.split(","):
        try:
            slo, cnt = part.split(":")
            g = DeviceGroup(count=int(cnt), slo=float(slo), name=f"{float(slo):g} tok/s")
        except (ValueError, ConfigError):
            raise ConfigError(
                "--fleet",
                "",
                f"expected CLASS:COUNT pairs like 2:500,4:500 (class > 0, count >= 0), got {part!r}",
            ) from None
        groups.append(g)
    if sum(g.count for g in groups) < 1:
        raise ConfigError("--fleet", "", "needs at least one device")
    return tuple(groups)


def describe_load(sc: Scenario, devices: int | None = None) -> str:
    """The offered load in a few words: ``N=12``, ``Poisson 3 responses/s, 2 replicas``."""
    a = sc.arrivals
    reps = f", {sc.server.replicas} replicas" if sc.server.replicas > 1 else ""
    if a.process == "closed":
        return f"N={devices or sc.devices.count}{reps}"
    if a.process == "poisson":
        return f"Poisson {a.rate:g} responses/s{reps}"
    return f"{a.kind} trace {Path(a.trace or '').name}{reps}"


def resolve_scenario(scenario: Path | None, sets: list[str] | None) -> Scenario:
    """The scenario a command runs: the file (or the default) with every ``--set`` applied."""
    return load_scenario(scenario, parse_set(sets or []))


def out_dir(out: Path | None, command: str) -> Path:
    """The results folder: ``--out``, or ``results/COMMAND-YYYYmmdd-HHMMSS``; created."""
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("results") / f"{command}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    return out


# ------------------------------------------------------------------------------------------
# printing
# ------------------------------------------------------------------------------------------


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
) -> Table:
    """A rich table of ``df`` (or of its ``columns``), cells by :func:`fmt`, right-aligned except
    the ``left`` columns."""
    t = Table(title=title)
    cols = columns or list(df.columns)
    for c in cols:
        t.add_column(str(c), justify="left" if c in left else "right")
    for row in df[cols].itertuples(index=False):  # itertuples keeps each column's type
        t.add_row(*(fmt(v) for v in row))
    return t


def markdown_table(df: pd.DataFrame) -> str:
    """The same table as Markdown, for reports written beside results."""
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def progress(eta: bool = False) -> Progress:
    """A progress bar on stderr: the task's description, bar, done/total, elapsed (and the
    estimated time left with ``eta``)."""
    columns: list[ProgressColumn] = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    if eta:
        columns.append(TimeRemainingColumn())
    return Progress(*columns, console=err_console)
