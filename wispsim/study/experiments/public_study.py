"""The ``public`` study: the roofline calibrated and checked on public GPU measurements.

It fits the engine's efficiencies and overheads on the spec's ``calibration`` runs
(:func:`wispsim.study.public.calibrate`), simulates every run of ``experiments/data/public`` as it
ran with those parameters, and reports simulated against real (TTFT, TPOT/ITL, throughput, E2E),
calibration and held-out runs apart, with a figure of median TPOT. ``write_calibration: true``
writes the fitted parameters to ``wispsim/data/roofline.yaml``, which every grounded profile
(:mod:`wispsim.model.physical`) reads. The quick size skips the fit and checks the shipped
parameters on a few runs.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import pandas as pd
import yaml

from wispsim.errors import ConfigError
from wispsim.model.physical import calibration
from wispsim.paths import data_dir as package_data
from wispsim.plots import public_tpot
from wispsim.study import public
from wispsim.study.experiments.run import Context, Section, md_table
from wispsim.study.experiments.spec import STUDIES


def _check_ids(runs: pd.DataFrame, spec: dict[str, Any]) -> None:
    known = set(runs.run_id)
    for key in ("calibration", "exclude_runs", "runs"):
        ids = spec.get(key) or []
        if not isinstance(ids, list):
            raise ConfigError(f"experiments/{spec.get('name', '?')}.yaml", key, "must be a list of run ids")
        bad = [str(x) for x in ids if str(x) not in known]
        if bad:
            raise ConfigError(
                f"experiments/{spec.get('name', '?')}.yaml",
                key,
                f"unknown run {bad[0]!r}; run ids are in experiments/data/public/runs.csv",
            )


def _selected(runs: pd.DataFrame, spec: dict[str, Any]) -> pd.DataFrame:
    _check_ids(runs, spec)
    keep = runs[runs.gpu.notna()]
    if spec.get("spec_method", "none") != "all":
        keep = keep[keep.spec_method == spec.get("spec_method", "none")]
    keep = keep[~keep.group.isin([str(x) for x in spec.get("exclude_groups", [])])]
    keep = keep[~keep.run_id.isin([str(x) for x in spec.get("exclude_runs", [])])]
    only = spec.get("runs")
    return keep[keep.run_id.isin(only)] if only else keep


@STUDIES.register("public")
def study_public(ctx: Context) -> Section:
    spec = ctx.spec
    folder = str(public.data_dir())
    runs = _selected(public.load_runs(folder), spec)
    cal_ids = [str(x) for x in spec.get("calibration", [])]
    shipped = calibration(str(spec.get("engine", "vllm")))
    base = {k: dict(shipped[k]) for k in ("efficiency", "overhead_ms")}
    if spec.get("fit", True):
        cal_runs = runs[runs.run_id.isin(cal_ids)]
        ctx.progress(f"public: calibrating on {len(cal_runs)} runs")
        fit = public.calibrate(
            cal_runs, folder, base, lambda n, c: ctx.progress(f"public: fit {n}, cost {c:.4f}")
        )
        params = fit.params
    else:
        params = base
    ctx.progress(f"public: simulating {len(runs)} runs")
    errors = public.compare(runs, folder, params, cal_ids)
    ctx.simulated += len(runs)
    errors.to_csv(ctx.out / "errors.csv", index=False)
    summary = public.summary(errors)
    summary.to_csv(ctx.out / "summary.csv", index=False)
    by_group = (
        errors.assign(family=errors.metric.map({m: f for f, ms in public.FAMILIES.items() for m in ms}))
        .groupby(["set", "group", "family"])
        .ape_pct.median()
        .unstack("family")
        .round(1)
        .reset_index()
    )
    params_out = {
        "efficiency": {k: float(f"{v:.4g}") for k, v in params["efficiency"].items()},
        "overhead_ms": {k: float(f"{v:.4g}") for k, v in params["overhead_ms"].items()},
    }
    (ctx.out / "calibration.yaml").write_text(yaml.safe_dump(params_out, sort_keys=False))
    if spec.get("write_calibration") and not ctx.quick:
        table = yaml.safe_load((package_data() / "roofline.yaml").read_text())
        fam = summary.set_index(["set", "family"])["median"]
        table[str(spec.get("engine", "vllm"))] = {
            **params_out,
            "noise_sigma": shipped.get("noise_sigma", 0.05),
            "noise_basis": shipped.get("noise_basis", ""),
            "calibrated_on": ", ".join(cal_ids),
            "fit": {
                "study": "experiments/public.yaml (experiments/REPORT.md, public GPU measurements)",
                "date": f"{_dt.date.today():%Y-%m-%d}",
                "held_out_median_ape_pct": {
                    f: float(fam.get(("held-out", f), float("nan"))) for f in public.FAMILIES
                },
                "calibration_median_ape_pct": {
                    f: float(fam.get(("calibration", f), float("nan"))) for f in public.FAMILIES
                },
            },
        }
        header = "# Calibrated engine parameters of the roofline form (wispsim.model.roofline), by engine.\n"
        header += (
            "# Written by `wispsim experiment run public` (experiments/public.yaml); do not edit by hand.\n"
        )
        (package_data() / "roofline.yaml").write_text(header + yaml.safe_dump(table, sort_keys=False))
    fig = public_tpot(errors, ctx.out / "public_tpot.png")
    sec = Section(spec.get("title", "Public GPU measurements"))
    sec.body += [
        f"{len(runs)} public runs ({runs.group.nunique()} deployments; data and provenance: "
        "`experiments/data/public/README.md`), each simulated as it ran on the physical profile of its "
        f"architecture, GPU, TP and precision. Calibration runs ({len(cal_ids)}): "
        + ", ".join(f"`{r}`" for r in cal_ids)
        + ". Fitted parameters:",
        "",
    ]
    sec.body += md_table(
        pd.DataFrame(
            [
                {
                    **{f"eff {k}": v for k, v in params_out["efficiency"].items()},
                    **{f"{k} ms": v for k, v in params_out["overhead_ms"].items()},
                }
            ]
        ),
        "{:.4g}",
    )
    sec.body += [
        "",
        "Absolute percentage error per metric family (median, mean over runs and metrics of the family):",
        "",
    ]
    sec.body += md_table(summary)
    sec.body += ["", "Median APE per deployment:", ""]
    sec.body += md_table(by_group)
    sec.body += ["", f"![median TPOT, simulated vs real]({ctx.rel(fig)})"]
    sec.facts.update({"parameters": params_out, "runs": len(runs)})
    return sec
