"""Figures from results folders: violation curves with capacity knees, capacity bars, compliance
under bursts, and the attribution of violations to queueing or compute (SPEC 7).

Every function reads results only -- the CSV and Parquet files that ``wispsim sweep``, ``compare``
and ``run`` write, or the same tables as DataFrames -- and never runs the simulator, so a figure
can be redrawn from any results folder long after the run. Each writes one figure (matplotlib, Agg;
PNG, or PDF/SVG when the path ends so; an existing folder gets the default file name inside it) and
returns the path written. Each has a ``*_figure`` twin that returns the matplotlib Figure instead,
so what was drawn can be inspected: the artists carry gids (``curve|POLICY|GROUP|CLASS``,
``knee|POLICY|GROUP``, ``capacity|POLICY|CLASS``, ...). A missing folder or file, a table without
the columns a figure needs, a cell that is not a finite number, or an output path that cannot be
written, is a :class:`~wispsim.errors.WispsimError` whose one-line message names the file.

Attribution: a round of a measured response that violated its SLO is *compute-dominant* when its
verify time exceeds ``factor`` x the moving average latency of the ``window`` batches dispatched
before its batch on the same replica (a batch slower than the recent ones: the GPU was the
bottleneck), otherwise *queue-dominant* (the time went to waiting for a slot).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from wispsim.analysis.attribution import COMPUTE, QUEUE, attribute_rounds, violated_rounds
from wispsim.analysis.tables import (
    _CAPACITY_KNOWN,
    _POOLED_KNOWN,
    CAPACITY_COLUMNS,
    POOLED_COLUMNS,
    TIMESERIES_COLUMNS,
    _check_unique,
    _numeric,
    check_columns,
    folder_meta,
    read_csv,
    results_folder,
    saturated_mask,
)
from wispsim.errors import ConfigError, WispsimError
from wispsim.plots.figure import figure_path, pyplot, save

if TYPE_CHECKING:
    from matplotlib.figure import Figure

def _seeds_text(meta: Mapping[str, Any]) -> str:
    seeds = meta.get("seeds")
    if isinstance(seeds, list) and seeds:
        return f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
    if "seed" in meta:
        return f"seed {meta['seed']}"
    return ""


def _class_label(c: str) -> str:
    return c if c == "all" or c.startswith("mix") else f"{c} tok/s"


def _class_key(c: str) -> tuple[int, float, str]:
    try:
        return (0, float(c), c)
    except ValueError:
        return (1, math.inf, c)


def _grid(n: int) -> tuple[int, int]:
    cols = n if n <= 3 else (2 if n == 4 else 3)
    return math.ceil(n / cols), cols


# ------------------------------------------------------------------------------------------
# capacity: violation curves and bars
# ------------------------------------------------------------------------------------------


def _norm_class(c: Any) -> str:
    """A class label as the simulator writes it: "4.0" -> "4", "mix:4.0,8" -> "mix:4,8", "all"."""
    s = str(c).strip()
    if s == "all":
        return s
    if s.startswith("mix:"):
        return "mix:" + ",".join(_norm_class(x) for x in s[4:].split(","))
    try:
        return f"{float(s):g}"
    except ValueError:
        return s


def _capacity_frame(cap: pd.DataFrame, what: str) -> pd.DataFrame:
    """A capacity table checked: finite numbers, class labels normalised, one row per (policy, class)."""
    cap = _numeric(cap, ("capacity", "ci_low", "ci_high"), what)
    if cap.empty:
        raise WispsimError(f"{what}: no rows")
    cap = cap.assign(**{"class": cap["class"].map(_norm_class)})
    _check_unique(cap, ("policy", "class"), what, _CAPACITY_KNOWN)
    return cap


def _sweep_frames(source: Any) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any], str]:
    """(capacity, pooled curve, meta, name) from a folder, a (capacity, pooled) pair or a result.

    Class labels are normalised on both sides ("4.0" and "4" are one class) and every capacity row
    must have curve rows (the same policy, its class as the curve's group).
    """
    if isinstance(source, str | Path):
        folder = results_folder(source)
        cap = read_csv(folder, "capacity.csv", CAPACITY_COLUMNS)
        pooled = read_csv(folder, "curve_pooled.csv", POOLED_COLUMNS)
        what_cap, what_pooled = str(folder / "capacity.csv"), str(folder / "curve_pooled.csv")
        meta, name = folder_meta(folder), folder.name
    else:
        if isinstance(source, tuple) and len(source) == 2:
            cap, pooled = source
        elif hasattr(source, "capacity") and hasattr(source, "pooled"):
            cap, pooled = source.capacity, source.pooled
        else:
            raise ConfigError(
                "violation_curves", "source", "expected a folder, (capacity, pooled) or a sweep result"
            )
        what_cap, what_pooled = "capacity table", "pooled curve"
        cap = check_columns(cap.astype({"class": str, "policy": str}), CAPACITY_COLUMNS, what_cap)
        pooled = pooled.astype({c: str for c in ("policy", "group", "class") if c in pooled})
        pooled = check_columns(pooled, POOLED_COLUMNS, what_pooled)
        meta, name = {}, ""
    cap = _capacity_frame(cap, what_cap)
    rates = [c for c in (*POOLED_COLUMNS[4:], "decision_ci_low", "decision_ci_high") if c in pooled]
    pooled = _numeric(pooled, ("devices", *rates), what_pooled, gaps=rates)  # a rate may be undefined
    if pooled.empty:
        raise WispsimError(f"{what_pooled}: no rows")
    pooled = pooled.assign(group=pooled.group.map(_norm_class), **{"class": pooled["class"].map(_norm_class)})
    _check_unique(pooled, ("policy", "group", "class", "devices"), what_pooled, _POOLED_KNOWN)
    curves = set(zip(pooled.policy, pooled.group, strict=True))
    for pol, cls in zip(cap.policy, cap["class"], strict=True):
        if (pol, cls) not in curves:
            there = sorted({g for p, g in curves if p == pol}, key=_class_key)
            raise WispsimError(
                f"{what_pooled}: no rows for policy {pol}, class {cls} of {what_cap} "
                f"(its classes here: {', '.join(there) or 'none'})"
            )
    return cap, pooled, meta, name


def _knee_label(policy: str, row: Mapping[str, Any]) -> str:
    cap, lo, hi = (f"{float(row[k]):g}" for k in ("capacity", "ci_low", "ci_high"))
    if bool(saturated_mask(pd.DataFrame([dict(row)])).iloc[0]):
        return f"{policy}: >= {cap} (saturated)"
    return f"{policy} knee {cap} [{lo}, {hi}]"


def violation_curves_figure(
    source: Path | str | tuple[pd.DataFrame, pd.DataFrame] | Any,
    epsilon: float | None = None,
    title: str | None = None,
) -> Figure:
    """The figure of :func:`violation_curves`, not written. Its artists' gids: ``curve|P|G|C`` (the
    line: ``violation_rate`` vs ``devices``), ``worst|P|G|C`` (a mix's ``decision_violation``),
    ``band|P|G|C``, ``knee|P|G`` (x = capacity) and ``knee-interval|P|G`` (ci_low to ci_high) for
    policy P, group G (capacity.csv's class) and class C."""
    cap, pooled, meta, name = _sweep_frames(source)
    eps = epsilon if epsilon is not None else meta.get("epsilon")
    policies = list(dict.fromkeys([*cap.policy, *pooled.policy]))
    colors = {p: f"C{i % 10}" for i, p in enumerate(policies)}
    groups = list(dict.fromkeys([*cap["class"], *pooled.group]))
    panels = [
        (g, c) for g in groups for c in sorted(pooled[pooled.group == g]["class"].unique(), key=_class_key)
    ]
    if not panels:
        raise WispsimError(f"{name or 'pooled curve'}: no curve rows match the capacity table's classes")
    plt = pyplot()
    rows, cols = _grid(len(panels))
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.6 * rows + 0.8), sharey=True, squeeze=False)
    for ax, (g, c) in zip(axes.flat, panels, strict=False):
        mix = g != c
        for pol in policies:
            d = pooled[(pooled.policy == pol) & (pooled.group == g) & (pooled["class"] == c)]
            d = d.sort_values("devices")
            if d.empty:
                continue
            col = colors[pol]
            ax.plot(
                d.devices,
                d.violation_rate,
                marker="o",
                ms=3,
                lw=1.4,
                color=col,
                label=pol,
                gid=f"curve|{pol}|{g}|{c}",
            )
            if mix:  # capacity of a mix is decided on its worst class
                ax.plot(
                    d.devices,
                    d.decision_violation,
                    ls=":",
                    lw=1,
                    color=col,
                    label=f"{pol}: worst class (decision_violation)",
                    gid=f"worst|{pol}|{g}|{c}",
                )
            if {"decision_ci_low", "decision_ci_high"} <= set(d.columns):
                ax.fill_between(
                    d.devices,
                    d.decision_ci_low,
                    d.decision_ci_high,
                    color=col,
                    alpha=0.15,
                    lw=0,
                    gid=f"band|{pol}|{g}|{c}",
                )
            knee = cap[(cap.policy == pol) & (cap["class"] == g)]
            if len(knee):
                k = knee.iloc[0]
                ax.axvline(
                    k.capacity, color=col, ls="--", lw=1, label=_knee_label(pol, k), gid=f"knee|{pol}|{g}"
                )
                ax.axvspan(k.ci_low, k.ci_high, color=col, alpha=0.12, lw=0, gid=f"knee-interval|{pol}|{g}")
        if eps is not None:
            ax.axhline(float(eps), color="r", ls="-.", lw=0.8, label=f"epsilon = {float(eps):g}")
        ax.set_title(f"class {_class_label(c)}" + (f" in {g}" if mix else ""), fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("devices (N)" + (" in the mix" if mix else ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    for ax in axes[:, 0]:
        ax.set_ylabel("violation rate (violation_rate)")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if title is None:
        bits = [
            _seeds_text(meta),
            f"epsilon {float(eps):g}" if eps is not None else "",
            meta.get("profile", ""),
        ]
        bits = [str(b) for b in bits if b]
        title = f"Violation rate vs devices: {', '.join(policies)}" + (
            f" ({', '.join(bits)})" if bits else ""
        )
        title += f"\n{name}; band: bootstrap 95% interval; shaded span: capacity interval" if name else ""
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def violation_curves(
    source: Path | str | tuple[pd.DataFrame, pd.DataFrame] | Any,
    path: Path | str,
    epsilon: float | None = None,
    title: str | None = None,
) -> Path:
    """Violation rate vs devices, one panel per class (per class of each mix), one line per policy.

    ``source``: a sweep or compare folder (capacity.csv, curve_pooled.csv, manifest.json), a pair
    of DataFrames (capacity, pooled) or an object with ``.capacity`` and ``.pooled`` (a sweep
    result). Each line is curve_pooled.csv's ``violation_rate`` (the class's violation rate pooled
    over seeds) with the bootstrap 95% interval (``decision_ci_low`` to ``decision_ci_high``) as a
    band; for a mix, that interval is the worst class's, whose rate (``decision_violation``) is the
    dotted line: capacity is decided on it. The knee -- capacity.csv's ``capacity`` -- is a dashed
    vertical line with its 95% interval (``ci_low`` to ``ci_high``) shaded. ``epsilon`` defaults
    to the folder's (manifest.json, then scenario.yaml). Returns the path written (see
    :func:`figure_path`; a folder gets violation_curves.png).
    """
    out = figure_path(path, "violation_curves.png")
    return save(violation_curves_figure(source, epsilon, title), out, "violation_curves.png")


def capacity_bars_figure(capacity: pd.DataFrame | Path | str, title: str | None = None) -> Figure:
    """The figure of :func:`capacity_bars`, not written. Each bar's gid is ``capacity|P|C`` (height:
    the capacity of policy P and class C); its error bars' LineCollection is ``capacity-interval|P``
    (one segment per bar, from ci_low to ci_high)."""
    meta: dict[str, Any] = {}
    if isinstance(capacity, str | Path):
        folder = results_folder(capacity)
        cap = read_csv(folder, "capacity.csv", CAPACITY_COLUMNS)
        what = str(folder / "capacity.csv")
        meta = folder_meta(folder)
    else:
        what = "capacity table"
        cap = check_columns(capacity.astype({"class": str, "policy": str}), CAPACITY_COLUMNS, what)
    cap = _capacity_frame(cap, what)
    policies = list(dict.fromkeys(cap.policy))
    classes = list(dict.fromkeys(cap["class"]))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.9 * len(classes) * len(policies)), 4.4))
    width = min(0.8 / len(policies), 0.35)
    x = np.arange(len(classes))
    for i, pol in enumerate(policies):
        d = cap[cap.policy == pol].set_index("class").reindex(classes)  # NaN: no row for a class
        val = d.capacity.to_numpy(float)
        lo = np.clip(val - d.ci_low.to_numpy(float), 0, None)
        hi = np.clip(d.ci_high.to_numpy(float) - val, 0, None)
        sat = saturated_mask(d).to_numpy()
        pos = x + width * (i - (len(policies) - 1) / 2)
        bars = ax.bar(pos, val, width, color=f"C{i % 10}", label=pol, yerr=[lo, hi], capsize=3)
        if bars.errorbar is not None:
            for coll in bars.errorbar.lines[2]:
                coll.set_gid(f"capacity-interval|{pol}")
        for b, cls, v, up, s in zip(bars, classes, val, hi, sat, strict=True):
            b.set_gid(f"capacity|{pol}|{cls}")
            if not np.isfinite(v):
                continue
            if s:
                b.set_hatch("//")
            ax.annotate(
                f"{'>= ' if s else ''}{v:.0f}",
                (b.get_x() + b.get_width() / 2, v + (up if np.isfinite(up) else 0.0)),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(x, [_class_label(c) for c in classes])
    ax.set_xlabel("SLO class")
    ax.set_ylabel("devices at capacity")
    top = float(np.nanmax(cap[["capacity", "ci_high"]].to_numpy(float)))
    ax.set_ylim(0, max(top, 1.0) * 1.25)  # room for the labels and the legend
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", ncol=min(len(policies), 4))
    if title is None:
        bits = [str(b) for b in (_seeds_text(meta), meta.get("profile", "")) if b]
        title = "Capacity per SLO class, 95% interval" + (f"\n{', '.join(bits)}" if bits else "")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def capacity_bars(capacity: pd.DataFrame | Path | str, path: Path | str, title: str | None = None) -> Path:
    """Grouped bars: capacity per class (x) and policy (bar), the 95% interval as error bars.

    ``capacity`` is a capacity table (capacity.csv's columns) or a folder holding capacity.csv;
    it must have one row per (policy, class). A saturated search (capacity is only a lower bound)
    is hatched and labelled ">= N". Returns the path written (a folder gets capacity.png).
    """
    out = figure_path(path, "capacity.png")
    return save(capacity_bars_figure(capacity, title), out, "capacity.png")


# ------------------------------------------------------------------------------------------
# bursty runs: compliance over time
# ------------------------------------------------------------------------------------------


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
        folder = results_folder(f)
        ts = read_csv(folder, "timeseries.csv", TIMESERIES_COLUMNS)
        # an empty compliance cell: nothing was decided in that window (a gap in the line)
        ts = _numeric(ts, ("t", "compliance"), str(folder / "timeseries.csv"), gaps=("compliance",))
        series[label] = ts.assign(**{"class": ts["class"].map(_norm_class)})
        metas[label] = folder_meta(folder)
        if target is None and (folder / "server_timeseries.csv").is_file():
            srv = read_csv(folder, "server_timeseries.csv", ("t",))
            if "target" in srv:
                target = _numeric(srv, ("t", "target"), str(folder / "server_timeseries.csv"))
        if peaks is None and (folder / "bursts.csv").is_file():
            b = read_csv(folder, "bursts.csv", ("peak_t", "peak_value"))
            b = _numeric(b, ("peak_t", "peak_value"), str(folder / "bursts.csv"))
            peaks = b.drop_duplicates("peak_t")[["peak_t", "peak_value"]]
    known = sorted({c for s in series.values() for c in s["class"]}, key=_class_key)
    if classes is None:
        panels = known
    else:
        panels = [_norm_class(c) for c in classes]
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
        ax.set_ylabel(f"{_class_label(cls)}\ncompliance", fontsize=8)
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


# ------------------------------------------------------------------------------------------
# attribution of violations
# ------------------------------------------------------------------------------------------


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
