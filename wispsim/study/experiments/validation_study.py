"""The validation study's report section: the simulator against a real vLLM deployment.

The real side runs on a real engine (``wispsim validate``, in the ``serve`` layer above this one);
this study reads what those commands stored under ``experiments/data/validation/`` -- one folder
per variant of the simulated side, all over the same real runs -- and writes the error tables,
the capacity comparison and the figures, the way the ``estimator`` study reads the shipped
profiles. The spec lists the commands that produced each folder; a missing folder is a one-line
error naming them.
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pandas as pd

from wispsim.errors import ConfigError
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, experiments_dir

SHOWN = (
    ("violation_rate", "viol"),
    ("goodput_tps", "goodput"),
    ("speed_p50", "speed p50"),
    ("queue_p50_ms", "queue p50 ms"),
    ("verify_p50_ms", "verify p50 ms"),
    ("verify_p90_ms", "verify p90 ms"),
    ("mean_batch_size", "batch"),
    ("cold_round_share", "cold"),
)


def _variant(ctx: Context, name: str, folder: str) -> tuple[pd.DataFrame, pd.DataFrame, Any]:
    # ``data``: the folder (under experiments/) holding the variants' validate folders
    base = experiments_dir() / str(ctx.spec.get("data", "data/validation")) / folder
    comp, cap = base / "comparison.csv", base / "capacity.csv"
    if not comp.is_file() or not cap.is_file():
        cmds = "; ".join(str(c) for c in ctx.spec.get("commands", []))
        raise ConfigError(
            f"experiments/{ctx.name}.yaml", f"variants.{name}", f"{base} holds no validation yet; run: {cmds}"
        )
    return pd.read_csv(comp), pd.read_csv(cap), base


def error_summary(comp: pd.DataFrame, cap: pd.DataFrame) -> pd.DataFrame:
    """Per regime and policy: the errors the issue's targets are stated in."""
    rows = []
    for (regime, policy), g in comp.groupby(["regime", "policy"], sort=False):
        by = {m: g[g.metric == m] for m in ("violation_rate", "goodput_tps", "verify_p50_ms")}
        v, gp, vp = by["violation_rate"], by["goodput_tps"], by["verify_p50_ms"]
        c = cap[(cap.regime == regime) & (cap.policy == policy)]
        rows.append(
            {
                "regime": regime,
                "policy": policy,
                "N": ",".join(str(n) for n in sorted(g.devices.unique())),
                "viol |err| max": float(np.nanmax(np.abs(v.error))) if len(v) else np.nan,
                "viol |err| mean": float(np.nanmean(np.abs(v.error))) if len(v) else np.nan,
                "goodput err % mean": float(np.nanmean(gp.rel_error) * 100) if len(gp) else np.nan,
                "goodput |err| % max": float(np.nanmax(np.abs(gp.rel_error)) * 100) if len(gp) else np.nan,
                "verify p50 err % mean": float(np.nanmean(vp.rel_error) * 100)
                if len(vp) and vp.rel_error.notna().any()
                else np.nan,
                "capacity real": int(c.capacity_real.iloc[0]) if len(c) else -1,
                "capacity sim": int(c.capacity_sim.iloc[0]) if len(c) else -1,
            }
        )
    return pd.DataFrame(rows)


def side_by_side(comp: pd.DataFrame) -> pd.DataFrame:
    """Per regime, policy and N: real / simulated of the figures in :data:`SHOWN`."""
    wide = comp.pivot_table(
        index=["regime", "policy", "devices"], columns="metric", values=["real", "sim"], sort=False
    )
    out = wide.index.to_frame(index=False)
    for metric, label in SHOWN:
        if ("real", metric) in wide.columns:
            out[label] = [
                f"{_fmt(r)} / {_fmt(s)}"
                for r, s in zip(wide[("real", metric)], wide[("sim", metric)], strict=True)
            ]
    return out


def replay_summary(base: Any) -> pd.DataFrame:
    """Each real log replayed under its own policy (``wispsim replay``; the validation's
    ``replay.csv``): recorded vs simulated, the ``all`` row of each point."""
    path = base / "replay.csv"
    if not path.is_file():
        return pd.DataFrame()
    t = pd.read_csv(path)
    if not len(t):
        return pd.DataFrame()
    cls = t["class"].astype(str)
    multi = t.assign(_all=cls == "all").groupby(["regime", "policy", "devices"])["_all"].transform("any")
    t = t[(cls == "all") | ~multi]
    rows = [
        {
            "regime": r.regime,
            "policy": r.policy,
            "N": int(r.devices),
            "viol": f"{_fmt(r.violation_recorded)} / {_fmt(r.violation_simulated)}",
            "queue p50 ms": f"{_fmt(r.queue_p50_ms_recorded)} / {_fmt(r.queue_p50_ms_simulated)}",
            "verify p50 ms": f"{_fmt(r.verify_p50_ms_recorded)} / {_fmt(r.verify_p50_ms_simulated)}",
            "verify p90 ms": f"{_fmt(r.verify_p90_ms_recorded)} / {_fmt(r.verify_p90_ms_simulated)}",
        }
        for r in t.itertuples(index=False)
    ]
    return pd.DataFrame(rows).sort_values(["regime", "policy", "N"], kind="stable")


def _fmt(x: float) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.2f}"


@STUDIES.register("validation")
def study_validation(ctx: Context) -> Section:
    """Real vs simulated, per variant of the simulated side, from stored validations."""
    sec = Section(ctx.spec.get("title", "The simulator against a real vLLM deployment"))
    variants = ctx.spec.get("variants") or {}
    if not isinstance(variants, dict) or not variants:
        raise ConfigError("experiments/validation.yaml", "variants", "must map a variant name to a folder")
    cmds = ctx.spec.get("commands", [])
    sec.body += ["Produced by (in this order):", "", "```", *map(str, cmds), "```", ""]
    summaries = []
    for i, (name, folder) in enumerate(variants.items()):
        comp, cap, base = _variant(ctx, name, str(folder))
        summary = error_summary(comp, cap)
        summary.insert(0, "simulated side", name)
        summaries.append(summary)
        comp.to_csv(ctx.out / f"comparison-{name}.csv", index=False)
        if i == 0 or ctx.spec.get("every_variant_side_by_side"):
            sec.body += [f"**Real / simulated ({name})**, per regime, policy and N:", ""]
            sec.body += [*md_table(side_by_side(comp)), ""]
        rep = replay_summary(base)
        if len(rep):
            rep.to_csv(ctx.out / f"replay-{name}.csv", index=False)
            sec.body += [
                f"**Each real log replayed** (`wispsim replay`, {name}): the recorded device side "
                "drives the simulated server; recorded / simulated:",
                "",
                *md_table(rep),
                "",
            ]
        fig = base / "validation.png"
        if fig.is_file():
            dst = ctx.out / f"validation-{name}.png"
            shutil.copyfile(fig, dst)
            sec.body += [f"![violation rate vs N, real and simulated ({name})]({ctx.rel(dst)})", ""]
    errors = pd.concat(summaries, ignore_index=True)
    errors.to_csv(ctx.out / "errors.csv", index=False)
    sec.body += ["**Errors** (simulated minus real; relative errors over real) and capacity:", ""]
    sec.body += [*md_table(errors), ""]
    sec.facts["variants"] = dict(variants)
    return sec
