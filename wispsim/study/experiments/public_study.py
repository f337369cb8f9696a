"""The ``public`` study: the roofline calibrated and checked on public GPU measurements.

It fits the engine's efficiencies and overheads on the spec's ``calibration`` runs
(:func:`wispsim.study.public.calibrate`), simulates every run of ``experiments/data/public`` as it
ran with those parameters, and reports simulated against real (TTFT, TPOT/ITL, throughput, E2E),
calibration and held-out runs apart, with a figure of median TPOT. ``write_calibration: true``
writes the fitted parameters to ``wispsim/data/roofline.yaml``, which every grounded profile
(:mod:`wispsim.model.physical`) reads. ``alternatives`` refit the form with some parameters held
fixed (no per-arrival engine cost, the ideal roofline without overlap), to show what each term is
worth on the same runs. The quick size skips the fits and checks the shipped parameters on a few
runs.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

import pandas as pd
import yaml

from wispsim.errors import ConfigError
from wispsim.model.physical import calibration, generation_efficiency
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
    groups = spec.get("groups")
    if groups is not None:
        unknown = sorted({str(g) for g in groups} - set(runs.group))
        if unknown:
            raise ConfigError(
                f"experiments/{spec.get('name', '?')}.yaml",
                "groups",
                f"unknown group {unknown[0]!r}; groups are in experiments/data/public/runs.csv",
            )
        keep = keep[keep.group.isin([str(g) for g in groups])]
    keep = keep[~keep.run_id.isin([str(x) for x in spec.get("exclude_runs", [])])]
    only = spec.get("runs")
    return keep[keep.run_id.isin(only)] if only else keep


PARAMETER_KEYS = ("efficiency", "overlap", "overhead_ms", "host_cpu_speed")


def _rounded(params: dict[str, Any]) -> dict[str, Any]:
    """The parameters at 4 significant digits, in the calibration file's layout."""
    out: dict[str, Any] = {}
    for key in PARAMETER_KEYS:
        v = params.get(key)
        if isinstance(v, dict):
            out[key] = {k: float(f"{x:.4g}") for k, x in v.items()}
        elif v is not None:
            out[key] = float(f"{v:.4g}")
    return out


def _fit(
    ctx: Context,
    runs: pd.DataFrame,
    folder: str,
    base: dict[str, Any],
    cal_ids: list[str],
    fixed: dict[str, Any],
) -> dict[str, Any]:
    """Calibrate on ``cal_ids`` with the parameters in ``fixed`` (``section.key`` or ``overlap``)
    held at their given values."""
    start = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    held = set()
    for path, value in fixed.items():
        sec, _, key = str(path).rpartition(".")
        if sec:
            start.setdefault(sec, {})[key] = float(value)
        else:
            start[key] = float(value)
        held.add((sec or "roofline", key))
    fitted = tuple(f for f in public.FITTED if (f[0], f[1]) not in held)
    cal_runs = runs[runs.run_id.isin(cal_ids)]
    ctx.progress(f"public: calibrating {len(fitted)} parameters on {len(cal_runs)} runs")
    fit = public.calibrate(
        cal_runs, folder, start, lambda n, c: ctx.progress(f"public: fit {n}, cost {c:.4f}"), fitted
    )
    return fit.params


def _write_calibration(
    spec: dict[str, Any],
    shipped: dict[str, Any],
    params: dict[str, Any],
    summary: pd.DataFrame,
    cal_ids: list[str],
) -> None:
    table = yaml.safe_load((package_data() / "roofline.yaml").read_text())
    engine = str(spec.get("engine", "vllm"))
    old = table.get(engine) or {}
    same = {k: old.get(k) for k in _rounded(params)} == _rounded(params)
    if same and old.get("calibrated_on") == ", ".join(cal_ids):
        # the same parameters on the same runs: the calibration (and every profile that embeds its
        # fit record) is kept as it was written; REPORT.md has this run's held-out figures
        kept = f"wispsim/data/roofline.yaml kept (fit of {old['fit']['date']})"
        print(f"{engine} calibration unchanged: {kept}")
        return
    fam = summary.set_index(["set", "family"])["median"]
    table[engine] = {
        **_rounded(params),
        "noise_sigma": shipped.get("noise_sigma", 0.05),
        "noise_basis": shipped.get("noise_basis", ""),
        "calibrated_on": ", ".join(cal_ids),
        "fit": {
            "study": "experiments/public.yaml (experiments/REPORT.md, public GPU measurements)",
            "date": f"{_dt.date.today():%Y-%m-%d}",
            **{
                f"{split.replace('-', '_')}_median_ape_pct": {
                    f: float(fam.get((split, f), float("nan"))) for f in public.FAMILIES
                }
                for split in ("calibration", "held-out")
            },
        },
    }
    header = (
        "# Calibrated engine parameters of the roofline form (wispsim.model.roofline), by engine.\n"
        "# Written by `wispsim experiment run public` (experiments/public.yaml); do not edit by hand.\n"
    )
    (package_data() / "roofline.yaml").write_text(header + yaml.safe_dump(table, sort_keys=False))


def _by_group(errors: pd.DataFrame) -> pd.DataFrame:
    fam = {m: f for f, ms in public.FAMILIES.items() for m in ms}
    return (
        errors.assign(family=errors.metric.map(fam))
        .groupby(["set", "group", "family"])
        .ape_pct.median()
        .unstack("family")
        .round(1)
        .reset_index()
    )


def _by_gpu(errors: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    fam = {m: f for f, ms in public.FAMILIES.items() for m in ms}
    gpu = runs.set_index("run_id").gpu
    return (
        errors.assign(family=errors.metric.map(fam), gpu=errors.run_id.map(gpu))
        .groupby(["set", "gpu", "family"])
        .ape_pct.median()
        .unstack("family")
        .round(1)
        .reset_index()
    )


def _ttft_parts(runs: pd.DataFrame, folder: str, params: dict[str, Any]) -> pd.DataFrame:
    """Each deployment's lightest run (lowest concurrency or rate) and the one after it, with
    real mean TTFT and the simulated mean TTFT by its parts."""
    rows = []
    for _, g in runs.groupby("group", sort=False):
        load = g.concurrency.fillna(g.request_rate).fillna(1e9)
        for _, row in g.loc[load.sort_values(kind="stable").index[:2]].iterrows():
            real = row.get("ttft_mean_ms")
            if (
                not isinstance(real, float)
                or not real > 0
                or "ttft" in str(row.get("excluded_metrics") or "")
            ):
                continue
            f = public.simulate_run(row, folder, params)
            rows.append(
                {
                    "run": row["run_id"],
                    "real TTFT": real,
                    "sim TTFT": f["ttft_mean_ms"],
                    **{p: f[f"ttft_{p}_mean_ms"] for p in ("frontend", "step_wait", "queue", "prefill")},
                }
            )
    return pd.DataFrame(rows)


@STUDIES.register("public")
def study_public(ctx: Context) -> Section:
    spec = ctx.spec
    folder = str(public.data_dir())
    runs = _selected(public.load_runs(folder), spec)
    cal_ids = [str(x) for x in spec.get("calibration", [])]
    shipped = calibration(str(spec.get("engine", "vllm")))
    # the fit starts from the spec's ``fit_start`` (so a rerun reproduces it) or the shipped values
    base = dict(spec.get("fit_start") or {k: shipped[k] for k in PARAMETER_KEYS if k in shipped})
    # ``fix``: parameters the shipped fit holds (e.g. a term the mechanisms leave no room for)
    params = (
        _fit(ctx, runs, folder, base, cal_ids, dict(spec.get("fix") or {})) if spec.get("fit", True) else base
    )
    ctx.progress(f"public: simulating {len(runs)} runs")
    errors = public.compare(runs, folder, params, cal_ids)
    ctx.simulated += len(runs)
    errors.to_csv(ctx.out / "errors.csv", index=False)
    summary = public.summary(errors)
    summary.to_csv(ctx.out / "summary.csv", index=False)
    (ctx.out / "calibration.yaml").write_text(yaml.safe_dump(_rounded(params), sort_keys=False))
    if spec.get("write_calibration") and not ctx.quick:
        _write_calibration(spec, shipped, params, summary, cal_ids)
    # the same fit with terms held fixed: what each is worth
    variants = [("all parameters fitted (shipped)", params, summary)]
    for alt in spec.get("alternatives", []) if spec.get("fit", True) else []:
        # an alternative may fit on other runs (leave one source out: its own calibration list)
        alt_cal = [str(x) for x in alt.get("calibration", cal_ids)]
        alt_params = _fit(ctx, runs, folder, base, alt_cal, dict(alt.get("fix", {})))
        alt_errors = public.compare(runs, folder, alt_params, alt_cal)
        ctx.simulated += len(runs)
        slug = re.sub(r"[^a-z0-9]+", "-", str(alt["name"]).lower()).strip("-")
        alt_errors.to_csv(ctx.out / f"errors-{slug}.csv", index=False)
        variants.append((str(alt["name"]), alt_params, public.summary(alt_errors)))
    fig = public_tpot(errors, ctx.out / "public_tpot.png")

    gens = {g: generation_efficiency(g) for g in ("ampere", "hopper")}
    kernels = "; ".join(
        f"{g.capitalize()}: bandwidth {e['bandwidth']:.2f}, compute {e['compute']:.2f}, overlap "
        f"{e['overlap']:.2f}, {e['kernel_us']:.1f} us per matmul kernel"
        for g, e in gens.items()
    )
    floor = gens["hopper"]["elementwise_floor_us"]
    sec = Section(spec.get("title", "Public GPU measurements"))
    sec.body += [
        f"{len(runs)} public runs ({runs.group.nunique()} deployments; data and provenance: "
        "`experiments/data/public/README.md`), each simulated as it ran on the physical profile of its "
        f"architecture, GPU, TP and precision. Calibration runs ({len(cal_ids)}): "
        + ", ".join(f"`{r}`" for r in cal_ids)
        + ". The kernel efficiencies are not fitted here: they are each GPU generation's, measured at "
        f"kernel level (`wispsim/data/efficiency.yaml`, `python -m wispsim.study.gpu_kernels`; {kernels}; "
        f"elementwise floor {floor:.0f} us per layer). Fitted engine overheads (ms; the all-reduce "
        "latency is the interconnect's; the engine core's CPU per step, per request and per new "
        "request is measured on vLLM (`wispsim/data/host_cpu.yaml`): what is fitted is the GPU "
        "servers' CPU speed against the measuring host's):",
        "",
    ]
    rows = []
    for name, p, summ in variants:
        r = _rounded(p)
        fam = summ.set_index(["set", "family"])["median"]
        rows.append(
            {
                "variant": name,
                **{f"eff {k}": v for k, v in r.get("efficiency", {}).items() if k != "attention"},
                **({"overlap": r["overlap"]} if "overlap" in r else {}),
                **{k: v for k, v in r["overhead_ms"].items() if k != "allreduce"},
                **({"host CPU speed": r["host_cpu_speed"]} if "host_cpu_speed" in r else {}),
                **{f"held-out {f}": fam.get(("held-out", f), float("nan")) for f in public.FAMILIES},
            }
        )
    sec.body += md_table(pd.DataFrame(rows), "{:.4g}")
    sec.body += [
        "",
        "Absolute percentage error per metric family, shipped parameters (median and mean over runs "
        "and the family's metrics):",
        "",
    ]
    sec.body += md_table(summary)
    sec.body += ["", "Median APE per deployment:", ""]
    sec.body += md_table(_by_group(errors))
    sec.body += ["", "Median APE per GPU (the A100 runs are in no fit: leave one GPU out):", ""]
    sec.body += md_table(_by_gpu(errors, runs))
    sec.body += ["", f"![median TPOT, simulated vs real]({ctx.rel(fig)})", ""]
    parts = _ttft_parts(runs, folder, params)
    parts.to_csv(ctx.out / "ttft_parts.csv", index=False)
    sec.body += [
        "TTFT by its parts at each deployment's lightest load (simulated means, ms: the API server, "
        "the wait for the next step the request can join, queueing, its prefill chunks) against the "
        "real mean TTFT:",
        "",
    ]
    sec.body += md_table(parts, "{:.4g}")
    sec.body += [""]
    memory = public.memory_check(folder)
    memory.to_csv(ctx.out / "memory_check.csv", index=False)
    sec.body += [
        "The memory facts against what the servers logged (per GPU; the implied reserve is GPU memory "
        "x utilization - weights - KV, beside wispsim's: vLLM's start-up profile at the run's "
        "`max_num_seqs` and `max_num_batched_tokens`, `wispsim/model/startup.py`; and the KV tokens "
        "each side gives the server):",
        "",
    ]
    sec.body += md_table(memory, "{:.4g}")
    sec.facts.update({"parameters": _rounded(params), "runs": len(runs)})
    return sec
