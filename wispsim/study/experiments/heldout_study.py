"""The ``heldout`` study: the shipped physical calibration on every public run it was not fitted on,
read by regime (GPU x TP x dense or MoE x load x engine generation; issue 45).

The calibration set is the ``public`` study's (experiments/public.yaml); every other public run
without server-side speculation on a known GPU is simulated as it ran with the shipped parameters
(wispsim/data/roofline.yaml) and set beside its real figures (:func:`wispsim.study.public.compare`).
Nothing is fitted here. Every GPU but the H100s and every source but the two the fit used is
out of the fit, so the per-GPU table is a leave-one-GPU-out check and the per-source table a
leave-one-source-out check of the calibration as shipped.
"""

from __future__ import annotations

import pandas as pd

from wispsim.study import public
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES, load_spec
from wispsim.study.public import FAMILIES
from wispsim.study.public_regimes import SPREAD_CV, regime_table, regime_wide, spread_errors


def _by(errors: pd.DataFrame, runs: pd.DataFrame, key: str) -> pd.DataFrame:
    fam = {m: f for f, ms in FAMILIES.items() for m in ms}
    e = errors.merge(runs[["run_id", key]], on="run_id").assign(family=errors.metric.map(fam))
    t = e.groupby([key, "family"]).ape_pct.median().round(1).unstack("family")
    t.insert(0, "runs", e.groupby(key).run_id.nunique())
    return t.reset_index()


@STUDIES.register("heldout")
def study_heldout(ctx: Context) -> Section:
    spec = ctx.spec
    base = load_spec(str(spec.get("calibration_of", "public")))
    folder = str(public.data_dir())
    runs = public.load_runs(folder)
    runs = runs[
        (runs.spec_method == "none")
        & runs.gpu.notna()
        & ~runs.run_id.isin(base.get("exclude_runs", []))
        & ~runs.run_id.isin(base["calibration"])
    ]
    if ctx.quick:
        runs = runs.groupby("gpu").head(2)
    parts = []
    for i, idx in enumerate(runs.index):
        parts.append(public.compare(runs.loc[[idx]], folder, None, []))
        if (i + 1) % 25 == 0:
            ctx.progress(f"heldout: {i + 1}/{len(runs)} runs simulated")
    ctx.simulated += len(runs)
    errors = pd.concat(parts, ignore_index=True)
    errors.to_csv(ctx.out / "errors.csv", index=False)
    table = regime_table(errors, runs)
    table.to_csv(ctx.out / "regimes.csv", index=False)
    wide = regime_wide(table)
    # a web page's source is its site; a repository's, its owner/name
    site = runs.source.str.extract(r"https?://([^/]+)", expand=False)
    runs = runs.assign(source=site.fillna(runs.source.str.split(" ").str[0]))
    sec = Section(spec.get("title", "Held-out public runs by regime"))
    sec.body += [
        f"{len(runs)} public runs the calibration never saw ({runs.gpu.nunique()} GPU kinds, "
        f"{runs.source.nunique()} sources; `experiments/data/public/README.md` and "
        "`experiments/data/public/candidates/NOTES*.md` say where each comes from), each simulated as "
        "it ran with the shipped parameters. Cells: median absolute error % over the regime's runs "
        "and the family's metrics, and in brackets the median signed error (simulated / real - 1; "
        "negative: the simulator is faster or more optimistic than the real server). Load: light "
        "(at most 8 in flight), open loop (Poisson arrivals), closed loop (more than 8 in flight), "
        "all at once (every request sent at t = 0: TTFT is mostly queueing). P99 ITL is vLLM's: "
        "every gap between a request's chunks.",
        "",
    ]
    sec.body += md_table(wide)
    sec.body += [
        "",
        "By GPU (only H100s were in the fit: every other row is a GPU the fit never saw), median "
        "absolute error %:",
        "",
    ]
    sec.body += md_table(_by(errors, runs, "gpu"))
    sec.body += ["", "By source (the fit used tomasruizt/vllm-scripts and inference-sim/training):", ""]
    sec.body += md_table(_by(errors, runs, "source"))
    ctx.progress("heldout: the mean-lengths runs again with spread lengths")
    spread = spread_errors(runs, folder)
    ctx.simulated += int(spread.run_id.nunique()) if len(spread) else 0
    spread.to_csv(ctx.out / "errors_spread_lengths.csv", index=False)
    if len(spread):
        sec.body += [
            "",
            "Sensitivity: most sources publish only mean lengths, and the runs above replay every "
            "request at them, so a closed loop or an all-at-once run moves in lockstep (every "
            "request prefills, decodes and ends together). The same runs with the lengths spread "
            f"around the same means (outputs lognormal, coefficient of variation {SPREAD_CV:g}, at "
            "most 4x the mean; ShareGPT inputs too, at most 1,024; "
            "`wispsim.study.public_regimes.spread`), a check of that assumption and not the "
            "model's default:",
            "",
        ]
        sec.body += md_table(regime_wide(regime_table(spread, runs)))
    sec.facts.update({"runs": len(runs), "gpus": sorted(runs.gpu.unique())})
    return sec
