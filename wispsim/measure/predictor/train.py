"""Train rejection predictors on acceptance traces (SPEC 6).

Traces are labelled and split by sample (:mod:`~wispsim.measure.predictor.labels`); each model
kind is fitted on the fit split, its operating threshold chosen on the validation split and its
metrics computed on the test split (:mod:`~wispsim.measure.predictor.evaluate`); each is then
exported to ``.npz`` for the simulator (:mod:`~wispsim.measure.predictor.export`) with its
provenance: the traces and their hashes, the command, the date and the library versions. The
MLP's own early stopping holds out a random 10 % of the fit rows (by token): it only decides
when to stop, the reported metrics come from the by-sample test split.

scikit-learn, XGBoost and LightGBM are imported lazily (optional extra ``ml``).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np

from wispsim.errors import WispsimError
from wispsim.measure.predictor.evaluate import Trained, classification_metrics, operating_threshold, proba
from wispsim.measure.predictor.export import require_ml, save_native, write_npz
from wispsim.measure.predictor.labels import Split, label_traces, split_set
from wispsim.model.acceptance import Trace
from wispsim.provenance import command_line, distribution_versions, file_sha256, now_iso
from wispsim.version import __version__

MODEL_KINDS = ("mlp", "xgboost", "lightgbm", "rf")


def default_params(kind: str, seed: int, fast: bool = False) -> dict[str, Any]:
    """Constructor arguments per model kind; ``fast`` gives tiny models for tests and smoke runs."""
    if kind == "mlp":
        return {
            "hidden_layer_sizes": (16, 8) if fast else (512, 128, 64),
            "activation": "relu",
            "early_stopping": True,
            "validation_fraction": 0.1,
            "n_iter_no_change": 10,
            "max_iter": 30 if fast else 300,
            "random_state": seed,
        }
    if kind == "xgboost":
        return {
            "n_estimators": 8 if fast else 200,
            "max_depth": 3 if fast else 5,
            "learning_rate": 0.3 if fast else 0.05,
            "subsample": 0.8,
            "tree_method": "hist",
            "objective": "binary:logistic",
            "random_state": seed,
            "n_jobs": 1 if fast else -1,
        }
    if kind == "lightgbm":
        return {
            "n_estimators": 8 if fast else 200,
            "num_leaves": 7 if fast else 31,
            "max_depth": 3 if fast else 8,  # leaf-wise growth otherwise makes 25-deep trees
            "learning_rate": 0.3 if fast else 0.05,
            "min_child_samples": 20,
            "random_state": seed,
            "deterministic": True,
            "n_jobs": 1 if fast else -1,
            "verbose": -1,
        }
    if kind == "rf":
        return {
            "n_estimators": 8 if fast else 100,
            "max_depth": 4 if fast else 10,
            "min_samples_leaf": 10,
            "random_state": seed,
            "n_jobs": 1 if fast else -1,
        }
    raise WispsimError(f"--model: unknown model {kind!r}; allowed: {', '.join(MODEL_KINDS)}, all")


def make_model(kind: str, params: dict[str, Any]) -> Any:
    """An unfitted library estimator with ``predict_proba`` (the MLP standardizes its inputs)."""
    if kind == "mlp":
        pipeline = require_ml("sklearn.pipeline")
        prep = require_ml("sklearn.preprocessing")
        nn = require_ml("sklearn.neural_network")
        return pipeline.make_pipeline(prep.StandardScaler(), nn.MLPClassifier(**params))
    if kind == "xgboost":
        return require_ml("xgboost").XGBClassifier(**params)
    if kind == "lightgbm":
        return require_ml("lightgbm").LGBMClassifier(**params)
    if kind == "rf":
        return require_ml("sklearn.ensemble").RandomForestClassifier(**params)
    raise WispsimError(f"--model: unknown model {kind!r}; allowed: {', '.join(MODEL_KINDS)}, all")


def own_params(
    kinds: list[str], seed: int, fast: bool, overrides: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Each model's share of the ``--param`` overrides: the arguments its library takes (one no
    model of ``kinds`` takes, or a value out of a library's range, is one line before any work)."""
    names = {}
    for kind in kinds:
        model = make_model(kind, default_params(kind, seed, fast))
        est = model.steps[-1][1] if hasattr(model, "steps") else model
        names[kind] = set(est.get_params(deep=False))
    unused = [k for k in overrides if not any(k in n for n in names.values())]
    if unused:
        allowed = ", ".join(sorted(set().union(*names.values())))
        raise WispsimError(
            f"--param: {unused[0]}: no model of {', '.join(kinds)} takes it; allowed: {allowed}"
        )
    own = {kind: {k: v for k, v in overrides.items() if k in names[kind]} for kind in kinds}
    for kind in kinds:
        if own[kind]:
            check_params(kind, {**default_params(kind, seed, fast), **own[kind]}, own[kind])
    return own


def check_params(kind: str, params: dict[str, Any], overrides: dict[str, Any]) -> None:
    """``--param`` overrides the library accepts for ``kind`` (a name it does not know, or a value
    out of its range, one line before any work)."""
    try:
        model = make_model(kind, params)
        est = model.steps[-1][1] if hasattr(model, "steps") else model
        if hasattr(est, "_parameter_constraints"):  # scikit-learn's own check of every argument
            est._validate_params()
    except Exception as e:  # the libraries raise TypeError, ValueError or their own kinds
        given = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
        why = " ".join(str(e).split())[:160]
        raise WispsimError(f"--param: {given} not accepted by the {kind} model: {why}") from None


def fit_one(
    kind: str,
    split: Split,
    max_fpr: float,
    seed: int,
    fast: bool = False,
    overrides: dict[str, Any] | None = None,
) -> Trained:
    """Fit ``kind`` on the fit part, choose its threshold on validation, score it on test."""
    params = {**default_params(kind, seed, fast), **(overrides or {})}
    model = make_model(kind, params)
    model.fit(split.fit.x, split.fit.y)
    thr = operating_threshold(proba(model, split.val.x), split.val.y, max_fpr)
    p_test = proba(model, split.test.x)
    return Trained(
        kind,
        model,
        thr,
        classification_metrics(split.test.y, p_test, thr),
        classification_metrics(split.test.y, p_test, 0.5),
        params,
    )


def library_versions() -> dict[str, str]:
    out = {"wispsim": __version__, "python": platform.python_version(), "numpy": np.__version__}
    return out | distribution_versions(("scikit-learn", "xgboost", "lightgbm"))


def provenance(traces: list[Trace], **settings: Any) -> dict[str, Any]:
    """Where a predictor came from: traces (with metadata and hashes), command, date, versions."""
    return {
        "traces": [{"path": t.path, "sha256": file_sha256(t.path), "metadata": t.metadata} for t in traces],
        "command": command_line(),
        "date": now_iso(),
        "versions": library_versions(),
        "cpu_platform": platform.platform(),
        **settings,
    }


def out_path(out: Path, kind: str, several: bool) -> Path:
    """``NAME.npz`` for one model, ``NAME-KIND.npz`` for each when several are trained."""
    if not several:
        return out
    return out.with_name(f"{out.name.removesuffix('.npz')}-{kind}.npz")


def train(
    trace_paths: list[str],
    kinds: list[str],
    out: Path | None,
    k: int = 8,
    max_fpr: float = 0.15,
    seed: int = 0,
    label_from: str = "accept",
    window_position: bool = False,
    fast: bool = False,
    overrides: dict[str, Any] | None = None,
) -> tuple[list[Trained], dict[str, Any]]:
    """Label, split, fit every model kind, export each to ``.npz`` (when ``out`` is given).

    Returns the trained models and the report (settings, split sizes, provenance, metrics).
    """
    if not 0 <= max_fpr <= 1:
        raise WispsimError(f"--max-fpr: must be in [0, 1], got {max_fpr}")
    for kind in kinds:
        default_params(kind, seed)  # unknown names fail before any work
    own = own_params(kinds, seed, fast, overrides or {})
    data, traces = label_traces(trace_paths, k, label_from, seed, window_position)
    split = split_set(data, seed)
    sizes = {
        part: {"samples": len(np.unique(s.group)), "positions": len(s.y), "accept_rate": float(s.y.mean())}
        for part, s in (("fit", split.fit), ("val", split.val), ("test", split.test))
    }
    settings = {
        "k": k,
        "max_fpr": max_fpr,
        "seed": seed,
        "label_from": label_from,
        "features": list(data.features),
        "window_position": window_position,
        "fast": fast,
        "split": sizes,
    }
    prov = provenance(traces, **settings)
    results = []
    for kind in kinds:
        tr = fit_one(kind, split, max_fpr, seed, fast, own[kind])
        if out is not None:
            meta = {
                "kind": kind,
                "threshold": tr.threshold,
                "metrics": tr.metrics,
                "metrics_at_0.5": tr.metrics_05,
                "params": tr.params,
                "provenance": prov,
            }
            tr.npz = write_npz(
                out_path(out, kind, len(kinds) > 1), kind, tr.model, data.features, tr.threshold, k, meta
            )
            tr.native = save_native(tr.npz, tr.model)
        results.append(tr)
    report = {
        **prov,
        "models": {
            t.kind: {
                "npz": str(t.npz) if t.npz else None,
                "threshold": t.threshold,
                "metrics": t.metrics,
                "metrics_at_0.5": t.metrics_05,
                "params": t.params,
            }
            for t in results
        },
    }
    return results, report
