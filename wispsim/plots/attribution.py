"""The figure of violation attribution: violated rounds in the (queue time, verify time) plane,
coloured compute- or queue-dominant.

The labels come from :mod:`wispsim.analysis.attribution` (a round is compute-dominant when its
verify time exceeds ``factor`` x the moving average latency of the ``window`` batches before its
batch on the same replica); this module only draws them and counts them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from wispsim.analysis.attribution import COMPUTE, QUEUE, attribute_rounds, violated_rounds
from wispsim.plots.figure import figure_path, pyplot, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def attribution(
    rounds: pd.DataFrame,
    batches: pd.DataFrame,
    path: Path | str,
    window: int = 20,
    factor: float = 1.5,
    responses: pd.DataFrame | None = None,
    title: str | None = None,
) -> tuple[Path, dict[str, int]]:
    """Violated rounds in the (queue time, verify time) plane, coloured by attribution.

    Returns the path written (a folder gets attribution.png) and the counts per label
    (``compute-dominant``, ``queue-dominant``). Pass ``responses`` for the simulator's own verdicts
    (see :func:`violated_rounds`). Both axes are logarithmic; queue times below 0.1 ms are drawn at
    0.1 ms. At most 20,000 points are drawn (a fixed random subset); the counts use all of them.
    """
    out = figure_path(path, "attribution.png")
    fig, counts = attribution_figure(rounds, batches, window, factor, responses, title)
    return save(fig, out, "attribution.png"), counts


def attribution_figure(
    rounds: pd.DataFrame,
    batches: pd.DataFrame,
    window: int = 20,
    factor: float = 1.5,
    responses: pd.DataFrame | None = None,
    title: str | None = None,
) -> tuple[Figure, dict[str, int]]:
    """The figure of :func:`attribution`, not written, and the counts per label."""
    lab = attribute_rounds(violated_rounds(rounds, responses), batches, window, factor)
    counts = {COMPUTE: int((lab.label == COMPUTE).sum()), QUEUE: int((lab.label == QUEUE).sum())}
    total = sum(counts.values())
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.6, 5.0))
    show = lab.sample(20_000, random_state=0) if len(lab) > 20_000 else lab
    for name, color in ((QUEUE, "C0"), (COMPUTE, "C3")):
        d = show[show.label == name]
        ax.scatter(
            np.maximum(d.queue_time.to_numpy(float) * 1e3, 0.1),
            d.verify_time.to_numpy(float) * 1e3,
            s=4,
            alpha=0.35,
            color=color,
            label=f"{name}: {counts[name]}",
            rasterized=True,
            gid=f"attribution|{name}",
        )
    if total:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=8, loc="upper left", markerscale=3)
    else:
        ax.text(0.5, 0.5, "no violated rounds", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("queue time (ms)")
    ax.set_ylabel("verify time (ms)")
    ax.grid(alpha=0.3)
    shares = (
        f"{counts[COMPUTE] / total:.0%} compute-dominant, {counts[QUEUE] / total:.0%} queue-dominant"
        if total
        else "none"
    )
    head = title or "Violated rounds"
    ax.set_title(
        f"{head}: {shares} (n = {total})\ncompute: verify > {factor:g} x mean of the last {window} batches",
        fontsize=9,
    )
    fig.tight_layout()
    return fig, counts
