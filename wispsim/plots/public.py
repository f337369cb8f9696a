"""Simulated against real per-token time on public GPU runs (experiments/REPORT.md, "public GPU
measurements"): median TPOT against concurrency (closed-loop sweeps) or request rate (open loop),
one panel per deployment, real as markers, simulated as lines, the calibration runs filled."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from wispsim.plots.figure import pyplot, save


def public_tpot(errors: pd.DataFrame, path: Path | str) -> Path:
    """``errors``: :func:`wispsim.study.public.compare`'s table."""
    plt = pyplot()
    tp = errors[errors.metric == "tpot_median_ms"].copy()
    tp["x"] = tp.concurrency.where(tp.concurrency.notna(), tp.request_rate)
    groups = sorted(tp.group.unique())
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, g in zip(axes.flat, groups, strict=False):
        d = tp[tp.group == g].sort_values("x")
        closed = d.concurrency.notna().all()
        ax.plot(d.x, d.simulated, "x-", color="C0", label="simulated")
        cal = d[d.set == "calibration"]
        held = d[d.set != "calibration"]
        ax.plot(held.x, held.real, "o", mfc="none", color="C3", label="real (held out)")
        if len(cal):
            ax.plot(cal.x, cal.real, "o", color="C3", label="real (calibration)")
        if closed and d.x.max() / max(d.x.min(), 1) > 8:
            ax.set_xscale("log", base=2)
        ax.set_title(g.replace("ruiz-", "").replace("isim-", ""), fontsize=9)
        ax.set_xlabel("concurrency" if closed else "request rate (req/s); workloads differ", fontsize=8)
        if len(d) == 1:
            ax.set_xticks(list(d.x))
        ax.set_ylabel("median TPOT (ms)", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(groups) :]:
        ax.axis("off")
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(lab, h)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Median TPOT, simulated (roofline) vs real vLLM on H100", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    return save(fig, path, "public_tpot.png")
