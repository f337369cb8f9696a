"""``wispsim plot curves|capacity|bursty|attribution``: figures from any results folder.

Each command reads a folder that ``sweep``, ``compare`` or ``run`` wrote (never simulating) and
writes one PNG, by default inside that folder; :mod:`wispsim.plots.capacity` draws them. ``--out`` is a file
ending in .png, .pdf or .svg, or an existing folder (the default file name is written in it); the
path actually written is printed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from wispsim.cli.common import console
from wispsim.cli.options import FRACTION_OPEN, POSITIVE, whole
from wispsim.config.limits import MAX_INT
from wispsim.errors import ConfigError
from wispsim.results import check_output_file

plot_app = typer.Typer(help="Figures from results folders (sweep, compare, run).", no_args_is_help=True)

FolderArg = Annotated[Path, typer.Argument(help="A results folder.", show_default=False)]
PngOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="Figure to write: a .png, .pdf or .svg file, or a folder (default: inside the results folder).",
    ),
]


def _out(out: Path | None, folder: Path, name: str) -> Path:
    """The figure's path, checked before anything is read or drawn (a missing folder above it is
    created when the figure is written)."""
    from wispsim.plots import figure_path

    _say_if_incomplete(folder)
    return check_output_file(figure_path(out if out is not None else folder / name, name), "--out")


def _say_if_incomplete(folder: Path) -> None:
    """A results folder without its manifest (written last) is one whose command was interrupted or
    failed: the figure shows what it wrote, and says so."""
    if folder.is_dir() and not (folder / "manifest.json").is_file():
        console.print(
            f"note: {folder} has no manifest.json (its command was interrupted or failed): the figure "
            "shows what it wrote",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _wrote(path: Path) -> None:
    console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


@plot_app.command("curves")
def curves(
    folder: FolderArg,
    out: PngOpt = None,
    epsilon: Annotated[
        float | None, typer.Option(help="Violation target line (default: the sweep's).", parser=FRACTION_OPEN)
    ] = None,
) -> None:
    """Violation rate vs devices per class and policy, with the capacity knees and their intervals."""
    from wispsim.plots import violation_curves

    path = violation_curves(folder, _out(out, folder, "violation_curves.png"), epsilon=epsilon)
    _wrote(path)


@plot_app.command("capacity")
def capacity(folder: FolderArg, out: PngOpt = None) -> None:
    """Capacity per class and policy as grouped bars with 95% intervals."""
    from wispsim.plots import capacity_bars

    path = capacity_bars(folder, _out(out, folder, "capacity.png"))
    _wrote(path)


@plot_app.command("bursty")
def bursty(
    folders: Annotated[
        list[Path], typer.Argument(help="Run folders (wispsim run --arrivals ...).", show_default=False)
    ],
    label: Annotated[
        list[str] | None, typer.Option("--label", help="Legend label per folder, in order (repeatable).")
    ] = None,
    classes: Annotated[
        str | None, typer.Option(help="Panels, e.g. 2,8,all (default: every class and all).")
    ] = None,
    out: PngOpt = None,
) -> None:
    """SLO compliance over time of several runs, one panel per class, bursts marked."""
    from wispsim.plots import bursty_compare
    from wispsim.results import Results

    runs = [Results.existing(f) for f in folders]
    for f in folders[1:]:  # the first one's is said with its figure's path
        _say_if_incomplete(f)
    if label and len(label) != len(folders):
        raise ConfigError("--label", "", f"got {len(label)} label(s) for {len(folders)} folder(s)")
    names = list(label) if label else [r.label() for r in runs]
    if len(set(names)) < len(names):  # the same policy twice: tell the runs apart by folder
        names = [f"{n} ({f.name})" for n, f in zip(names, folders, strict=True)]
    if len(set(names)) < len(names):
        raise ConfigError("--label", "", "labels must be different")
    cls = [c for c in classes.split(",") if c.strip()] if classes else None
    dest = _out(out, folders[0], "bursty_compare.png")
    path = bursty_compare(dict(zip(names, folders, strict=True)), dest, classes=cls)
    _wrote(path)


@plot_app.command("attribution")
def attribution_cmd(
    folder: FolderArg,
    window: Annotated[
        int, typer.Option(help="Batches in the moving average of batch latency.", parser=whole(1, MAX_INT))
    ] = 20,
    factor: Annotated[
        float,
        typer.Option(
            help="Compute-dominant when verify time > FACTOR x the moving average.", parser=POSITIVE
        ),
    ] = 1.5,
    out: PngOpt = None,
) -> None:
    """Violated rounds of a run in the (queue, verify) plane: queue- or compute-dominant (SPEC 7)."""
    from wispsim.analysis.tables import BATCH_COLUMNS, ROUND_COLUMNS
    from wispsim.plots import attribution
    from wispsim.results import Results

    dest = _out(out, folder, "attribution.png")
    run = Results.existing(folder)
    rounds = run.read_parquet("rounds.parquet", ROUND_COLUMNS)
    batches = run.read_parquet("batches.parquet", BATCH_COLUMNS)
    responses = (
        run.read_parquet("responses.parquet", ("response", "violated", "measured"))
        if run.has("responses.parquet")
        else None
    )
    meta = run.meta()
    bits = [f"{k} {meta[k]}" for k in ("devices", "seed") if k in meta]
    head = f"{meta.get('policy', folder.name)}" + (f" ({', '.join(bits)})" if bits else "")
    path, counts = attribution(
        rounds,
        batches,
        dest,
        window=window,
        factor=factor,
        responses=responses,
        title=f"{head}, violated rounds",
    )
    total = sum(counts.values())
    shares = ", ".join(f"{k} {v} ({v / total:.0%})" for k, v in counts.items()) if total else "none"
    console.print(f"violated rounds: {shares}")
    _wrote(path)
