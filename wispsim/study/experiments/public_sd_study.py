"""The ``public-sd`` study: server-side speculative decoding checked on public H100 runs.

Every public run with server-side speculation on a known GPU (Qwen3-32B with a Qwen3-1.7B or
Qwen3-4B draft model or an EAGLE-3 head, k = 1-8, concurrency 1-256, two workloads) is simulated
as it ran (:mod:`wispsim.study.public_sd`). The target's parameters are the shipped calibration
(fitted without speculation, ``public`` study); only the two draft-pass costs are fitted, on the
spec's ``calibration`` runs, and written to ``wispsim/data/speculation.yaml`` with
``write_calibration: true``. The section reports simulated against real ITL, TPOT, TTFT and
throughput, calibration and held-out runs apart, per deployment and k, the draft's memory against
the servers' logs, and a figure of ITL against concurrency.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import pandas as pd
import yaml

from wispsim.errors import ConfigError
from wispsim.model.speculation import calibration
from wispsim.paths import data_dir as package_data
from wispsim.plots import public_speculative
from wispsim.study import public, public_sd
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES


def _write(engine: str, overheads: dict[str, float], summary: pd.DataFrame, cal_ids: list[str]) -> None:
    path = package_data() / "speculation.yaml"
    table = yaml.safe_load(path.read_text())
    fam = summary.set_index(["set", "family"])["median"]
    table[engine] = {
        **{k: float(f"{v:.4g}") for k, v in overheads.items()},
        "calibrated_on": ", ".join(cal_ids),
        "fit": {
            "study": "experiments/public-sd.yaml (experiments/REPORT.md, server-side speculation)",
            "date": f"{_dt.date.today():%Y-%m-%d}",
            "held_out_median_ape_pct": {
                f: float(fam.get(("held-out", f), float("nan"))) for f in ("TPOT/ITL", "TTFT", "throughput")
            },
        },
    }
    header = (
        "# The engine's cost per draft forward pass of server-side speculative decoding\n"
        "# (wispsim.model.speculation), by engine. Written by `wispsim experiment run public-sd`\n"
        "# (experiments/public-sd.yaml); do not edit by hand.\n"
    )
    path.write_text(header + yaml.safe_dump(table, sort_keys=False))


@STUDIES.register("public-sd")
def study_public_sd(ctx: Context) -> Section:
    spec = ctx.spec
    folder = str(public.data_dir())
    runs = public_sd.speculative_runs(folder)
    cal_ids = [str(x) for x in spec.get("calibration", [])]
    unknown = [r for r in cal_ids if r not in set(runs.run_id)]
    if unknown:
        raise ConfigError(
            "experiments/public-sd.yaml", "calibration", f"unknown speculative run {unknown[0]!r}"
        )
    only = spec.get("runs")
    if only:
        runs = runs[runs.run_id.isin([str(x) for x in only])]
    engine = str(spec.get("engine", "vllm"))
    start: dict[str, Any] = dict(spec.get("fit_start") or calibration(engine))
    overheads = {k: float(start[k]) for k, _, _ in public_sd.FITTED}
    if spec.get("fit", True):
        cal = runs[runs.run_id.isin(cal_ids)]
        ctx.progress(f"public-sd: fitting the draft-pass costs on {len(cal)} runs")
        fit = public_sd.calibrate(
            cal, folder, overheads, lambda n, c: ctx.progress(f"public-sd: fit {n}, cost {c:.4f}")
        )
        overheads = fit.overheads
    ctx.progress(f"public-sd: simulating {len(runs)} runs")
    errors = public.compare(runs, folder, None, cal_ids, overheads)
    ctx.simulated += len(runs)
    errors.to_csv(ctx.out / "errors.csv", index=False)
    summary = public.summary(errors)
    summary.to_csv(ctx.out / "summary.csv", index=False)
    if spec.get("write_calibration") and not ctx.quick:
        _write(engine, overheads, summary, cal_ids)
    per_k = public_sd.by_k(errors, runs)
    per_k.to_csv(ctx.out / "by_k.csv", index=False)
    fig = public_speculative(errors, runs, ctx.out / "public_sd_itl.png")

    sec = Section(spec.get("title", "Server-side speculative decoding on public runs"))
    sec.body += [
        f"{len(runs)} public runs with server-side speculation ({runs.group.nunique()} deployments; "
        "`experiments/data/public/README.md`), each simulated as it ran with policy "
        "`centralized-sd`'s server: the run's method, draft and k, each step's accepted run drawn "
        "for the acceptance length the server reported. The target's parameters are the shipped "
        "ones (fitted on runs without speculation); the draft-pass costs the roofline cannot see "
        f"are fitted on {len(cal_ids)} runs: " + ", ".join(f"`{r}`" for r in cal_ids) + ".",
        "",
        "Fitted: "
        + ", ".join(f"`{k}` = {v:.3g}" for k, v in overheads.items())
        + " (per draft pass, and per layer of it).",
        "",
        "Absolute percentage error per metric family (median and mean over runs and the family's "
        "metrics; TPOT/ITL: median and mean TPOT, mean ITL):",
        "",
    ]
    sec.body += md_table(summary)
    sec.body += ["", "Median APE of held-out runs per deployment and k (over concurrencies):", ""]
    sec.body += md_table(per_k)
    sec.body += ["", f"![mean ITL, simulated vs real]({ctx.rel(fig)})", ""]
    memory = public_sd.memory_check(folder)
    memory.to_csv(ctx.out / "memory_check.csv", index=False)
    sec.body += ["The draft's memory against the servers' logs (per GPU):", ""]
    sec.body += md_table(memory, "{:.4g}")
    sec.facts.update(
        {"draft_overheads": {k: float(f"{v:.4g}") for k, v in overheads.items()}, "runs": len(runs)}
    )
    return sec
