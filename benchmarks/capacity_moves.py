"""Did a rerun of the shipped studies move any capacity? And how far is the fluid estimate off?

For every ``capacity.csv`` under ``experiments/data/`` that a git revision (``--before``, the
tree the studies were last run on) also holds, this prints each (policy, class) capacity before
and after, side by side with the earlier 95% interval, and says whether the new capacity lies
inside it. Then, for the capacity tables that carry the fluid model's ``estimate``, how far it
lands from the simulated capacity, per policy and per resource that binds in it.

    python benchmarks/capacity_moves.py [--before 478e6eb] [--all] [--estimate-now]

``--all`` prints every row, not only the moves outside the interval. ``--estimate-now`` prices
the estimates with this tree's fluid model (from each table's ``scenario.yaml`` and the row's
policy preset and class; rows of arms that are not a preset are left out) instead of reading
the ones the studies stored: how a change to the estimate lands before the studies are rerun.
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "experiments" / "data"


def _at(rev: str, path: Path) -> pd.DataFrame | None:
    rel = path.relative_to(ROOT).as_posix()
    got = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], capture_output=True)
    if got.returncode != 0:
        return None
    return pd.read_csv(io.BytesIO(got.stdout))


def estimate_now(table: pd.DataFrame, folder: Path) -> pd.DataFrame:
    """``table``'s rows whose policy is a preset, their ``estimate`` and ``estimate_binds`` priced
    by this tree's fluid model on the folder's scenario."""
    from wispsim.config.schema import POLICIES
    from wispsim.sim.scenarios import load_scenario
    from wispsim.study.capacity import estimate_group, groups_for

    if not (folder / "scenario.yaml").exists():
        return table.iloc[0:0]
    base = load_scenario(folder / "scenario.yaml")
    keep = []
    for i, r in table.iterrows():
        if r.policy not in POLICIES:
            continue
        text = str(r["class"])
        classes = tuple(float(c) for c in text.removeprefix("mix:").split(","))
        group = groups_for(classes, "shared" if text.startswith("mix:") else "separate")[0]
        sc = base.with_policy(r.policy).with_devices(base.devices.count, classes)
        e = estimate_group(sc, group, base.epsilon)
        table.loc[i, ["estimate", "estimate_binds"]] = [e.devices, e.binds]
        keep.append(i)
    return table.loc[keep]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="478e6eb", help="git revision of the earlier results")
    ap.add_argument("--all", action="store_true", help="print every row")
    ap.add_argument("--estimate-now", action="store_true", help="this tree's estimates, not the stored")
    args = ap.parse_args()
    rows, est = [], []
    for path in sorted(DATA.rglob("capacity.csv")):
        new = pd.read_csv(path)
        if "estimate" in new:
            table = new.assign(table=path.parent.relative_to(DATA).as_posix())
            est.append(estimate_now(table, path.parent) if args.estimate_now else table)
        old = _at(args.before, path)
        if old is None or old.empty or new.empty:
            continue
        need = {"policy", "capacity", "ci_low", "ci_high"}
        if not (need <= set(new) and need <= set(old)):
            continue
        key = [c for c in ("policy", "class", "acceptance", "group") if c in new and c in old]
        new["class"], old["class"] = new["class"].astype(str), old["class"].astype(str)
        m = new.merge(old, on=key, suffixes=("", "_before"))
        for _, r in m.iterrows():
            inside = r.ci_low_before <= r.capacity <= r.ci_high_before
            rows.append({
                "table": path.parent.relative_to(DATA).as_posix(),
                **{k: r[k] for k in key},
                "before": f"{int(r.capacity_before)} [{int(r.ci_low_before)}, {int(r.ci_high_before)}]",
                "after": f"{int(r.capacity)} [{int(r.ci_low)}, {int(r.ci_high)}]",
                "evaluated": f"{r.get('evaluated_before', '?')} -> {r.get('evaluated', '?')}",
                "inside": bool(inside),
                "move_pct": 100.0 * (r.capacity - r.capacity_before) / max(r.capacity_before, 1),
            })  # fmt: skip
    table = pd.DataFrame(rows)
    if table.empty:
        print(f"no capacity table both here and at {args.before}")
        return
    with pd.option_context("display.width", 200, "display.max_rows", 1000, "display.max_colwidth", 40):
        shown = table if args.all else table[~table.inside]
        print(shown.to_string(index=False, float_format=lambda x: f"{x:+.1f}"))
    n, inside = len(table), int(table.inside.sum())
    print(f"\n{inside} of {n} capacities inside the earlier 95% interval; |move| median "
          f"{table.move_pct.abs().median():.1f}%, max {table.move_pct.abs().max():.1f}%")  # fmt: skip
    for t, g in table.groupby("table", sort=False):
        print(f"  {t}: {int(g.inside.sum())}/{len(g)} inside")
    if est:
        e = pd.concat(est, ignore_index=True)
        e = e[(e.capacity > 0) & ~e.saturated.astype(bool)]
        e = e.assign(err=100.0 * (e.estimate - e.capacity) / e.capacity)
        print(f"\nfluid estimate against the simulated capacity ({len(e)} capacities, not saturated): "
              f"median {e.err.median():+.0f}%, |error| median {e.err.abs().median():.0f}%, "
              f"within 25%: {int((e.err.abs() <= 25).sum())}")  # fmt: skip
        for by in ("policy", "estimate_binds"):
            g = e.groupby(by).err
            q = {"n": g.size(), "median %": g.median(), "p10 %": g.quantile(0.1), "p90 %": g.quantile(0.9)}
            print(pd.DataFrame(q).round(0).to_string())


if __name__ == "__main__":
    main()
