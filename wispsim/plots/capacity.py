"""Figures of capacity sweeps: violation rate against the number of devices with the capacity
knee, and capacity per SLO class as bars with their 95% intervals (SPEC 7).

Both read what ``wispsim sweep`` and ``compare`` write -- capacity.csv and curve_pooled.csv, or
the same tables as DataFrames -- and check them first: a missing file or column, a cell that is
not a finite number, or two rows for one (policy, class) is a one-line
:class:`~wispsim.errors.WispsimError` naming the file. Artists carry gids
(``curve|POLICY|GROUP|CLASS``, ``knee|POLICY|GROUP``, ``capacity|POLICY|CLASS``, ...) so tests can
read what was drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from wispsim.analysis.tables import (
    CAPACITY_COLUMNS,
    CAPACITY_KNOWN,
    POOLED_COLUMNS,
    POOLED_KNOWN,
    check_numeric,
    check_unique,
    is_saturated,
    saturated_mask,
)
from wispsim.errors import ConfigError, WispsimError
from wispsim.plots.figure import figure_path, pyplot, save
from wispsim.plots.labels import class_key, class_title, norm_class
from wispsim.results import Results, check_columns

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _seeds_text(meta: Mapping[str, Any]) -> str:
    """How many seeds a folder's runs used, for titles ("3 seeds", "seed 0"; "" when unknown)."""
    seeds = meta.get("seeds")
    if isinstance(seeds, list) and seeds:
        return f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}"
    if "seed" in meta:
        return f"seed {meta['seed']}"
    return ""


def _grid(n: int) -> tuple[int, int]:
    """Rows and columns for ``n`` panels: one row up to three, then two or three columns."""
    cols = n if n <= 3 else (2 if n == 4 else 3)
    return math.ceil(n / cols), cols


def _capacity_frame(cap: pd.DataFrame, what: str) -> pd.DataFrame:
    """A capacity table checked: finite numbers, class labels normalised, one row per (policy, class)."""
    cap = check_numeric(cap, ("capacity", "ci_low", "ci_high"), what)
    if cap.empty:
        raise WispsimError(f"{what}: no rows")
    cap = cap.assign(**{"class": cap["class"].map(norm_class)})
    check_unique(cap, ("policy", "class"), what, CAPACITY_KNOWN)
    return cap


def _sweep_frames(source: Any) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any], str]:
    """(capacity, pooled curve, meta, name) from a folder, a (capacity, pooled) pair or a result.

    Class labels are normalised on both sides ("4.0" and "4" are one class) and every capacity row
    must have curve rows (the same policy, its class as the curve's group).
    """
    if isinstance(source, str | Path):
        folder = Results.existing(source)
        cap = folder.read_csv("capacity.csv", CAPACITY_COLUMNS)
        pooled = folder.read_csv("curve_pooled.csv", POOLED_COLUMNS)
        what_cap, what_pooled = str(folder / "capacity.csv"), str(folder / "curve_pooled.csv")
        meta, name = folder.meta(), folder.path.name
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
    pooled = check_numeric(pooled, ("devices", *rates), what_pooled, gaps=rates)  # a rate may be undefined
    if pooled.empty:
        raise WispsimError(f"{what_pooled}: no rows")
    pooled = pooled.assign(group=pooled.group.map(norm_class), **{"class": pooled["class"].map(norm_class)})
    check_unique(pooled, ("policy", "group", "class", "devices"), what_pooled, POOLED_KNOWN)
    curves = set(zip(pooled.policy, pooled.group, strict=True))
    for pol, cls in zip(cap.policy, cap["class"], strict=True):
        if (pol, cls) not in curves:
            there = sorted({g for p, g in curves if p == pol}, key=class_key)
            raise WispsimError(
                f"{what_pooled}: no rows for policy {pol}, class {cls} of {what_cap} "
                f"(its classes here: {', '.join(there) or 'none'})"
            )
    return cap, pooled, meta, name


def _knee_label(policy: str, row: Mapping[str, Any]) -> str:
    """The legend entry of a capacity knee: its value and interval, or a saturated lower bound."""
    cap, lo, hi = (f"{float(row[k]):g}" for k in ("capacity", "ci_low", "ci_high"))
    if is_saturated(row):
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
        (g, c) for g in groups for c in sorted(pooled[pooled.group == g]["class"].unique(), key=class_key)
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
        ax.set_title(f"class {class_title(c)}" + (f" in {g}" if mix else ""), fontsize=10)
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
        folder = Results.existing(capacity)
        cap = folder.read_csv("capacity.csv", CAPACITY_COLUMNS)
        what = str(folder / "capacity.csv")
        meta = folder.meta()
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
        # intervals as lists: with one class, matplotlib would convert 1-element arrays to scalars
        # (a NumPy deprecation, a future error)
        bars = ax.bar(
            pos, val, width, color=f"C{i % 10}", label=pol, yerr=[lo.tolist(), hi.tolist()], capsize=3
        )
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
    ax.set_xticks(x, [class_title(c) for c in classes])
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
