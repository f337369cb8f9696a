"""The scale validation's report section: the real deployment at tens of devices (issue 30).

Like the first validation study, the real side runs on a real engine (``wispsim validate``,
half a day of servers); the commands in ``experiments/validation-scale.yaml`` store it under
``experiments/data/validation-scale/``, and that folder's ``summarize.py`` pools the seeds and
bootstraps the real side's intervals (over devices within seeds) into ``errors.csv``,
``capacity.csv``, ``wisp_vs_fcfs.csv``, ``drift.csv`` and ``violation_vs_n.png``. This study
reads those and writes the tables; a missing file is a one-line error naming the commands.
"""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd

from wispsim.errors import ConfigError
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, experiments_dir

FILES = ("errors.csv", "capacity.csv", "wisp_vs_fcfs.csv")
VARIANTS = ("recorded", "deployed", "before", "own")  # the simulated sides summarize.py writes
LABELS = {
    "violation_rate": "violation",
    "goodput_tps": "goodput",
    "speed_p10": "speed p10",
    "speed_p50": "speed p50",
    "queue_p50_ms": "queue p50",
    "queue_p90_ms": "queue p90",
    "verify_p50_ms": "verify p50",
    "verify_p90_ms": "verify p90",
    "mean_batch_size": "batch size",
    "cold_round_share": "cold share",
}


def _num(x: float, digits: int = 3) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.{digits}g}"


def _interval(v: float, lo: float, hi: float) -> str:
    return f"{_num(v)} [{_num(lo)}, {_num(hi)}]"


def _sim(v: float, miss: object) -> str:
    return _num(v) + (" (miss)" if miss is True or miss == "True" else "")


def violation_table(err: pd.DataFrame) -> pd.DataFrame:
    """Per regime, policy and N: the real violation rate with its interval and both simulated."""
    v = err[err.metric == "violation_rate"]
    rows = []
    for (regime, policy, n), g in v.groupby(["regime", "policy", "devices"], sort=False):
        first = g.iloc[0]
        row = {
            "regime": regime,
            "policy": policy,
            "N": int(n),
            "seeds": int(first.seeds),
            "real [95%]": _interval(first.real, first.real_lo, first.real_hi),
        }
        for r in g.itertuples(index=False):
            row[f"sim, {r.variant}"] = _sim(r.sim, r.miss)
        rows.append(row)
    return pd.DataFrame(rows)


def error_summary(err: pd.DataFrame) -> pd.DataFrame:
    """Per figure and simulated side: points, misses, and the relative error's mean and spread."""
    rows = []
    for (metric, variant), g in err.groupby(["metric", "variant"], sort=False):
        g = g.dropna(subset=["sim", "real"])
        if not len(g):
            continue
        judged = g.dropna(subset=["miss"])
        misses = judged.miss.astype(str).eq("True").sum()
        if metric == "violation_rate":
            e = g.sim - g.real
            kind = "abs"
        else:
            ok = g.real.abs() > 0
            e = (g.sim[ok] / g.real[ok] - 1) * 100
            kind = "%"
        rows.append(
            {
                "figure": LABELS.get(metric, metric),
                "simulated side": variant,
                "points": len(g),
                "misses": f"{misses} / {len(judged)}",
                "target": _num(g.target.iloc[0]) if g.target.iloc[0] else "-",
                "mean error": f"{_num(float(e.mean()))} {kind}",
                "median abs error": f"{_num(float(e.abs().median()))} {kind}",
                "max abs error": f"{_num(float(e.abs().max()))} {kind}",
            }
        )
    return pd.DataFrame(rows)


def _capacity(v: float, miss: object, top: float) -> str:
    """A simulated capacity; at the grid's top N it is a lower bound."""
    return f">= {top:.0f}" if v == top else _sim(v, miss)


def capacity_table(cap: pd.DataFrame) -> pd.DataFrame:
    """Capacity per regime and policy; one at the grid's top N is a lower bound (shown as >= N)."""
    rows = []
    for r in cap.itertuples(index=False):
        top = float(str(r.grid).split("/")[-1])
        rows.append(
            {
                "regime": r.regime,
                "policy": r.policy,
                "grid": r.grid,
                "real [95%]": f">= {top:.0f}"
                if r.capacity_real == top
                else _interval(r.capacity_real, r.real_lo, r.real_hi),
                **{
                    f"sim, {v}": _capacity(getattr(r, f"capacity_{v}"), getattr(r, f"miss_{v}"), top)
                    for v in VARIANTS
                    if hasattr(r, f"capacity_{v}")
                },
            }
        )
    return pd.DataFrame(rows)


def difference_table(diff: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for r in diff.itertuples(index=False):
        rows.append(
            {
                "regime": r.regime,
                "N": int(r.devices),
                "real [95%]": _interval(r.real, r.real_lo, r.real_hi),
                **{f"sim, {v}": _num(getattr(r, f"sim_{v}")) for v in VARIANTS if hasattr(r, f"sim_{v}")},
            }
        )
    return pd.DataFrame(rows)


@STUDIES.register("validation-scale")
def study_validation_scale(ctx: Context) -> Section:
    """Real vs simulated at tens of devices, from the stored, summarized validation."""
    sec = Section(ctx.spec.get("title", "The real deployment at the scale where scheduling matters"))
    base = experiments_dir() / "data" / "validation-scale"
    cmds = [str(c) for c in ctx.spec.get("commands", [])]
    missing = [f for f in FILES if not (base / f).is_file()]
    if missing:
        raise ConfigError(
            "experiments/validation-scale.yaml",
            "commands",
            f"{base} has no {', '.join(missing)} yet; run: {'; '.join(cmds)}",
        )
    err, cap, diff = (pd.read_csv(base / f) for f in FILES)
    sec.body += ["Produced by (in this order):", "", "```", *cmds, "```", ""]
    sec.body += [
        "**Violation rate**, real (mean over seeds; 95% bootstrap interval over devices within "
        "seeds) and simulated; a miss lies outside the real interval widened by 0.05:",
        "",
    ]
    sec.body += [*md_table(violation_table(err)), ""]
    fig = base / "violation_vs_n.png"
    if fig.is_file():
        dst = ctx.out / "violation_vs_n.png"
        if dst.resolve() != fig.resolve():
            shutil.copyfile(fig, dst)
        sec.body += [f"![violation rate vs N, real and simulated]({ctx.rel(dst)})", ""]
    sec.body += [
        "**Every figure** (`errors.csv`: each point's real value, interval and simulated "
        "values): misses against the real interval widened by the target (violation 0.05; "
        "goodput and verify p50 5%; the others none), and the error (simulated minus real; "
        "relative for all but violation):",
        "",
    ]
    sec.body += [*md_table(error_summary(err)), ""]
    sec.body += [
        "**Capacity** (largest N within epsilon = 0.05, linear between grid points; a miss "
        "lies outside the real interval widened by 10%):",
        "",
    ]
    sec.body += [*md_table(capacity_table(cap)), ""]
    sec.body += ["**WISP minus FCFS**, violation rate at the same N (negative: WISP better):", ""]
    sec.body += [*md_table(difference_table(diff)), ""]
    drift = base / "drift.csv"
    if drift.is_file():
        sec.body += ["**The host's drift**: the same point (wisp, compute, N = 32, seed 0) run again:", ""]
        sec.body += [*md_table(pd.read_csv(drift)), ""]
    sec.facts["data"] = str(base.relative_to(experiments_dir().parent))
    return sec
