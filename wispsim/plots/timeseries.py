"""The compliance-over-time figure of a run: load, SLO compliance per class, queue and utilization."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from wispsim.analysis.timeseries import trace_peaks
from wispsim.plots.figure import pyplot, save
from wispsim.sim.arrivals import load_arrival_trace
from wispsim.sim.records import SimResult


def plot_timeseries(
    compliance: pd.DataFrame,
    server: pd.DataFrame,
    peaks: pd.DataFrame | None,
    threshold: float,
    title: str,
    path: Path,
) -> Path:
    """Three panels: load, compliance per class, queue and utilization."""
    plt = pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True, height_ratios=[1, 1.4, 1])
    ax = axes[0]
    if "target" in server:
        ax.step(server.t, server.target, where="post", color="0.6", label="trace target")
    ax.plot(server.t, server.in_flight, color="k", lw=1, label="responses in flight")
    ax.set_ylabel("concurrent")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[1]
    for cls, g in compliance.groupby("class", dropna=False, sort=True):
        label = "all" if isinstance(cls, float) and math.isnan(cls) else f"{cls:g} tok/s"
        style = {"color": "k", "lw": 1.5} if label == "all" else {"lw": 1}
        ax.plot(g.t, g.compliance, label=label, **style)
    ax.axhline(threshold, color="r", ls="--", lw=0.8, label=f"threshold {threshold:g}")
    ax.set_ylabel("SLO compliance")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(loc="lower left", fontsize=8, ncol=3)
    ax = axes[2]
    ax.plot(server.t, server.queue_len_mean, color="tab:blue", lw=1, label="queue length (mean)")
    ax.set_ylabel("queue length", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(server.t, server.gpu_utilization, color="tab:orange", lw=1)
    ax2.set_ylabel("GPU utilization", color="tab:orange")
    ax2.set_ylim(0, 1.05)
    ax.set_xlabel("time (s)")
    if peaks is not None:
        for pt in peaks.peak_t:
            for a in axes:
                a.axvline(pt, color="0.8", lw=0.8, zorder=0)
    fig.suptitle(title)
    fig.tight_layout()
    return save(fig, path, path.name)


def compliance_figure(
    result: SimResult, compliance: pd.DataFrame, server: pd.DataFrame, window_s: float, path: Path
) -> Path:
    """:func:`plot_timeseries` of a run's tables, with the trace's peaks marked."""
    sc = result.scenario
    trace = (
        load_arrival_trace(sc.arrivals.trace)
        if sc.arrivals.process == "trace" and sc.arrivals.trace
        else None
    )
    peaks = trace_peaks(trace, sc.arrivals.scale) if trace is not None else None
    title = f"{sc.policy}: SLO compliance over time (trailing {window_s:g} s window), seed {result.seed}" + (
        f", arrivals {Path(sc.arrivals.trace).name}" if trace is not None and sc.arrivals.trace else ""
    )
    return plot_timeseries(compliance, server, peaks, 1.0 - sc.epsilon, title, path)
