"""Fit the verification-time estimator to measured latencies (``wispsim profile fit``, SPEC 4).

``T = a*N_linear + b_compute*N_interactions + b_read*N_cached + c`` (the paper's ``additive``
form; any form of :data:`wispsim.model.estimator.FORMS`, e.g. ``per-request`` with ``+ d*B``) is
fitted by ordinary least squares (``numpy.linalg.lstsq`` on columns scaled to unit maximum) to the *training*
configurations only; the held-out test configurations are only predicted. A profile's
coefficients must be >= 0, so with ``method="auto"`` a fit with a negative coefficient (a term
the data cannot resolve, e.g. b_read on a CPU where reading the cache is nearly free) is redone
by non-negative least squares (``scipy.optimize.nnls``) and the report says so; ``ols`` refuses
such a fit and ``nnls`` always uses the constrained solver.

Computed, as in the WISP paper: 95% percentile intervals from 1000 bootstrap resamples of the
training rows; 5-fold cross-validated R^2 (and MAPE) on the training rows; train and test R^2,
adjusted R^2, RMSE, MAE, MAPE and max error; errors by regime (plan category); the noise model's
sigma (standard deviation of log(actual / predicted) on the training rows). The profile YAML and
the markdown report are written by :mod:`~wispsim.measure.profile.fit_report`, the figures by
:mod:`wispsim.plots.profile_fit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from wispsim.errors import WispsimError
from wispsim.model.estimator import DEFAULT_FORM, FORMS
from wispsim.model.measured import AGGREGATES

METHODS = ("auto", "ols", "nnls")
N_PREDICTORS = 3


def design(df: pd.DataFrame, form: str = DEFAULT_FORM) -> np.ndarray:
    """One row per configuration, one column per coefficient of ``form`` (additive:
    [N_linear, N_interactions, N_cached, 1])."""
    cols = [np.ones(len(df)) if c == "1" else df[c].to_numpy(dtype=float) for c in FORMS.get(form).columns]
    return np.column_stack(cols)


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
    form: str = DEFAULT_FORM


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
    df: pd.DataFrame,
    method: str = "auto",
    bootstrap: int = 1000,
    folds: int = 5,
    seed: int = 0,
    form: str = DEFAULT_FORM,
) -> FitResult:
    """Fit ``form`` on ``df``'s train rows; predict every row."""
    terms = FORMS.get(form, "--form", "form").terms
    if method not in METHODS:
        raise WispsimError(f"--method: got {method!r}; allowed: {', '.join(METHODS)}")
    if bootstrap < 0:
        raise WispsimError(f"--bootstrap: must be >= 0, got {bootstrap}")
    train = df[df.split == "train"]
    where = f"{df.attrs['source']}: " if df.attrs.get("source") else ""
    if len(train) < len(terms) + 1:
        need = len(terms) + 1
        raise WispsimError(f"{where}need at least {need} timed train configurations, got {len(train)}")
    if not 2 <= folds <= len(train):
        raise WispsimError(f"--folds: got {folds}; allowed: 2 to {len(train)} (the train rows)")
    x, y = design(train, form), train.latency_s.to_numpy(dtype=float)
    note = ""
    used = "ols" if method == "auto" else method
    coef = solve(x, y, used)
    negative = [k for k, v in zip(terms, coef, strict=True) if v < 0]
    if negative and method == "ols":
        raise WispsimError(
            f"OLS gives negative {', '.join(negative)} ({', '.join(f'{v:.3g}' for v in coef)}); a profile "
            "needs coefficients >= 0: use --method nnls (or auto)"
        )
    if negative and method == "auto":
        ols = dict(zip(terms, coef, strict=True))
        used = "nnls"
        coef = solve(x, y, used)
        note = (
            f"OLS gave negative {', '.join(negative)} "
            f"({', '.join(f'{k}={ols[k]:.3g}' for k in negative)}): refitted by non-negative least squares"
        )
    rng = np.random.default_rng(seed)
    boot = _bootstrap(x, y, used, bootstrap, rng) if bootstrap else np.empty((0, len(terms)))
    ci95 = {}
    for j, k in enumerate(terms):
        if bootstrap:
            lo, hi = np.percentile(boot[:, j], [2.5, 97.5])
            # a percentile interval need not contain the point estimate; a profile's must
            ci95[k] = (float(min(lo, coef[j])), float(max(hi, coef[j])))
    cv = _cross_validate(x, y, used, folds, rng)
    pred = design(df, form) @ coef
    preds = df[["config_id", "split", "category", *AGGREGATES, "latency_s"]].copy()
    preds["predicted_s"] = pred
    preds["error_s"] = pred - preds.latency_s
    preds["rel_error"] = preds.error_s / preds.latency_s
    is_train = (preds.split == "train").to_numpy()
    ratio = preds.latency_s.to_numpy()[is_train] / np.maximum(pred[is_train], 1e-12)
    sigma = float(np.std(np.log(ratio), ddof=1)) if is_train.sum() > 1 else 0.0
    rows = []
    for (split, cat), g in preds.groupby(["split", "category"], sort=True):
        m = metrics(g.latency_s.to_numpy(), g.predicted_s.to_numpy(), len(terms) - 1)
        rows.append({"split": split, "category": cat, "mean_latency_ms": 1e3 * g.latency_s.mean(), **m})
    run_cv = float(df.cv.median()) if "cv" in df else float("nan")
    return FitResult(
        coef=dict(zip(terms, (float(v) for v in coef), strict=True)),
        ci95=ci95,
        method=used,
        note=note,
        train=metrics(y, x @ coef, len(terms) - 1),
        test=metrics(df[df.split == "test"].latency_s.to_numpy(dtype=float), pred[~is_train], len(terms) - 1),
        cv=cv,
        sigma=sigma,
        by_category=pd.DataFrame(rows),
        predictions=preds,
        bootstrap=bootstrap,
        seed=seed,
        run_cv_median=run_cv,
        form=form,
    )
