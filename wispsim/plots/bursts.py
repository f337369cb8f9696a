"""The figure of bursty runs: SLO compliance over time of several runs on one arrival trace, one
panel per class, with the trace's target and its bursts' peaks (SPEC 7).

It reads the folders ``wispsim run --arrivals ...`` writes (timeseries.csv; server_timeseries.csv
and bursts.csv for a trace run), so it can be redrawn long after the runs; an empty compliance cell
(nothing decided in that window) is a gap in the line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from wispsim.analysis.tables import TIMESERIES_COLUMNS, check_numeric
from wispsim.errors import ConfigError, WispsimError
from wispsim.plots.figure import figure_path, pyplot, save
from wispsim.plots.labels import class_key, class_title, norm_class
from wispsim.results import Results

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def bursty_compare(
    run_folders: Mapping[str, Path | str],
    path: Path | str,
    classes: Sequence[Any] | None = None,
    title: str | None = None,
) -> Path:
    """SLO compliance over time of several runs (e.g. wisp vs fcfs on one trace), one panel per class.

    ``run_folders`` maps a legend label to a ``wispsim run`` folder (timeseries.csv; with
    ``--arrivals``, also bursts.csv and the trace target in server_timeseries.csv). The trace's
    target is drawn in grey on a twin axis, each burst's peak as a vertical line, the threshold
    1 - epsilon as a red line. ``classes``: which panels ("2", 4.0, "all"; default all of them).
    Returns the path written (a folder gets bursty_compare.png).
    """
    out = figure_path(path, "bursty_compare.png")
    return save(bursty_compare_figure(run_folders, classes, title), out, "bursty_compare.png")


def bursty_compare_figure(
    run_folders: Mapping[str, Path | str],
    classes: Sequence[Any] | None = None,
    title: str | None = None,
) -> Figure:
    """The figure of :func:`bursty_compare`, not written. Gids: ``compliance|LABEL|CLASS`` (a run's
    compliance line in a panel) and ``peak|CLASS`` (the vertical lines at bursts.csv's peak_t)."""
    if not run_folders:
        raise ConfigError("bursty_compare", "run_folders", "needs at least one run folder")
    series: dict[str, pd.DataFrame] = {}
    target: pd.DataFrame | None = None
    peaks: pd.DataFrame | None = None
    metas: dict[str, dict[str, Any]] = {}
    for label, f in run_folders.items():
        folder = Results.existing(f)
        ts = folder.read_csv("timeseries.csv", TIMESERIES_COLUMNS)
        # an empty compliance cell: nothing was decided in that window (a gap in the line)
        ts = check_numeric(ts, ("t", "compliance"), str(folder / "timeseries.csv"), gaps=("compliance",))
        series[label] = ts.assign(**{"class": ts["class"].map(norm_class)})
        metas[label] = folder.meta()
        if target is None and (folder / "server_timeseries.csv").is_file():
            srv = folder.read_csv("server_timeseries.csv", ("t",))
            if "target" in srv:
                target = check_numeric(srv, ("t", "target"), str(folder / "server_timeseries.csv"))
        if peaks is None and (folder / "bursts.csv").is_file():
            b = folder.read_csv("bursts.csv", ("peak_t", "peak_value"))
            b = check_numeric(b, ("peak_t", "peak_value"), str(folder / "bursts.csv"))
            peaks = b.drop_duplicates("peak_t")[["peak_t", "peak_value"]]
    known = sorted({c for s in series.values() for c in s["class"]}, key=class_key)
    if classes is None:
        panels = known
    else:
        panels = [norm_class(c) for c in classes]
        unknown = [c for c in panels if c not in known]
        if unknown:
            raise ConfigError(
                "--classes", "", f"no series for {', '.join(unknown)}; known: {', '.join(known)}"
            )
    if not panels:
        raise WispsimError(f"{next(iter(run_folders.values()))}: timeseries.csv has no rows")
    first_meta = next(iter(metas.values()))
    eps = first_meta.get("epsilon")
    plt = pyplot()
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(10, 1.9 * len(panels) + 1.4), sharex=True, squeeze=False
    )
    for i, (ax, cls) in enumerate(zip(axes[:, 0], panels, strict=True)):
        if target is not None:
            tw = ax.twinx()
            tw.fill_between(target.t, target.target, step="pre", color="0.85", lw=0, label="trace target")
            tw.set_ylabel("devices", fontsize=7, color="0.5")
            tw.tick_params(labelsize=7, colors="0.5")
            ax.set_zorder(tw.get_zorder() + 1)  # compliance lines in front of the grey area
            ax.patch.set_visible(False)
        for j, (label, ts) in enumerate(series.items()):
            d = ts[ts["class"] == cls].sort_values("t")
            ax.plot(
                d.t, d.compliance, color=f"C{j % 10}", lw=1.3, label=label, gid=f"compliance|{label}|{cls}"
            )
        if eps is not None:
            ax.axhline(1 - float(eps), color="r", ls="--", lw=0.8, label=f"threshold {1 - float(eps):g}")
        if peaks is not None:
            for pt, pv in zip(peaks.peak_t, peaks.peak_value, strict=True):
                ax.axvline(pt, color="0.45", ls=":", lw=0.9, gid=f"peak|{cls}")
                if i == 0:
                    ax.annotate(
                        f"peak {pv:g}",
                        (pt, 1.0),
                        xycoords=("data", "axes fraction"),
                        xytext=(2, -10),
                        textcoords="offset points",
                        fontsize=7,
                        color="0.3",
                    )
        ax.set_ylim(-0.02, 1.05)
        ax.set_ylabel(f"{class_title(cls)}\ncompliance", fontsize=8)
        ax.grid(alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if target is not None:
        import matplotlib.patches as mpatches

        handles.append(mpatches.Patch(color="0.85", label="trace target (right axis)"))
        labels.append("trace target (right axis)")
    axes[0, 0].legend(handles, labels, fontsize=7, loc="lower left", ncol=min(len(labels), 4))
    axes[-1, 0].set_xlabel("time (s)")
    if title is None:
        seeds = {str(m.get("seed", "?")) for m in metas.values()}
        bits = [
            f"seed {seeds.pop()}"
            if len(seeds) == 1
            else "seeds " + ", ".join(f"{k} {m.get('seed', '?')}" for k, m in metas.items())
        ]
        if first_meta.get("trace"):
            bits.append(f"arrivals {Path(str(first_meta['trace'])).name}")
        title = f"SLO compliance over time: {' vs '.join(series)} ({', '.join(bits)})"
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
