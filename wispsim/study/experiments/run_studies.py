"""Studies that keep whole runs rather than stored points: compliance on a bursty trace, the
rejection predictor on and off, and the attribution of violations to queueing or compute.

The bursty and attribution studies simulate again on every rerun (they need every round and the
time series, which stored points do not keep); the ablation goes through the study's runner.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from wispsim.analysis.metrics import summarize
from wispsim.analysis.timeseries import write_timeseries
from wispsim.errors import ConfigError
from wispsim.plots import ablation_bars, attribution, bursty_compare
from wispsim.results import Results
from wispsim.sim.arrivals import driven_by_trace
from wispsim.sim.scenarios import resolve_server
from wispsim.sim.simulation import simulate
from wispsim.study.ablation import ablate_predictor
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, seeds


@STUDIES.register("bursty")
def study_bursty(ctx: Context) -> Section:
    """The bursty trace, compliance over time, policy by policy."""
    spec = ctx.spec
    policies = list(spec.get("policies", ["wisp", "fcfs"]))
    trace = str(spec.get("trace", "bursty"))
    rows = []
    folders: dict[str, Path] = {}
    for p in policies:
        for seed in seeds(spec):
            ctx.progress(f"bursty: {p} seed {seed}")
            base = ctx.scenario().with_policy(p)
            tail = float(spec.get("tail", 300))
            sc = driven_by_trace(base, "trace", trace, base.arrivals.kind, tail, "bursty")
            folder = ctx.out / f"{p}-seed{seed}"
            res = simulate(resolve_server(sc), seed=seed)
            ctx.simulated += 1
            out = Results(folder, f"experiment {ctx.name}").create()
            out.text("scenario.yaml", sc.to_yaml())
            _, _, bursts = write_timeseries(res, out)
            out.table("summary.csv", summarize(res))
            if bursts is not None:
                rows.append(bursts.assign(policy=p, seed=seed))
            if seed == seeds(spec)[0]:
                folders[p] = folder
    if not rows:
        raise ConfigError(
            f"experiments/{ctx.name}.yaml",
            "trace",
            f"{trace!r} has no bursts to measure (see `wispsim arrivals show`)",
        )
    allb = pd.concat(rows, ignore_index=True)
    allb.to_csv(ctx.out / "bursts_all.csv", index=False)
    agg = (
        allb[allb["class"] == "all"]
        .groupby(["peak", "peak_value", "policy"])
        .agg(
            compliance_at_peak=("compliance_at_peak", "mean"),
            trough=("trough", "mean"),
            recovery_s=("recovery_s", "mean"),
        )
        .reset_index()
    )
    sec = Section(spec.get("title", "Bursty stress test"))
    sec.body += [
        f"Trace `{trace}`; all classes, mean over {len(seeds(spec))} seed(s) (per class: `bursts_all.csv`):",
        "",
    ]
    sec.body += md_table(agg)
    fig = bursty_compare(folders, ctx.out / "bursty.png")
    sec.body += ["", f"![compliance over time]({ctx.rel(fig)})"]
    return sec


@STUDIES.register("ablation")
def study_ablation(ctx: Context) -> Section:
    """Predictor on (wisp) vs off (wisp-fixed) at small N."""
    spec = ctx.spec
    devices = [int(n) for n in spec.get("devices", [2, 4, 8, 16])]
    with ctx.make_runner(ctx.out) as runner:
        per_seed, table = ablate_predictor(ctx.scenario(), devices, seeds(spec), runner)
    per_seed.to_csv(ctx.out / "ablation_per_seed.csv", index=False)
    table.to_csv(ctx.out / "ablation.csv", index=False)
    cols = [
        "devices",
        "acceptance_ratio_on",
        "acceptance_ratio_off",
        "goodput_tps_on",
        "goodput_tps_off",
        "goodput_gain",
        "wdt_ms_on",
        "wdt_ms_off",
    ]
    sec = Section(spec.get("title", "Predictor ablation"))
    sec.body += [f"{len(seeds(spec))} seed(s); on = wisp (predictor), off = wisp-fixed (K = 5):", ""]
    sec.body += md_table(table[cols], "{:.3g}")
    fig = ablation_bars(table, ctx.out / "ablation.png")
    sec.body += ["", f"![predictor ablation]({ctx.rel(fig)})"]
    return sec


@STUDIES.register("attribution")
def study_attribution(ctx: Context) -> Section:
    """Violated rounds in the (queue, verify) plane: queue- or compute-dominant."""

    spec = ctx.spec
    sec = Section(spec.get("title", "Violation attribution"))
    rows = []
    for p in spec.get("policies", ["wisp"]):
        n = int(spec.get("devices", 100))
        seed = seeds(spec)[0]
        sc = ctx.scenario().with_policy(p)
        if spec.get("classes"):
            sc = sc.with_devices(n, tuple(float(c) for c in spec["classes"]))
        res = simulate(resolve_server(sc), devices=n, seed=seed)
        ctx.simulated += 1
        folder = ctx.out / p
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "scenario.yaml").write_text(sc.to_yaml())
        path, counts = attribution(
            res.rounds,
            res.batches,
            folder / "attribution.png",
            window=int(spec.get("window", 20)),
            factor=float(spec.get("factor", 1.5)),
            responses=res.responses,
        )
        total = sum(counts.values()) or 1
        rows.append(
            {
                "policy": p,
                "devices": n,
                **{k: v for k, v in counts.items()},
                **{f"{k}_share": v / total for k, v in counts.items()},
            }
        )
        sec.body += [f"![attribution, {p}]({ctx.rel(path)})", ""]
    table = pd.DataFrame(rows)
    table.to_csv(ctx.out / "attribution.csv", index=False)
    intro = (
        "Violated rounds of measured responses, labelled compute-dominant when the round's verify "
        f"time exceeds {spec.get('factor', 1.5)}x the moving average of the last "
        f"{spec.get('window', 20)} batches (SPEC 7), otherwise queue-dominant:"
    )
    sec.body = [intro, "", *md_table(table), "", *sec.body]
    return sec
