"""The WISP paper's tables beside ours (issue 46): its capacity per SLO class, and its headline
ratios, under the same settings (one A100, Qwen3-32B, classes 2/4/6/8), with our simulator run on
each candidate mechanism for what differs.

``published`` holds the paper's figures (with their source); ``baselines`` are named scenario
variants (a profile and ``set`` fields) each run under the policies it lists, so that each
candidate (the paper's fitted coefficients pricing the steps, request-level static batching, ...)
is one row set beside the paper's. Capacities go through the study's stored points.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.config import Scenario
from wispsim.errors import ConfigError
from wispsim.study.experiments.checks import entries, mapping, numbers
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, seeds
from wispsim.study.experiments.sweeps import capacity_rows, sweeps
from wispsim.study.experiments.targets import with_profile


@STUDIES.register("paper")
def study_paper(ctx: Context) -> Section:
    """Our capacity under each baseline beside the paper's, per policy and class."""
    spec = ctx.spec
    src = f"experiments/{ctx.name}.yaml"
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    pub = mapping(src, "published", spec.get("published"))
    paper_cap = {
        str(p): numbers(src, f"published.capacity.{p}", v)
        for p, v in mapping(src, "published.capacity", pub.get("capacity")).items()
    }
    for p, v in paper_cap.items():
        if len(v) != len(classes):
            raise ConfigError(
                src, f"published.capacity.{p}", f"needs one figure per class {classes}, got {v}"
            )
    plan: dict[Path, dict[str, Scenario]] = {}
    names: dict[Path, str] = {}
    for i, b in enumerate(entries(src, "baselines", spec.get("baselines"), {"name", "profile", "policies"})):
        folder = ctx.out / str(b["name"])
        names[folder] = str(b["name"])
        sets = mapping(src, f"baselines[{i}].set", b.get("set"))
        base = with_profile(ctx.scenario(**sets), str(b["profile"]))
        plan[folder] = {str(p): base.with_policy(str(p), src) for p in b["policies"]}
    heads = list(pub.get("headline") or [])
    _check_headlines(heads, {(str(p), n) for f, n in names.items() for p in plan[f]}, src)
    sec = Section(spec.get("title", "The paper side by side"))
    t0 = time.perf_counter()
    res = sweeps(ctx, plan, classes, "separate")
    sec.facts["wall_s_sweeps"] = time.perf_counter() - t0
    rows = []
    for folder, r in res.items():
        rows += [{"baseline": names[folder], **row} for row in capacity_rows(r)]
    ours = pd.DataFrame(rows)
    ours.to_csv(ctx.out / "ours.csv", index=False)
    labels = [f"{c:g}" for c in classes]
    sec.body += [
        f"The paper: {pub.get('source', '(no source given)')}. Ours: {len(seeds(spec))} seed(s) per point; "
        "`binds` is what binds our simulated runs at capacity.",
        "",
        "### Capacity, the paper's and ours under each baseline",
        "",
    ]
    sec.body += md_table(_capacity_table(ours, paper_cap, labels))
    sec.body += [
        "",
        "### Committed tokens per second at capacity (devices x class for the paper, goodput for ours)",
        "",
    ]
    sec.body += md_table(_throughput_table(ours, paper_cap, classes, labels), "{:.0f}")
    if heads:
        sec.body += ["", "### The paper's headline ratios against ours", ""]
        sec.body += md_table(_headlines(ours, heads))
    return sec


def _capacity_table(ours: pd.DataFrame, paper: dict[str, list[float]], labels: list[str]) -> pd.DataFrame:
    rows = []
    for pol, caps in paper.items():
        rows.append(
            {"policy": pol, "source": "paper", **{c: f"{v:g}" for c, v in zip(labels, caps, strict=True)}}
        )
        for b, g in ours[ours.policy == pol].groupby("baseline", sort=False):
            cells = {}
            for c, v in zip(labels, caps, strict=True):
                hit = g[g["class"] == c]
                if not len(hit):
                    cells[c] = "-"
                    continue
                ratio = "" if bool(hit.saturated.iloc[0]) else f" ({hit.capacity.iloc[0] / v:.2f}x)"
                cells[c] = f"{hit.cell.iloc[0]} {hit.binds.iloc[0]}{ratio}"
            rows.append({"policy": pol, "source": f"ours: {b}", **cells})
    for pol, g in ours[~ours.policy.isin(list(paper))].groupby("policy", sort=False):
        for b, h in g.groupby("baseline", sort=False):
            cells = {
                c: (
                    f"{h[h['class'] == c].cell.iloc[0]} {h[h['class'] == c].binds.iloc[0]}"
                    if (h["class"] == c).any()
                    else "-"
                )
                for c in labels
            }
            rows.append({"policy": pol, "source": f"ours: {b}", **cells})
    return pd.DataFrame(rows)


def _throughput_table(
    ours: pd.DataFrame, paper: dict[str, list[float]], classes: list[float], labels: list[str]
) -> pd.DataFrame:
    rows = []
    for pol, caps in paper.items():
        rows.append(
            {
                "policy": pol,
                "source": "paper",
                **{c: v * k for c, v, k in zip(labels, caps, classes, strict=True)},
            }
        )
    for (pol, b), g in ours.groupby(["policy", "baseline"], sort=False):
        rows.append(
            {
                "policy": pol,
                "source": f"ours: {b}",
                **{
                    c: float(g[g["class"] == c].goodput_tps.iloc[0]) if (g["class"] == c).any() else math.nan
                    for c in labels
                },
            }
        )
    return pd.DataFrame(rows).sort_values("policy", kind="stable")


def _check_headlines(heads: list[Any], runs: set[tuple[str, str]], src: str) -> None:
    """Each headline entry: metric capacity or goodput, the paper's figure (a number), and the
    (policy, baseline) of our numerator and denominator, each a pair the study runs."""
    for i, h in enumerate(heads):
        where = f"published.headline[{i}]"
        if not isinstance(h, dict) or not {"metric", "paper", "num", "den"} <= set(h):
            raise ConfigError(src, where, "needs metric, paper, num [policy, baseline] and den")
        if h["metric"] not in ("capacity", "goodput"):
            raise ConfigError(src, f"{where}.metric", f"capacity or goodput, got {h['metric']!r}")
        if isinstance(h["paper"], bool) or not isinstance(h["paper"], int | float):
            raise ConfigError(src, f"{where}.paper", f"must be a number, got {h['paper']!r}")
        for side in ("num", "den"):
            pair = h[side]
            if not isinstance(pair, list) or len(pair) != 2 or (str(pair[0]), str(pair[1])) not in runs:
                known = ", ".join(f"[{p}, {b}]" for p, b in sorted(runs))
                raise ConfigError(
                    src, f"{where}.{side}", f"must be a [policy, baseline] the study runs ({known})"
                )


def _headlines(ours: pd.DataFrame, heads: list[Any]) -> pd.DataFrame:
    """The paper's "up to" ratios (the largest over classes) beside ours: each entry names the
    metric (capacity or goodput), the paper's figure, and the (policy, baseline) of our numerator
    and denominator."""
    rows = []
    measured = ours[~ours.saturated]  # a capacity at the search's ceiling is a lower bound: no ratio
    for h in heads:
        col = {"capacity": "capacity", "goodput": "goodput_tps"}[str(h["metric"])]
        (pn, bn), (pd_, bd) = h["num"], h["den"]
        a = measured[(measured.policy == pn) & (measured.baseline == bn)].set_index("class")[col]
        d = measured[(measured.policy == pd_) & (measured.baseline == bd)].set_index("class")[col]
        both = [(c, float(a[c]) / float(d[c])) for c in a.index if c in d.index and float(d[c]) > 0]
        best = max(both, key=lambda x: x[1]) if both else None
        rows.append(
            {
                "ratio": f"{h['metric']}: {pn} ({bn}) / {pd_} ({bd})",
                "paper (up to)": f"{float(h['paper']):.2f}x",
                "ours (up to)": f"{best[1]:.2f}x at {best[0]} tok/s" if best else "-",
                "ours per class": ", ".join(f"{r:.2f}" for _, r in both),
            }
        )
    return pd.DataFrame(rows)
