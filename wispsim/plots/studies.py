"""Figures that only the declarative experiments draw (:mod:`wispsim.study.experiments`).

The predictor ablation (acceptance and goodput with the rejection predictor on and off, per fleet
size) and the acceptance study (capacity per class under trace replay against independent
Bernoulli acceptance at the same mean rate). Both take the tables the studies write, so they can
be redrawn from ``ablation.csv`` and ``capacity.csv`` alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from wispsim.plots.figure import figure_path, pyplot, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def ablation_bars_figure(table: pd.DataFrame) -> Figure:
    """The figure of :func:`ablation_bars`, not written."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    x = np.arange(len(table))
    for ax, metric, label in (
        (axes[0], "acceptance_ratio", "accepted / drafted"),
        (axes[1], "goodput_tps", "goodput (tok/s)"),
    ):
        ax.bar(x - 0.2, table[f"{metric}_on"], 0.4, label="predictor on (wisp)")
        ax.bar(x + 0.2, table[f"{metric}_off"], 0.4, label="off (wisp-fixed, K=5)")
        ax.set_xticks(x, [str(n) for n in table.devices])
        ax.set_xlabel("devices")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle("Rejection predictor on vs off")
    fig.tight_layout()
    return fig


def ablation_bars(table: pd.DataFrame, path: Path | str) -> Path:
    """Two panels of bars per fleet size: accepted / drafted and goodput, predictor on (wisp) vs off
    (wisp-fixed, K = 5). ``table``: ablation.csv's columns (``devices``, ``METRIC_on``,
    ``METRIC_off``). Returns the path written (a folder gets ablation.png)."""
    out = figure_path(path, "ablation.png")
    return save(ablation_bars_figure(table), out, "ablation.png")


def acceptance_bars_figure(cap: pd.DataFrame, policies: list[str], mean: float) -> Figure:
    """The figure of :func:`acceptance_bars`, not written."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(policies), figsize=(3.6 * len(policies) + 0.6, 3.8), squeeze=False)
    for ax, pol in zip(axes[0], policies, strict=True):
        d = cap[cap.policy == pol]
        classes = list(dict.fromkeys(d["class"]))
        x = np.arange(len(classes))
        for i, (label, color) in enumerate((("trace", "C0"), ("bernoulli", "C1"))):
            e = d[d.acceptance == label].set_index("class").reindex(classes)
            val = e.capacity.to_numpy(float)
            err = [
                np.clip(val - e.ci_low.to_numpy(float), 0, None),
                np.clip(e.ci_high.to_numpy(float) - val, 0, None),
            ]
            ax.bar(x + (i - 0.5) * 0.4, val, 0.4, yerr=err, capsize=3, color=color, label=label)
        ax.set_xticks(x, [f"{float(c):g}" for c in classes])
        ax.set_xlabel("SLO class (tok/s)")
        ax.set_title(pol, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("devices at capacity")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"Capacity: trace replay vs independent Bernoulli at the same mean ({mean:.3f})", fontsize=11
    )
    fig.tight_layout()
    return fig


def acceptance_bars(cap: pd.DataFrame, policies: list[str], mean: float, path: Path | str) -> Path:
    """One panel per policy: capacity per class under trace replay and under Bernoulli at the mean
    rate ``mean``, with the 95% intervals as error bars. ``cap``: capacity tables of both sweeps
    with an ``acceptance`` column (``trace`` or ``bernoulli``). Returns the path written (a folder
    gets acceptance.png)."""
    out = figure_path(path, "acceptance.png")
    return save(acceptance_bars_figure(cap, policies, mean), out, "acceptance.png")
