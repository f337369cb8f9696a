"""Fit the verification-time estimator to measured latencies (``wispsim profile fit``, SPEC 4).

``T = a*N_linear + b_compute*N_interactions + b_read*N_cached + c`` is fitted by ordinary least
squares (``numpy.linalg.lstsq`` on columns scaled to unit maximum) to the *training*
configurations only; the held-out test configurations are only predicted. A profile's
coefficients must be >= 0, so with ``method="auto"`` a fit with a negative coefficient (a term
the data cannot resolve, e.g. b_read on a CPU where reading the cache is nearly free) is redone
by non-negative least squares (``scipy.optimize.nnls``) and the report says so; ``ols`` refuses
such a fit and ``nnls`` always uses the constrained solver.

Reported, as in the WISP paper: 95% percentile intervals from 1000 bootstrap resamples of the
training rows; 5-fold cross-validated R^2 (and MAPE) on the training rows; train and test R^2,
adjusted R^2, RMSE, MAE, MAPE and max error; errors by regime (plan category); the noise model's
sigma (standard deviation of log(actual / predicted) on the training rows); plots of actual vs
predicted (with the +-10% band) and of the residuals; a markdown report.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.errors import WispsimError
from wispsim.model.measured import AGGREGATES, read_measurements
from wispsim.model.profiles import COEFFICIENTS

METHODS = ("auto", "ols", "nnls")
N_PREDICTORS = 3


def design(df: pd.DataFrame) -> np.ndarray:
    """Rows [N_linear, N_interactions, N_cached, 1]."""
    x = df[AGGREGATES].to_numpy(dtype=float)
    return np.column_stack([x, np.ones(len(x))])


def solve(x: np.ndarray, y: np.ndarray, method: str) -> np.ndarray:
    """Least-squares coefficients (a, b_compute, b_read, c); ``method`` is ``ols`` or ``nnls``."""
    scale = np.abs(x).max(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    xs = x / scale
    if method == "nnls":
        from scipy.optimize import nnls

        coef, _ = nnls(xs, y)
    else:
        coef = np.linalg.lstsq(xs, y, rcond=None)[0]
    return np.asarray(coef / scale, dtype=float)


def metrics(y: np.ndarray, pred: np.ndarray, predictors: int = N_PREDICTORS) -> dict[str, float]:
    """R^2, adjusted R^2, RMSE, MAE, MAPE and max error (times in ms)."""
    n = len(y)
    if n == 0:
        return {"n": 0}
    err = pred - y
    ss_res = float(np.sum(err**2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else float("nan")
    adj = 1 - (1 - r2) * (n - 1) / (n - predictors - 1) if n > predictors + 1 else float("nan")
    return {
        "n": n,
        "r2": r2,
        "adj_r2": adj,
        "rmse_ms": 1e3 * math.sqrt(ss_res / n),
        "mae_ms": 1e3 * float(np.mean(np.abs(err))),
        "mape_pct": 100 * float(np.mean(np.abs(err) / y)),
        "max_error_ms": 1e3 * float(np.max(np.abs(err))),
    }


@dataclass
class FitResult:
    coef: dict[str, float]
    ci95: dict[str, tuple[float, float]]
    method: str
    note: str
    train: dict[str, float]
    test: dict[str, float]
    cv: dict[str, float]
    sigma: float
    by_category: pd.DataFrame
    predictions: pd.DataFrame
    bootstrap: int
    seed: int
    run_cv_median: float = float("nan")
    extra: dict[str, Any] = field(default_factory=dict)


def _bootstrap(x: np.ndarray, y: np.ndarray, method: str, n: int, rng: np.random.Generator) -> np.ndarray:
    out = np.empty((n, x.shape[1]))
    for i in range(n):
        idx = rng.integers(0, len(y), len(y))
        out[i] = solve(x[idx], y[idx], method)
    return out


def _cross_validate(x: np.ndarray, y: np.ndarray, method: str, folds: int, rng: np.random.Generator) -> dict:
    if len(y) < 2 * folds:
        return {"folds": folds, "r2_mean": float("nan"), "r2_std": float("nan")}
    order = rng.permutation(len(y))
    r2s, mapes = [], []
    for k in range(folds):
        test = order[k::folds]
        train = np.setdiff1d(order, test)
        m = metrics(y[test], x[test] @ solve(x[train], y[train], method))
        r2s.append(m["r2"])
        mapes.append(m["mape_pct"])
    return {
        "folds": folds,
        "r2_mean": float(np.mean(r2s)),
        "r2_std": float(np.std(r2s, ddof=1)),
        "mape_pct_mean": float(np.mean(mapes)),
    }


def fit(
    df: pd.DataFrame, method: str = "auto", bootstrap: int = 1000, folds: int = 5, seed: int = 0
) -> FitResult:
    """Fit on ``df``'s train rows; predict every row."""
    if method not in METHODS:
        raise WispsimError(f"--method: got {method!r}; allowed: {', '.join(METHODS)}")
    if bootstrap < 0:
        raise WispsimError(f"--bootstrap: must be >= 0, got {bootstrap}")
    train = df[df.split == "train"]
    if len(train) < N_PREDICTORS + 2:
        raise WispsimError(f"need at least {N_PREDICTORS + 2} timed train configurations, got {len(train)}")
    x, y = design(train), train.latency_s.to_numpy(dtype=float)
    note = ""
    used = "ols" if method == "auto" else method
    coef = solve(x, y, used)
    negative = [k for k, v in zip(COEFFICIENTS, coef, strict=True) if v < 0]
    if negative and method == "ols":
        raise WispsimError(
            f"OLS gives negative {', '.join(negative)} ({', '.join(f'{v:.3g}' for v in coef)}); a profile "
            "needs coefficients >= 0: use --method nnls (or auto)"
        )
    if negative and method == "auto":
        ols = dict(zip(COEFFICIENTS, coef, strict=True))
        used = "nnls"
        coef = solve(x, y, used)
        note = (
            f"OLS gave negative {', '.join(negative)} "
            f"({', '.join(f'{k}={ols[k]:.3g}' for k in negative)}): refitted by non-negative least squares"
        )
    rng = np.random.default_rng(seed)
    boot = _bootstrap(x, y, used, bootstrap, rng) if bootstrap else np.empty((0, 4))
    ci95 = {}
    for j, k in enumerate(COEFFICIENTS):
        if bootstrap:
            lo, hi = np.percentile(boot[:, j], [2.5, 97.5])
            # a percentile interval need not contain the point estimate; a profile's must
            ci95[k] = (float(min(lo, coef[j])), float(max(hi, coef[j])))
    cv = _cross_validate(x, y, used, folds, rng)
    pred = design(df) @ coef
    preds = df[["config_id", "split", "category", *AGGREGATES, "latency_s"]].copy()
    preds["predicted_s"] = pred
    preds["error_s"] = pred - preds.latency_s
    preds["rel_error"] = preds.error_s / preds.latency_s
    is_train = (preds.split == "train").to_numpy()
    ratio = preds.latency_s.to_numpy()[is_train] / np.maximum(pred[is_train], 1e-12)
    sigma = float(np.std(np.log(ratio), ddof=1)) if is_train.sum() > 1 else 0.0
    rows = []
    for (split, cat), g in preds.groupby(["split", "category"], sort=True):
        m = metrics(g.latency_s.to_numpy(), g.predicted_s.to_numpy())
        rows.append({"split": split, "category": cat, "mean_latency_ms": 1e3 * g.latency_s.mean(), **m})
    run_cv = float(df.cv.median()) if "cv" in df else float("nan")
    return FitResult(
        coef=dict(zip(COEFFICIENTS, (float(v) for v in coef), strict=True)),
        ci95=ci95,
        method=used,
        note=note,
        train=metrics(y, x @ coef),
        test=metrics(df[df.split == "test"].latency_s.to_numpy(dtype=float), pred[~is_train]),
        cv=cv,
        sigma=sigma,
        by_category=pd.DataFrame(rows),
        predictions=preds,
        bootstrap=bootstrap,
        seed=seed,
        run_cv_median=run_cv,
    )


# ---------------------------------------------------------------------------------------------
# the profile YAML
# ---------------------------------------------------------------------------------------------


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(f"{v:.{digits}g}")


def read_meta(data: Path) -> dict[str, Any]:
    p = Path(str(data) + ".meta.json")
    return json.loads(p.read_text()) if p.is_file() else {}


def profile_dict(
    res: FitResult,
    data: Path,
    out: Path,
    meta: dict[str, Any],
    *,
    name: str,
    command: str,
    gpu: str | None = None,
    gpu_count: int = 1,
    memory_gib: float | None = None,
) -> dict[str, Any]:
    """The fitted profile as a mapping that :func:`wispsim.model.profiles.parse_profile` accepts."""
    facts = meta.get("model_facts") or {}
    host = meta.get("host") or {}
    need = ("parameters", "layers", "kv_heads", "head_dim", "kv_dtype_bytes", "weight_bytes")
    missing = [k for k in need if k not in facts]
    if missing:
        raise WispsimError(
            f"{data}.meta.json: no model facts ({', '.join(missing)} missing); record with "
            "`wispsim profile record`, which writes them"
        )
    device = str(meta.get("device", "cpu"))
    if gpu is None:
        if device.startswith("cuda"):
            gpu = str(host.get("gpu", "GPU"))
        else:
            gpu = f"CPU: {host.get('cpu', '?')} ({host.get('torch_threads', '?')} threads)"
    if memory_gib is None:
        memory_gib = host.get("gpu_memory_gib") if device.startswith("cuda") else host.get("memory_gib")
    if not memory_gib:
        raise WispsimError(
            "the data's meta file does not say how much memory the device has: give --memory-gib"
        )
    rel = os.path.relpath(data.resolve(), out.resolve().parent)
    coefficients: dict[str, dict[str, Any]] = {}
    for k in COEFFICIENTS:
        value = float(f"{res.coef[k]:.6g}")
        coefficients[k] = {"value": value}
        if k in res.ci95:  # rounding must not push the value out of its interval
            lo, hi = (float(f"{v:.6g}") for v in res.ci95[k])
            coefficients[k]["ci95"] = [min(lo, value), max(hi, value)]

    by_cat = {
        f"{r['split']}/{r['category']}": {
            "n": int(r["n"]),
            "mae_ms": _r(r["mae_ms"]),
            "mape_pct": _r(r["mape_pct"]),
        }
        for r in res.by_category.to_dict("records")
    }
    return {
        "name": name,
        "description": (
            f"{facts.get('name', '?')} {meta.get('dtype', '?')} on {gpu_count}x {gpu}, "
            f"{meta.get('engine', '?')} engine (measured and fitted by wispsim)"
        ),
        "hardware": {"gpu": gpu, "count": gpu_count, "memory_gib": _r(float(memory_gib))},
        "engine": f"{meta.get('engine', '?')} (attention: {meta.get('attention', '?')})",
        "precision": str(meta.get("dtype", "?")),
        "model": {
            "name": str(facts.get("name", "?")),
            **({"arch": facts["arch"]} if facts.get("arch") else {}),
            "parameters": float(facts["parameters"]),
            "layers": int(facts["layers"]),
            **({"attention_heads": int(facts["attention_heads"])} if "attention_heads" in facts else {}),
            "kv_heads": int(facts["kv_heads"]),
            "head_dim": int(facts["head_dim"]),
            **({"hidden_size": int(facts["hidden_size"])} if "hidden_size" in facts else {}),
            **(
                {"intermediate_size": int(facts["intermediate_size"])} if "intermediate_size" in facts else {}
            ),
            "vocab_size": int(facts.get("vocab_size", 151936)),
            "kv_dtype_bytes": int(facts["kv_dtype_bytes"]),
            "weight_bytes": float(facts["weight_bytes"]),
        },
        "coefficients": coefficients,
        "fit": {
            "method": res.method,
            **({"note": res.note} if res.note else {}),
            "configurations": {"train": int(res.train["n"]), "test": int(res.test["n"])},
            "bootstrap_resamples": res.bootstrap,
            "seed": res.seed,
            **{
                key: {"train": _r(res.train.get(key)), "test": _r(res.test.get(key))}
                for key in ("r2", "adj_r2", "rmse_ms", "mae_ms", "mape_pct", "max_error_ms")
            },
            f"cv{res.cv['folds']}_r2": {"mean": _r(res.cv["r2_mean"]), "std": _r(res.cv["r2_std"])},
            "run_cv_median": _r(res.run_cv_median),
            "by_category": by_cat,
        },
        "noise": {
            "model": "lognormal",
            "sigma": _r(res.sigma),
            "basis": "standard deviation of log(actual / predicted) over the training configurations",
        },
        "provenance": {
            "kind": "measured",
            "data": rel,
            "command": command,
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "recorded_command": meta.get("command"),
            "recorded_date": meta.get("date"),
            "plan": meta.get("plan"),
            "plan_command": (meta.get("plan_meta") or {}).get("command"),
            "random_weights": bool(facts.get("random_weights", False)),
            "host": {k: host[k] for k in ("cpu", "cpu_count", "gpu", "platform") if k in host},
            "versions": meta.get("versions"),
        },
    }


# ---------------------------------------------------------------------------------------------
# plots and report
# ---------------------------------------------------------------------------------------------


def plot_fit(res: FitResult, folder: Path, title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = res.predictions
    ms_y, ms_p = 1e3 * p.latency_s, 1e3 * p.predicted_s
    lo, hi = float(min(ms_y.min(), ms_p.min())), float(max(ms_y.max(), ms_p.max()))
    log = hi / max(lo, 1e-9) > 20
    fig, ax = plt.subplots(figsize=(6, 5.5))
    line = np.geomspace(max(lo, 1e-6) * 0.8, hi * 1.25, 100) if log else np.linspace(0, hi * 1.1, 100)
    ax.fill_between(line, line * 0.9, line * 1.1, color="0.85", label="+-10%")
    ax.plot(line, line, color="0.4", lw=1)
    for split, marker in (("train", "o"), ("test", "^")):
        s = p[p.split == split]
        ax.scatter(1e3 * s.predicted_s, 1e3 * s.latency_s, marker=marker, s=18, label=f"{split} ({len(s)})")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("predicted (ms)")
    ax.set_ylabel("measured (ms)")
    ax.set_title(f"{title}: measured vs predicted")
    ax.legend()
    fig.tight_layout()
    a = folder / "actual_vs_predicted.png"
    fig.savefig(a, dpi=120)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for cat, g in p.groupby("category"):
        axes[0].scatter(1e3 * g.predicted_s, 1e3 * g.error_s, s=14, label=cat)
        axes[1].scatter(1e3 * g.predicted_s, 100 * g.rel_error, s=14, label=cat)
    for ax, lab in zip(axes, ("predicted - measured (ms)", "relative error (%)"), strict=True):
        ax.axhline(0, color="0.4", lw=1)
        ax.set_xlabel("predicted (ms)")
        ax.set_ylabel(lab)
        if log:
            ax.set_xscale("log")
    axes[1].axhspan(-10, 10, color="0.9", zorder=0)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title}: residuals by regime")
    fig.tight_layout()
    b = folder / "residuals.png"
    fig.savefig(b, dpi=120)
    plt.close(fig)
    return [a, b]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.4g}"
    return str(v)


def report_markdown(
    res: FitResult, prof: dict[str, Any], data: Path, folder: Path, profile_path: Path
) -> str:
    rel = os.path.relpath(folder.resolve(), profile_path.resolve().parent)
    lines = [
        f"# Fit report: {prof['name']}",
        "",
        f"Profile: `{profile_path.name}`. Data: `{data}` ({res.train['n']} train and "
        f"{res.test.get('n', 0)} test configurations timed). Model: {prof['model']['name']}, "
        f"{prof['precision']}, on "
        f"{prof['hardware']['count']}x {prof['hardware']['gpu']}, engine {prof['engine']}.",
        "",
        f"Fit: {res.method.upper()} on the training configurations; 95% intervals from {res.bootstrap} "
        "bootstrap resamples (percentile).",
    ]
    if res.note:
        lines += ["", f"Note: {res.note}."]
    lines += ["", "| coefficient | value | 95% CI |", "|---|---|---|"]
    for k in COEFFICIENTS:
        ci = res.ci95.get(k)
        lines.append(f"| {k} | {res.coef[k]:.4g} | " + (f"[{ci[0]:.4g}, {ci[1]:.4g}] |" if ci else "- |"))
    lines += ["", "| metric | train | test |", "|---|---|---|"]
    for key in ("n", "r2", "adj_r2", "rmse_ms", "mae_ms", "mape_pct", "max_error_ms"):
        lines.append(
            f"| {key} | {_fmt(res.train.get(key, float('nan')))} | {_fmt(res.test.get(key, float('nan')))} |"
        )
    lines += [
        "",
        f"{res.cv['folds']}-fold cross-validation on train: R^2 {_fmt(res.cv['r2_mean'])} +- "
        f"{_fmt(res.cv['r2_std'])}, MAPE {_fmt(res.cv.get('mape_pct_mean', float('nan')))}%.",
        f"Noise model: log-normal, sigma {res.sigma:.4g} (std of log(measured / predicted) on train). "
        f"Median run-to-run coefficient of variation: {_fmt(res.run_cv_median)}.",
        "",
        "Errors by regime:",
        "",
        "| split | category | n | mean latency (ms) | MAE (ms) | MAPE (%) | max error (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res.by_category.itertuples():
        lines.append(
            f"| {r.split} | {r.category} | {r.n} | {_fmt(r.mean_latency_ms)} | {_fmt(r.mae_ms)} | "
            f"{_fmt(r.mape_pct)} | {_fmt(r.max_error_ms)} |"
        )
    lines += [
        "",
        f"![measured vs predicted]({rel}/actual_vs_predicted.png)",
        "",
        f"![residuals]({rel}/residuals.png)",
        "",
        f"Per-configuration predictions: `{rel}/predictions.csv`.",
        "",
    ]
    return "\n".join(lines)


def report_path(profile: Path) -> Path:
    """The markdown fit report, beside the profile: ``profiles/NAME.report.md``."""
    return profile.with_name(profile.stem + ".report.md")


def fit_command(
    data: Path,
    out: Path,
    *,
    name: str | None = None,
    method: str = "auto",
    bootstrap: int = 1000,
    folds: int = 5,
    seed: int = 0,
    gpu: str | None = None,
    gpu_count: int = 1,
    memory_gib: float | None = None,
    plots: bool = True,
    command: str = "",
) -> tuple[FitResult, dict[str, Any]]:
    """Fit ``data``; write the profile YAML to ``out``, ``NAME.report.md`` and ``NAME.fit/`` beside it."""
    import yaml

    from wispsim.model.profiles import parse_profile

    df = read_measurements(data)
    res = fit(df, method, bootstrap, folds, seed)
    name = name or out.stem
    prof = profile_dict(
        res,
        data,
        out,
        read_meta(data),
        name=name,
        command=command
        or f"wispsim profile fit {data} --out {out} --method {method} --bootstrap {bootstrap}",
        gpu=gpu,
        gpu_count=gpu_count,
        memory_gib=memory_gib,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    text = (
        f"# Verification-time profile fitted by wispsim from {data.name}; see {out.stem}.report.md\n"
        + yaml.safe_dump(prof, sort_keys=False, width=100)
    )
    parse_profile(yaml.safe_load(text), str(out))  # never write a profile that does not load
    out.write_text(text)
    folder = out.parent / f"{out.stem}.fit"
    folder.mkdir(exist_ok=True)
    res.predictions.to_csv(folder / "predictions.csv", index=False)
    res.by_category.to_csv(folder / "by_category.csv", index=False)
    if plots:
        plot_fit(res, folder, name)
    report_path(out).write_text(report_markdown(res, prof, data, folder, out))
    return res, prof
