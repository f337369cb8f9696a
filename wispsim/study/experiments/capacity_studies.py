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

from wispsim.analysis.tables import is_saturated, saturated_mask
from wispsim.config import Scenario
from wispsim.model.acceptance import make_acceptance
from wispsim.model.profiles import available_profiles, load_profile
from wispsim.plots import acceptance_bars, capacity_bars, violation_curves
from wispsim.results import Results
from wispsim.study.capacity import SweepResult, capacity_sweep, groups_for, speedups
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, seeds
from wispsim.study.experiments.targets import study_target, with_profile
from wispsim.study.stopping import Stopping


def _sweep(
    ctx: Context,
    folder: Path,
    base: dict[str, Scenario],
    classes: list[float],
    mix: str,
    grid: tuple[int, ...] = (),
    also: tuple[int, ...] = (),
) -> SweepResult:
    """A capacity sweep of the policies in ``base`` through the study's runner (stored points),
    written to ``folder`` as ``wispsim sweep`` writes it."""
    return _sweeps(ctx, {folder: base}, classes, mix, grid, also)[folder]


SEP = "|"  # joins a sweep's index to a policy name in a combined sweep (no policy name has one)


def _sweeps(
    ctx: Context,
    sweeps: dict[Path, dict[str, Scenario]],
    classes: list[float],
    mix: str,
    grid: tuple[int, ...] = (),
    also: tuple[int, ...] = (),
) -> dict[Path, SweepResult]:
    """Several capacity sweeps (a results folder -> its policies' scenarios) searched together,
    so that every phase fills the runner with the points of all of them (sweeps run one after
    the other leave cores idle in their last phases, when few searches are left); each written
    to its folder as ``wispsim sweep`` writes it, its points stored in the study's folder (the
    sweep's own when there is one)."""
    spec = ctx.spec
    folders = list(sweeps)
    for f in folders:
        f.mkdir(parents=True, exist_ok=True)
    joined = {f"{i}{SEP}{pol}": sc for i, f in enumerate(folders) for pol, sc in sweeps[f].items()}
    eps = float(spec.get("epsilon", 0.05))
    where = ctx.rel(folders[0]) if len(folders) == 1 else f"{len(folders)} sweeps"
    with ctx.make_runner(folders[0] if len(folders) == 1 else ctx.out) as runner:
        res = capacity_sweep(
            joined,
            groups_for(classes, mix),
            seeds(spec),
            eps,
            runner,
            grid=grid,
            start=int(spec.get("start", 8)),
            max_devices=int(spec.get("max_devices", 4096)),
            progress=lambda done, planned, phase: ctx.progress(f"{where}: {phase} {done}/{planned} N values"),
            stopping=None if spec.get("stop") == "horizon" else Stopping(eps),
            exact=spec.get("search") == "exact",
            also=also,
        )
    out: dict[Path, SweepResult] = {}
    for i, folder in enumerate(folders):
        part = SweepResult(*(_part(df, i) for df in (res.capacity, res.curve, res.pooled)))
        results = Results(folder, f"experiment {ctx.name}")
        with results.writing():
            part.write(results)
            results.text("scenario.yaml", next(iter(sweeps[folder].values())).to_yaml())
            results.finish({"seeds": seeds(spec), "epsilon": eps, "policies": list(sweeps[folder])})
        out[folder] = part
    return out


def _part(df: pd.DataFrame, i: int) -> pd.DataFrame:
    """The rows of sweep ``i`` of a combined sweep's table, its policy names as they were."""
    if df.empty:
        return df
    prefix = f"{i}{SEP}"
    mine = df[df.policy.astype(str).str.startswith(prefix)].copy()
    mine["policy"] = mine.policy.str.slice(len(prefix))
    return mine.reset_index(drop=True)


def _cap_cell(r: Any) -> str:
    """``capacity [low, high]``, or ``>= capacity`` when the search hit its ceiling (a lower bound)."""
    d = r if isinstance(r, dict) else r._asdict()
    if is_saturated(d):
        return f">= {int(d['capacity'])} (search ceiling)"
    return f"{int(d['capacity'])} [{int(d['ci_low'])}, {int(d['ci_high'])}]"


def _measured(cap: pd.DataFrame) -> pd.DataFrame:
    """``cap`` with saturated capacities (lower bounds) set to NaN, so ratios leave them out."""
    return cap.assign(capacity=cap["capacity"].astype(float).mask(saturated_mask(cap)))


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
    results = _sweeps(ctx, plan, classes, "separate")  # every target's searches together
    sec.facts["wall_s_sweeps"] = time.perf_counter() - t0
    for folder, res in results.items():
        target, base = names[folder], plan[folder]
        cap = res.capacity
        wide = cap.assign(cell=[_cap_cell(r) for r in cap.itertuples()]).pivot(
            index="class", columns="policy", values="cell"
        )
        wide = wide.reindex(columns=policies).reset_index()
        ratios = speedups(_measured(cap), policies)  # NaN where either side is saturated
        for other in policies[1:]:
            col = f"{policies[0]}/{other}"
            wide[col] = ["-" if math.isnan(x) else f"{x:.2f}" for x in ratios[col].to_numpy(float)]
        wide = wide.sort_values("class", key=_numeric_class, kind="stable")
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
            mine = curve[(curve.policy == r["policy"]) & (curve.group.astype(str) == label)]
            at = _rows_at(mine[mine["class"].astype(str) == label], int(r["capacity"]))
            goodput_rows.append(
                {
                    "target": target,
                    "policy": r["policy"],
                    "class": label,
                    "capacity": int(r["capacity"]),
                    "goodput_tps": float(at.goodput_tps.mean()) if len(at) else math.nan,
                    "gpu_utilization": float(at.gpu_utilization.mean()) if len(at) else math.nan,
                    **_at_capacity(at, base[r["policy"]]),
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
        table = table.sort_values(["target", "class"], key=_numeric_class, kind="stable")
        gp = gp.sort_values(["target", "class"], key=_numeric_class, kind="stable")
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


def _rows_at(curve: pd.DataFrame, n: int) -> pd.DataFrame:
    """The curve's rows (one per seed) at N = ``n``; where ``n`` was not evaluated (a search that
    ends at the knee places the capacity between two evaluated N), the seed means at the evaluated
    N on either side, interpolated linearly to ``n`` (one row); none when ``n`` is off the curve."""
    if curve.empty or n in set(curve.devices):
        return curve[curve.devices == n]
    ns = sorted(set(curve.devices))
    below = [x for x in ns if x < n]
    above = [x for x in ns if x > n]
    if not below or not above:
        return curve.iloc[0:0]
    a, b = below[-1], above[0]
    num = curve.select_dtypes("number").columns
    ma = curve[curve.devices == a][num].mean()
    mb = curve[curve.devices == b][num].mean()
    return pd.DataFrame([ma + (mb - ma) * (n - a) / (b - a)])


def _numeric_class(col: pd.Series) -> pd.Series:
    """Sort key: SLO classes by value (2 before 12), other columns as they are."""
    return pd.to_numeric(col, errors="coerce") if col.name == "class" else col


AT_CAPACITY = (
    "goodput_tps",
    "gpu_ms_per_token",
    "mean_batch_size",
    "tokens_per_chunk",
    "kv_tokens",
    "speed_p50",
)


def _at_capacity(at: pd.DataFrame, sc: Scenario) -> dict[str, float]:
    """What a committed token costs at capacity (``at``: the curve's rows at N = capacity)."""
    from wispsim.model.memory import kv_capacity
    from wispsim.model.profiles import load_profile

    nan = math.nan
    good = float(at.goodput_tps.mean()) if len(at) else nan
    util = float(at.gpu_utilization.mean()) if len(at) else nan
    return {
        "gpu_ms_per_token": util * sc.server.replicas * 1000 / good if good and good > 0 else nan,
        "mean_batch_size": float(at.mean_batch_size.mean()) if len(at) else nan,
        "tokens_per_chunk": float((at.itl_mean_ms / at.tpot_mean_ms).mean()) if len(at) else nan,
        "kv_tokens": kv_capacity(sc.server, load_profile(sc.server.profile)),
        "speed_p50": float(at.speed_p50.mean()) if len(at) else nan,
    }


@STUDIES.register("mix")
def study_mix(ctx: Context) -> Section:
    """All classes share one verifier: per-class violation vs N, policy by policy."""
    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "fcfs"]))
    classes = [float(c) for c in spec.get("classes", [2, 4, 6, 8])]
    grid = tuple(int(n) for n in spec.get("devices", [40, 60, 80, 100, 120]))
    base = {p: ctx.scenario().with_policy(p) for p in policies}
    res = _sweep(ctx, ctx.out, base, classes, "shared", grid)
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
        + ", ".join(f"{r.policy} {_cap_cell(r)}" for r in cap.itertuples()),
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
    results = _sweeps(ctx, plan, classes, "separate", also=(light,))
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
        _measured(cap)
        .pivot_table(index=["policy", "class"], columns="acceptance", values="capacity", dropna=False)
        .reset_index()
    )
    wide["policy"] = pd.Categorical(wide["policy"], policies, ordered=True)
    wide = wide.sort_values(["policy", "class"])
    wide["bernoulli/trace"] = wide["bernoulli"] / wide["trace"].where(wide["trace"] > 0)
    cells = cap.assign(cell=[_cap_cell(r) for r in cap.itertuples()])
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
    res = _sweep(ctx, ctx.out, base, classes, "separate", also=(light,))
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
        cap.assign(cell=[_cap_cell(r) for r in cap.itertuples()])
        .pivot(index="policy", columns="class", values="cell")
        .reindex(order)
        .reset_index()
        .rename(columns={"policy": "arm"})
    )
    wide.columns = [c if c == "arm" else f"class {c}" for c in wide.columns]
    table = arms.merge(wide, on="arm")
    best = _measured(cap).pivot(index="policy", columns="class", values="capacity")
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
