"""Studies that search for capacity: the capacity table, the heterogeneous mix, trace against
Bernoulli acceptance -- and the estimator's fit quality, which reads shipped profiles only.

Capacity searches go through the same stored points as ``wispsim sweep``
(:mod:`wispsim.study.points`), so a study that is interrupted resumes where it stopped and a rerun
costs nothing; each sweep's folder holds what ``wispsim sweep`` writes (capacity.csv, curve.csv,
curve_pooled.csv, manifest.json, scenario.yaml), so ``wispsim plot`` can redraw it.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.config import Scenario
from wispsim.model.acceptance import make_acceptance
from wispsim.model.profiles import available_profiles, load_profile
from wispsim.plots import acceptance_bars, capacity_bars, violation_curves
from wispsim.study.capacity import speedups
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, seeds
from wispsim.study.experiments.sweeps import (
    AT_CAPACITY,
    at_capacity,
    cap_cell,
    group_curve,
    measured_only,
    numeric_class,
    rows_at,
    sweep,
    sweeps,
)
from wispsim.study.experiments.targets import study_target, with_profile


@STUDIES.register("capacity")
def study_capacity(ctx: Context) -> Section:
    """Capacity per policy x class x target, with intervals, speedups and goodput at capacity."""
    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "centralized", "sled"]))
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    targets = list(spec.get("targets", ["a100-qwen3-32b"]))
    sec = Section(spec.get("title", "Capacity table"))
    goodput_rows = []
    plan: dict[Path, dict[str, Scenario]] = {}
    names: dict[Path, str] = {}
    for entry in targets:
        target, profile, sets = study_target(ctx, entry)
        folder = ctx.out / target
        names[folder] = target
        plan[folder] = {p: with_profile(ctx.scenario(**sets), profile).with_policy(p) for p in policies}
    t0 = time.perf_counter()
    results = sweeps(ctx, plan, classes, "separate")  # every target's searches together
    sec.facts["wall_s_sweeps"] = time.perf_counter() - t0
    for folder, res in results.items():
        target, base = names[folder], plan[folder]
        cap = res.capacity
        wide = cap.assign(cell=[cap_cell(r) for r in cap.itertuples()]).pivot(
            index="class", columns="policy", values="cell"
        )
        wide = wide.reindex(columns=policies).reset_index()
        ratios = speedups(measured_only(cap), policies)  # NaN where either side is saturated
        for other in policies[1:]:
            col = f"{policies[0]}/{other}"
            wide[col] = ["-" if math.isnan(x) else f"{x:.2f}" for x in ratios[col].to_numpy(float)]
        wide = wide.sort_values("class", key=numeric_class, kind="stable")
        sec.body += [
            f"### {target}",
            "",
            f"Capacity in devices [95% interval], {len(seeds(spec))} seed(s):",
            "",
        ]
        sec.body += md_table(wide)
        # goodput at capacity: the curve at N = capacity (interpolated between evaluated N)
        curve = res.curve
        for r in cap.to_dict("records"):
            label = str(r["class"])
            at = rows_at(group_curve(curve, str(r["policy"]), label), int(r["capacity"]))
            goodput_rows.append(
                {
                    "target": target,
                    "policy": r["policy"],
                    "class": label,
                    "capacity": int(r["capacity"]),
                    "goodput_tps": float(at.goodput_tps.mean()) if len(at) else math.nan,
                    "gpu_utilization": float(at.gpu_utilization.mean()) if len(at) else math.nan,
                    **at_capacity(at, base[r["policy"]]),
                }
            )
        bars = capacity_bars(cap, folder / "capacity.png")
        curves = violation_curves(folder, folder / "curves.png")
        sec.body += [
            "",
            f"![capacity, {target}]({ctx.rel(bars)})",
            "",
            f"![violation vs N, {target}]({ctx.rel(curves)})",
            "",
        ]
    gp = pd.DataFrame(goodput_rows)
    gp.to_csv(ctx.out / "goodput_at_capacity.csv", index=False)
    if len(gp):
        table = gp.pivot_table(
            index=["target", "class"], columns="policy", values="goodput_tps"
        ).reset_index()
        table = table.sort_values(["target", "class"], key=numeric_class, kind="stable")
        gp = gp.sort_values(["target", "class"], key=numeric_class, kind="stable")
        title = "### System goodput at capacity (committed tokens/s; between evaluated N, interpolated)"
        sec.body += [title, "", *md_table(table, "{:.0f}")]
        if spec.get("at_capacity_details"):
            sec.body += [
                "",
                "### What a committed token costs at capacity",
                "",
                "Per policy at its capacity (mean over seeds): GPU ms per committed token (GPU "
                "utilization over goodput), GPU batch size (rounds or sequences per pass), tokens "
                "per chunk (ITL over TPOT: committed per verification round or server step), the "
                "replica's KV cache in tokens, and the median device speed.",
                "",
                *md_table(
                    gp[["target", "class", "policy", "capacity", *AT_CAPACITY]].round(
                        {"gpu_ms_per_token": 2, "mean_batch_size": 1, "tokens_per_chunk": 2, "speed_p50": 2}
                    )
                ),
            ]
    return sec


@STUDIES.register("mix")
def study_mix(ctx: Context) -> Section:
    """All classes share one verifier: per-class violation vs N, policy by policy."""
    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "fcfs"]))
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    grid = tuple(int(n) for n in spec.get("devices", [40, 60, 80, 100, 120]))
    base = {p: ctx.scenario().with_policy(p) for p in policies}
    res = sweep(ctx, ctx.out, base, classes, "shared", grid)
    pooled = res.pooled
    sec = Section(spec.get("title", "Heterogeneous mix"))
    wide = pooled.pivot_table(
        index=["devices"], columns=["policy", "class"], values="violation_rate"
    ).sort_index()
    wide.columns = [f"{p} {c}" for p, c in map(tuple, wide.columns)]  # (policy, class) pairs
    sec.body += [
        f"Violation rate per class (policy and class), all on one GPU, {len(seeds(spec))} seed(s):",
        "",
    ]
    sec.body += md_table(wide.reset_index(), "{:.3f}")
    cap = res.capacity
    sec.body += [
        "",
        "Capacity of the whole mix (every class within epsilon): "
        + ", ".join(f"{r.policy} {cap_cell(r)}" for r in cap.itertuples()),
    ]
    fig = violation_curves(ctx.out, ctx.out / "mix_curves.png")
    sec.body += ["", f"![per-class violation in a shared mix]({ctx.rel(fig)})"]
    return sec


@STUDIES.register("estimator")
def study_estimator(ctx: Context) -> Section:
    """Fit quality of every shipped measured profile, with its report's figures."""
    sec = Section(ctx.spec.get("title", "Estimator accuracy"))
    rows = []
    for name in available_profiles():
        p = load_profile(name)
        if p.kind != "measured":
            continue
        f = p.fit
        rows.append(
            {
                "profile": name,
                "hardware": p.gpu,
                "engine": p.engine,
                "configurations": f"{f['configurations']['train']} + {f['configurations']['test']}",
                "test R^2": f["r2"]["test"],
                "test MAPE %": f["mape_pct"]["test"],
                "test MAE ms": f["mae_ms"]["test"],
                "CV R^2": f.get("cv5_r2", {}).get("mean", math.nan),
            }
        )
        src = Path(p.source).parent / f"{name}.fit"
        for fig in ("actual_vs_predicted.png", "residuals.png"):
            if (src / fig).is_file():
                dst = ctx.out / f"{name}-{fig}"
                shutil.copyfile(src / fig, dst)
                sec.body += [f"![{name}: {fig[:-4]}]({ctx.rel(dst)})", ""]
    table = pd.DataFrame(rows)
    table.to_csv(ctx.out / "estimator.csv", index=False)
    head = ["The WISP paper's A100 vLLM fit: test R^2 0.992, MAPE 4.93%. Shipped measured profiles:", ""]
    sec.body = head + (md_table(table) if len(table) else ["(none)"]) + [""] + sec.body
    return sec


@STUDIES.register("acceptance")
def study_acceptance(ctx: Context) -> Section:
    """Capacity under trace replay vs independent Bernoulli acceptance at the same mean rate.

    Besides capacity, the section tabulates how each policy drafts under each model at light load
    (mean draft length, accepted / drafted, accepted tokens per round): a policy whose rejection
    predictor reads the draft's features sees informative features in a trace and uninformative
    ones under Bernoulli, so its drafting changes with the model, not only its acceptance.
    """
    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "wisp-fixed", "sled"]))
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    light = int(spec.get("light_load_devices", 32))
    traced = ctx.scenario()
    mean = float(make_acceptance(traced.acceptance).nominal_rate())
    bern = traced.replace(acceptance=dataclasses.replace(traced.acceptance, model="bernoulli", mean=mean))
    caps, drafting = [], []
    models = {"trace": traced, "bernoulli": bern}
    plan = {ctx.out / label: {p: sc.with_policy(p) for p in policies} for label, sc in models.items()}
    results = sweeps(ctx, plan, classes, "separate", also=(light,))
    for label in models:
        res = results[ctx.out / label]
        caps.append(res.capacity.assign(acceptance=label))
        cv = res.curve[res.curve.devices <= light]
        for pol, d in cv.groupby("policy", sort=False):
            drafting.append(
                {
                    "policy": pol,
                    "acceptance": label,
                    "mean_k": float(d.mean_k.mean()),
                    "accepted/drafted": float(d.acceptance_ratio.mean()),
                    "accepted/round": float((d.acceptance_ratio * d.mean_k).mean()),
                }
            )
    cap = pd.concat(caps, ignore_index=True)
    cap.to_csv(ctx.out / "capacity.csv", index=False)
    draft = pd.DataFrame(drafting)
    draft.to_csv(ctx.out / "drafting.csv", index=False)
    wide = (
        measured_only(cap)
        .pivot_table(index=["policy", "class"], columns="acceptance", values="capacity", dropna=False)
        .reset_index()
    )
    wide["policy"] = pd.Categorical(wide["policy"], policies, ordered=True)
    wide = wide.sort_values(["policy", "class"])
    wide["bernoulli/trace"] = wide["bernoulli"] / wide["trace"].where(wide["trace"] > 0)
    cells = cap.assign(cell=[cap_cell(r) for r in cap.itertuples()])
    for label in ("trace", "bernoulli"):
        m = cells[cells.acceptance == label].set_index(["policy", "class"]).cell
        wide[label] = [m.get((p, c), "-") for p, c in zip(wide.policy, wide["class"], strict=True)]
    bars = acceptance_bars(cap, policies, mean, ctx.out / "acceptance.png")
    sec = Section(spec.get("title", "Correlated vs independent acceptance"))
    sec.body += [
        f"Trace `{traced.acceptance.trace}` (mean per-token acceptance {mean:.3f}) against a "
        f"Bernoulli model with the same mean; capacity in devices [95% interval], "
        f"{len(seeds(spec))} seed(s):",
        "",
    ]
    sec.body += md_table(wide, "{:.3g}")
    sec.body += [
        "",
        f"How each policy drafts under each model at light load (N <= {light}, every class and seed):",
        "",
    ]
    sec.body += md_table(draft, "{:.3g}")
    sec.body += ["", f"![trace vs Bernoulli]({ctx.rel(bars)})"]
    sec.facts["mean_rate"] = mean
    return sec


def _threshold_label(t: float | None, shipped: float) -> str:
    return f"shipped {shipped:.3f}" if t is None else f"t={t:g}"


@STUDIES.register("threshold")
def study_threshold(ctx: Context) -> Section:
    """Capacity against the rejection predictor's decision threshold (and K_max), per class.

    Each threshold is one arm of a capacity sweep (``drafting.predictor.threshold``; ``null`` is
    the threshold the predictor file ships with, its low-false-positive point), beside
    ``wisp-fixed`` (fixed K drafting, the same scheduler and KV policy) as the no-predictor
    reference. Besides capacity, the light-load drafting of each arm: mean K, accepted / drafted
    and committed tokens per server round, the quantities the operating point trades.
    """
    spec = ctx.spec
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    thresholds = [None if t is None else float(t) for t in spec.get("thresholds", [None, 0.5])]
    k_maxes = [int(k) for k in spec.get("k_max", [8])]
    light = int(spec.get("light_load_devices", 32))
    policy = str(spec.get("policy", "wisp"))
    wisp = ctx.scenario().with_policy(policy)
    from wispsim.model.predictor import make_predictor

    shipped = float(getattr(make_predictor(wisp.drafting.predictor), "threshold", math.nan))
    base: dict[str, Scenario] = {}
    meta: list[dict[str, Any]] = []
    for k_max in k_maxes:
        for t in thresholds:
            pred = dataclasses.replace(wisp.drafting.predictor, threshold=t)
            drafting = dataclasses.replace(wisp.drafting, predictor=pred, k_max=k_max)
            label = _threshold_label(t, shipped) + ("" if len(k_maxes) == 1 else f", K_max={k_max}")
            base[label] = wisp.replace(drafting=drafting)
            meta.append({"arm": label, "threshold": shipped if t is None else t, "k_max": k_max})
    for ref in spec.get("references", ["wisp-fixed"]):
        base[ref] = ctx.scenario().with_policy(ref)
        meta.append({"arm": ref, "threshold": math.nan, "k_max": base[ref].drafting.k})
    res = sweep(ctx, ctx.out, base, classes, "separate", also=(light,))
    cap = res.capacity
    arms = pd.DataFrame(meta)
    cv = res.curve[res.curve.devices <= light]
    drafting_rows = [
        {
            "arm": arm,
            "mean_k": float(d.mean_k.mean()),
            "accepted/drafted": float(d.acceptance_ratio.mean()),
            "committed/round": float((d.acceptance_ratio * d.mean_k).mean() + 1.0),
        }
        for arm, d in cv.groupby("policy", sort=False)
    ]
    arms = arms.merge(pd.DataFrame(drafting_rows), on="arm", how="left")
    cap.to_csv(ctx.out / "threshold_capacity.csv", index=False)
    arms.to_csv(ctx.out / "arms.csv", index=False)
    order = list(base)
    wide = (
        cap.assign(cell=[cap_cell(r) for r in cap.itertuples()])
        .pivot(index="policy", columns="class", values="cell")
        .reindex(order)
        .reset_index()
        .rename(columns={"policy": "arm"})
    )
    wide.columns = [c if c == "arm" else f"class {c}" for c in wide.columns]
    table = arms.merge(wide, on="arm")
    best = measured_only(cap).pivot(index="policy", columns="class", values="capacity")
    tops = ", ".join(
        f"{c}: {best[c].idxmax()} ({int(best[c].max())})" for c in best.columns if best[c].notna().any()
    )
    sec = Section(spec.get("title", "The predictor's operating point for capacity"))
    sec.body += [
        f"Capacity in devices [95% interval] per arm and class, {len(seeds(spec))} seed(s); light-load "
        f"drafting (N <= {light}): mean K, accepted/drafted, committed tokens per round:",
        "",
        *md_table(table, "{:.3f}"),
        "",
        f"Capacity-optimal arm per class: {tops}.",
    ]
    fig = violation_curves(ctx.out, ctx.out / "threshold_curves.png")
    sec.body += ["", f"![violation vs N per threshold]({ctx.rel(fig)})"]
    sec.facts["shipped_threshold"] = shipped
    return sec
