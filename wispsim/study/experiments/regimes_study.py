"""Where SLO-aware batching and the rejection predictor pay (issue 46): each regime is a scenario
variant chosen for a mechanism (passes that are compute-bound, cold prefills among short rounds,
memory that does not bind, think time between responses, loose classes that can wait, slow
drafting); in each, every SLO class shares one verifier and the policies' capacity for the whole
mix (every class within epsilon) is searched, so WISP's scheduler is set against FCFS on the same
devices and the predictor (``wisp``) against fixed drafting (``wisp-fixed``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd

from wispsim.config import Scenario
from wispsim.study.experiments.checks import entries, mapping, numbers
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, seeds
from wispsim.study.experiments.sweeps import capacity_rows, group_curve, rows_at, sweeps
from wispsim.study.experiments.targets import with_profile


@STUDIES.register("regimes")
def study_regimes(ctx: Context) -> Section:
    """Mix capacity per regime and policy, with the ratios the regime was chosen to move."""
    spec = ctx.spec
    src = f"experiments/{ctx.name}.yaml"
    policies = [str(p) for p in spec.get("policies", ["wisp", "fcfs", "wisp-fixed"])]
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    plans: dict[tuple[float, ...], dict[Path, dict[str, Scenario]]] = {}
    about: dict[Path, tuple[str, str, tuple[float, ...]]] = {}
    for i, r in enumerate(entries(src, "regimes", spec.get("regimes"), {"name", "profile", "why"})):
        # a regime may keep its own classes
        mine = tuple(numbers(src, f"regimes[{i}].classes", r.get("classes", classes)))
        folder = ctx.out / str(r["name"])
        base = with_profile(
            ctx.scenario(**mapping(src, f"regimes[{i}].set", r.get("set"))), str(r["profile"])
        )
        plans.setdefault(mine, {})[folder] = {p: base.with_policy(p, src) for p in policies}
        about[folder] = (str(r["name"]), str(r["why"]), mine)
    sec = Section(spec.get("title", "Where SLO-aware batching and the predictor pay"))
    light = tuple(int(n) for n in numbers(src, "light", spec.get("light", [16]), integer=True))
    t0 = time.perf_counter()
    res = {}
    for mine, plan in plans.items():  # regimes that share their classes are searched together
        res.update(sweeps(ctx, plan, list(mine), "shared", also=light))
    sec.facts["wall_s_sweeps"] = time.perf_counter() - t0
    rows = []
    for folder, r in res.items():
        name, why, own = about[folder]
        for row in capacity_rows(r):
            pol, n = row["policy"], row["capacity"]
            whole = group_curve(r.curve, pol, row["class"])
            per = r.curve[(r.curve.policy == pol) & (r.curve["class"].astype(str) != "all")]
            at_t = rows_at(per[per["class"].astype(float) == max(own)], n)
            rows.append(
                {
                    "regime": name,
                    "classes": ",".join(f"{c:g}" for c in own),
                    "why": why,
                    **row,
                    "tight_violation": float(at_t.violation_rate.mean()) if len(at_t) else math.nan,
                    **{f"goodput_at_{m}": _mean(whole, m) for m in light},
                }
            )
    table = pd.DataFrame(rows)
    table.to_csv(ctx.out / "regimes.csv", index=False)
    sec.body += [
        "Every class of a regime (`classes`, tok/s) shares one verifier; capacity of the "
        f"whole mix (every class within epsilon) in devices [95% interval], {len(seeds(spec))} seed(s); "
        "`binds` is what binds the simulated runs at that capacity.",
        "",
    ]
    sec.body += md_table(_wide(table, policies, light))
    sec.body += ["", "What each regime tests:", ""]
    sec.body += [f"- `{name}`: {why}" for name, why, _ in about.values()]
    return sec


def _mean(curve: pd.DataFrame, n: int) -> float:
    at = curve[curve.devices == n]
    return float(at.goodput_tps.mean()) if len(at) else math.nan


def _wide(table: pd.DataFrame, policies: list[str], light: tuple[int, ...]) -> pd.DataFrame:
    out = []
    for name, g in table.groupby("regime", sort=False):
        row: dict[str, object] = {"regime": name, "classes": g.classes.iloc[0]}
        cap = {}
        for p in policies:
            hit = g[g.policy == p]
            if len(hit):
                row[p] = f"{hit.cell.iloc[0]} {hit.binds.iloc[0]}"
                if not bool(hit.saturated.iloc[0]):  # a lower bound has no ratio
                    cap[p] = int(hit.capacity.iloc[0])
        for a, b in (("wisp", "fcfs"), ("wisp", "wisp-fixed")):
            if a in cap and b in cap and cap[b] > 0:
                row[f"{a}/{b}"] = f"{cap[a] / cap[b]:.2f}"
        for n in light:  # the predictor's goodput against fixed drafting at one light load
            good = {
                p: float(g[g.policy == p][f"goodput_at_{n}"].iloc[0])
                for p in policies
                if (g.policy == p).any()
            }
            if good.get("wisp-fixed", 0) > 0 and "wisp" in good:
                row[f"goodput wisp/wisp-fixed at N={n}"] = f"{good['wisp'] / good['wisp-fixed']:.2f}"
        out.append(row)
    return pd.DataFrame(out)
