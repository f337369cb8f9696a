"""The figure of ``wispsim trace inspect``: what an acceptance trace says, in four panels.

It draws the report :func:`wispsim.measure.trace.inspect_trace` computes (plain data): the
accepted-length histogram, acceptance by position in the verification window, acceptance by the
draft's top-1 probability (against the diagonal a calibrated beta would follow), and the Pearson
correlations of the draft features with beta and with the verdicts. :func:`plot_report_figure`
returns the Figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.model.acceptance import Trace
from wispsim.plots.figure import DPI, pyplot, tidy


def plot_report_figure(r: dict[str, Any]) -> Any:
    """Four panels: accepted-length histogram, acceptance by window position, acceptance by
    top-1 bin, and feature correlations."""
    plt = pyplot()
    fig, ax = plt.subplots(2, 2, figsize=(10, 7))
    hist = r["accepted_length_hist"]
    ax[0, 0].bar(list(hist), list(hist.values()), color="#4C72B0")
    ax[0, 0].set(title=f"accepted length per window (K = {r['k']})", xlabel="L", ylabel="windows")
    pos = r["accept_by_window_position"]
    ax[0, 1].plot(range(1, len(pos) + 1), pos, marker="o")
    ax[0, 1].set(title="acceptance at window position (given reached)", xlabel="position", ylim=(0, 1))
    bins = pd.DataFrame(r["accept_by_top1_bin"])
    mid = (bins.top1_low + bins.top1_high) / 2
    ax[1, 0].plot(mid, bins.accept_rate, marker="o", label="accept rate")
    ax[1, 0].plot(mid, bins.mean_beta, marker="s", label="mean beta")
    ax[1, 0].plot([0, 1], [0, 1], ls=":", c="grey")
    ax[1, 0].set(title="acceptance by draft top-1 probability", xlabel="top-1 probability", ylim=(0, 1))
    ax[1, 0].legend()
    corr = pd.DataFrame(r["pearson"]).T
    corr.plot.bar(ax=ax[1, 1], rot=0)
    ax[1, 1].set(title="Pearson correlation of draft features", ylim=(-1, 1))
    fig.suptitle(f"{Path(r['path']).name}: {r['positions']} positions, mean accept {r['mean_accept']:.3f}")
    fig.tight_layout()
    return fig


def plot_report(r: dict[str, Any], trace: Trace, out: Path) -> Path:
    """Write :func:`plot_report_figure` to ``out``, named as matplotlib names it (a name without a
    suffix gets ``.png``). ``trace`` is the trace ``r`` was computed from (kept for callers)."""
    fig = plot_report_figure(r)
    try:
        tidy(fig)
        fig.savefig(out, dpi=DPI)
    finally:
        pyplot().close(fig)
    return out
