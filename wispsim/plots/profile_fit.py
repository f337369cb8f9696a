"""Figures of a latency-profile fit: measured vs predicted, and residuals by regime.

Both are written into the fit folder (``NAME.fit/``) by ``wispsim profile fit``. They read only
the fit's per-configuration predictions (``split``, ``category``, ``latency_s``,
``predicted_s``, ``error_s``, ``rel_error``). Axes turn logarithmic when the latencies span more
than a factor of 20. Each figure has a ``*_figure`` twin that returns the matplotlib Figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.plots.figure import pyplot, tidy

# the fit figures have always been written at 120 dpi (figure.DPI, used elsewhere, is 110)
FIT_DPI = 120


def _save(fig: Any, path: Path) -> Path:
    plt = pyplot()
    try:
        tidy(fig)
        fig.savefig(path, dpi=FIT_DPI)
    finally:
        plt.close(fig)
    return path


def _log_scale(p: pd.DataFrame) -> tuple[float, float, bool]:
    """The latency range in ms, and whether it spans enough for logarithmic axes."""
    ms_y, ms_p = 1e3 * p.latency_s, 1e3 * p.predicted_s
    lo, hi = float(min(ms_y.min(), ms_p.min())), float(max(ms_y.max(), ms_p.max()))
    return lo, hi, hi / max(lo, 1e-9) > 20


def actual_vs_predicted_figure(predictions: pd.DataFrame, title: str) -> Any:
    """Measured vs predicted latency per configuration (train and test), with the +-10% band."""
    plt = pyplot()
    p = predictions
    lo, hi, log = _log_scale(p)
    fig, ax = plt.subplots(figsize=(6, 5.5))
    line = np.geomspace(max(lo, 1e-6) * 0.8, hi * 1.25, 100) if log else np.linspace(0, hi * 1.1, 100)
    ax.fill_between(line, line * 0.9, line * 1.1, color="0.85", label="+-10%")
    ax.plot(line, line, color="0.4", lw=1)
    for split, marker in (("train", "o"), ("test", "^")):
        s = p[p.split == split]
        ax.scatter(1e3 * s.predicted_s, 1e3 * s.latency_s, marker=marker, s=18, label=f"{split} ({len(s)})")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("predicted (ms)")
    ax.set_ylabel("measured (ms)")
    ax.set_title(f"{title}: measured vs predicted")
    ax.legend()
    fig.tight_layout()
    return fig


def residuals_figure(predictions: pd.DataFrame, title: str) -> Any:
    """Absolute and relative errors against the prediction, coloured by regime (plan category)."""
    plt = pyplot()
    p = predictions
    log = _log_scale(p)[2]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for cat, g in p.groupby("category"):
        axes[0].scatter(1e3 * g.predicted_s, 1e3 * g.error_s, s=14, label=cat)
        axes[1].scatter(1e3 * g.predicted_s, 100 * g.rel_error, s=14, label=cat)
    for ax, lab in zip(axes, ("predicted - measured (ms)", "relative error (%)"), strict=True):
        ax.axhline(0, color="0.4", lw=1)
        ax.set_xlabel("predicted (ms)")
        ax.set_ylabel(lab)
        if log:
            ax.set_xscale("log")
    axes[1].axhspan(-10, 10, color="0.9", zorder=0)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title}: residuals by regime")
    fig.tight_layout()
    return fig


def plot_fit(predictions: pd.DataFrame, folder: Path, title: str) -> list[Path]:
    """Write ``actual_vs_predicted.png`` and ``residuals.png`` into ``folder``; their paths."""
    a = _save(actual_vs_predicted_figure(predictions, title), folder / "actual_vs_predicted.png")
    b = _save(residuals_figure(predictions, title), folder / "residuals.png")
    return [a, b]
