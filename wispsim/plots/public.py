"""Simulated against real per-token time on public GPU runs (experiments/REPORT.md, "public GPU
measurements"): median TPOT against concurrency (closed-loop sweeps) or request rate (open loop),
one panel per deployment, real as markers, simulated as lines, the calibration runs filled."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

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
    title = "Median TPOT, simulated (roofline) vs real vLLM on H100"
    return _finish(fig, axes, len(groups), 3, title, path, "public_tpot.png")


def public_speculative(errors: pd.DataFrame, runs: pd.DataFrame, path: Path | str) -> Path:
    """Mean ITL (one streamed chunk per step) against concurrency under server-side speculation:
    one panel per deployment, one colour per k, real as markers, simulated as lines."""
    plt = pyplot()
    k = runs.set_index("run_id").num_spec_tokens
    itl = errors[errors.metric == "itl_mean_ms"].copy()
    itl["k"] = itl.run_id.map(k).astype(int)
    groups = sorted(itl.group.unique())
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, g in zip(axes.flat, groups, strict=False):
        d = itl[itl.group == g]
        if d.concurrency.nunique() == 1:  # one concurrency (a k sweep): against k
            d = d.sort_values("k")
            ax.plot(d.k, d.simulated, "-", color="0.3", lw=1)
            for i, (_, dk) in enumerate(d.groupby("k")):
                ax.plot(dk.k, dk.real, "o", mfc="none", ms=4, color=f"C{i % 10}")
            ax.set_xticks(sorted(d.k.unique()))
            ax.set_xlabel(f"k (concurrency {d.concurrency.iloc[0]:g})", fontsize=8)
            ax.set_title(g.replace("ruiz-", ""), fontsize=9)
            ax.set_ylabel("mean ITL (ms per step)", fontsize=8)
            ax.set_ylim(bottom=0)
            ax.tick_params(labelsize=7)
            continue
        for i, (kk, dk) in enumerate(sorted(d.groupby("k"))):
            dk = dk.sort_values("concurrency")
            color = f"C{i % 10}"
            ax.plot(dk.concurrency, dk.simulated, "-", color=color, lw=1, label=f"k = {kk}")
            ax.plot(dk.concurrency, dk.real, "o", mfc="none", ms=4, color=color)
        if d.concurrency.max() / max(d.concurrency.min(), 1) > 8:
            ax.set_xscale("log", base=2)
        else:
            ax.set_xticks(sorted(d.concurrency.unique()))
        ax.set_title(g.replace("ruiz-", ""), fontsize=9)
        ax.set_xlabel("concurrency", fontsize=8)
        ax.set_ylabel("mean ITL (ms per step)", fontsize=8)
        ax.set_ylim(bottom=0)
        ax.tick_params(labelsize=7)
    title = "Server-side speculation: mean ITL, simulated (lines) vs real vLLM (circles)"
    return _finish(fig, axes, len(groups), 8, title, path, "public_sd_itl.png")


def _finish(fig: Any, axes: Any, used: int, ncol: int, title: str, path: Path | str, name: str) -> Path:
    """A grid of panels finished: the unused panels off, one legend for all below, the title."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(lab, h)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    return save(fig, path, name)
