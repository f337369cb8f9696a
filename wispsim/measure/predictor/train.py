"""Train rejection predictors on acceptance traces (SPEC 6).

Labels follow verification, not the raw per-position flags: each sample is walked in windows of
K drafted positions. A window starting at t covers t..t+K-1; positions up to and including the
first rejection get labels (accepted = 1, the first rejection = 0); later positions are dropped
because verification never reaches them; the next window starts right after the first rejection
(the target commits its own token there) or after the window when all were accepted.

Splits are by sample, never by token (neighbouring positions of one generation are strongly
correlated): a seeded 20 % of the samples is the test set, and 20 % of the remaining samples is
the validation set on which the operating threshold is chosen -- the one that maximizes recall on
accepted tokens (Rec1, speculative coverage) subject to a false-positive rate on rejected tokens
of at most ``max_fpr`` (a false positive at the first rejection is what wastes drafting). Models
are fitted on the rest. The MLP's own early stopping holds out a random 10 % of those rows (by
token): it only decides when to stop, the reported metrics come from the by-sample test split.

The features are :data:`wispsim.model.acceptance.FEATURES`, optionally plus the position in the window
(``window_position``). The simulator cannot supply that position (it is unknown before
drafting), so models meant for ``drafting.predictor: {name: npz}`` are trained without it.

scikit-learn, XGBoost and LightGBM are imported lazily (optional extra ``ml``).
"""

from __future__ import annotations

import datetime as _dt
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from wispsim import __version__
from wispsim.errors import WispsimError
from wispsim.measure.predictor.export import require_ml, save_native, write_npz
from wispsim.model.acceptance import FEATURES, Trace, accept_runs, find_trace, load_trace
from wispsim.provenance import distribution_versions, file_sha256

MODEL_KINDS = ("mlp", "xgboost", "lightgbm", "rf")
LabelFrom = Literal["accept", "greedy", "beta"]
LABEL_SOURCES: tuple[str, ...] = ("accept", "greedy", "beta")
WINDOW_FEATURE = "window_position"


# --------------------------------------------------------------------------------------------
# labels
# --------------------------------------------------------------------------------------------


def window_labels(accept: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels of one sample's positions under verification windows of ``k``.

    Returns ``(positions, labels, offsets)``: the labelled positions in order, their labels (1
    accepted, 0 first rejection of its window) and their offsets in the window (0..k-1).
    Positions after a window's first rejection are absent.
    """
    if k < 1:
        raise WispsimError(f"--k: must be >= 1, got {k}")
    acc = np.asarray(accept, dtype=bool)
    n = len(acc)
    run = accept_runs(acc)
    pos: list[np.ndarray] = []
    t = 0
    while t < n:
        span = min(k, n - t)
        accepted = min(int(run[t]), span)
        labelled = accepted + 1 if accepted < span else span
        pos.append(np.arange(t, t + labelled))
        t += labelled if accepted < span else k
    positions = np.concatenate(pos) if pos else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([np.full(len(p), p[0]) for p in pos]) if pos else positions
    return positions, acc[positions].astype(np.int8), positions - starts


@dataclass(frozen=True, slots=True)
class LabeledSet:
    """Labelled positions of one or more traces: features, labels, and which sample each came from."""

    x: np.ndarray  # (n, features)
    y: np.ndarray  # int8, 1 = accepted
    group: np.ndarray  # int64, one id per (trace, sample)
    row: np.ndarray  # int64, row of the (sorted) trace the position came from
    offset: np.ndarray  # int64, position in its verification window
    features: tuple[str, ...]

    def take(self, mask: np.ndarray) -> LabeledSet:
        return LabeledSet(
            self.x[mask], self.y[mask], self.group[mask], self.row[mask], self.offset[mask], self.features
        )


def trace_accepts(trace: Trace, label_from: str, seed: int) -> np.ndarray:
    """Which positions of ``trace`` count as accepted: the realized flag, greedy agreement, or a
    seeded Bernoulli(beta) draw."""
    if label_from == "accept":
        return trace.flag
    if label_from == "greedy":
        return trace.greedy
    if label_from == "beta":
        return np.random.default_rng(seed).random(len(trace.beta)) < trace.beta
    raise WispsimError(f"--label-from: unknown source {label_from!r}; allowed: {', '.join(LABEL_SOURCES)}")


def label_trace(
    trace: Trace,
    k: int = 8,
    label_from: str = "accept",
    seed: int = 0,
    window_position: bool = False,
    group_base: int = 0,
) -> LabeledSet:
    """Labelled positions of every sample of ``trace`` (groups numbered from ``group_base``)."""
    acc = trace_accepts(trace, label_from, seed)
    rows, ys, groups, offs = [], [], [], []
    for i, (s, n) in enumerate(zip(trace.starts, trace.lengths, strict=True)):
        pos, y, off = window_labels(acc[s : s + n], k)
        rows.append(pos + s)
        ys.append(y)
        offs.append(off)
        groups.append(np.full(len(pos), group_base + i, dtype=np.int64))
    row = np.concatenate(rows)
    offset = np.concatenate(offs)
    x = trace.features[row]
    names: tuple[str, ...] = FEATURES
    if window_position:
        x = np.column_stack([x, offset.astype(np.float64)])
        names = (*FEATURES, WINDOW_FEATURE)
    return LabeledSet(x, np.concatenate(ys), np.concatenate(groups), row, offset, names)


def label_traces(
    paths: list[str], k: int, label_from: str, seed: int, window_position: bool
) -> tuple[LabeledSet, list[Trace]]:
    """Label several traces into one set; sample ids are made unique across traces."""
    if not paths:
        raise WispsimError("--trace: give at least one trace file")
    traces = [load_trace(str(find_trace(p))) for p in paths]
    parts, base = [], 0
    for i, tr in enumerate(traces):
        parts.append(label_trace(tr, k, label_from, seed + 1000 * i, window_position, base))
        base += tr.samples
    joined = LabeledSet(
        np.concatenate([p.x for p in parts]),
        np.concatenate([p.y for p in parts]),
        np.concatenate([p.group for p in parts]),
        np.concatenate([p.row for p in parts]),
        np.concatenate([p.offset for p in parts]),
        parts[0].features,
    )
    return joined, traces


# --------------------------------------------------------------------------------------------
# splits, models, metrics
# --------------------------------------------------------------------------------------------


def split_groups(groups: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of the rows whose group falls in a seeded ``fraction`` of the groups."""
    ids = np.unique(groups)
    if len(ids) < 2:
        raise WispsimError(f"need at least 2 samples to split by sample, got {len(ids)}")
    n_held = min(len(ids) - 1, max(1, round(fraction * len(ids))))
    held = np.random.default_rng(seed).permutation(ids)[:n_held]
    return np.isin(groups, held)


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


def proba(model: Any, x: np.ndarray) -> np.ndarray:
    """The library's P(accept) for each row."""
    return np.asarray(model.predict_proba(x)[:, 1], dtype=np.float64)


def operating_threshold(p: np.ndarray, y: np.ndarray, max_fpr: float) -> float:
    """Smallest threshold (so the largest Rec1) whose false-positive rate on rejected <= ``max_fpr``.

    The rule is "accept when p >= threshold"; the threshold is placed halfway between the chosen
    validation score and the next lower one, so tiny numerical differences do not flip decisions.
    """
    neg = np.sort(p[y == 0])
    if len(neg) == 0 or len(p) == 0:
        return 0.5
    cand = np.unique(np.r_[p, np.nextafter(p.max(), np.inf)])
    fp = len(neg) - np.searchsorted(neg, cand, side="left")  # rejected with p >= candidate
    ok = np.flatnonzero(fp / len(neg) <= max_fpr)
    i = int(ok[0])
    return float(cand[0] if i == 0 else (cand[i] + cand[i - 1]) / 2)


def classification_metrics(y: np.ndarray, p: np.ndarray, threshold: float) -> dict[str, Any]:
    """SPEC 6 metrics at ``threshold``; positive class = accepted."""
    pred = p >= threshold
    pos, neg = y == 1, y == 0
    tp, fn = int(np.sum(pred & pos)), int(np.sum(~pred & pos))
    fp, tn = int(np.sum(pred & neg)), int(np.sum(~pred & neg))
    rec1 = tp / max(tp + fn, 1)
    spec = tn / max(tn + fp, 1)
    auc = float("nan")
    if pos.any() and neg.any():
        auc = float(require_ml("sklearn.metrics").roc_auc_score(y, p))
    return {
        "threshold": float(threshold),
        "n": len(y),
        "accept_rate": float(pos.mean()) if len(y) else float("nan"),
        "accuracy": (tp + tn) / max(len(y), 1),
        "auc": auc,
        "rec1": rec1,
        "specificity": spec,
        "fpr": 1.0 - spec if (tn + fp) else float("nan"),
        "balanced_accuracy": (rec1 + spec) / 2,
        # rows: true (rejected, accepted); columns: predicted (rejected, accepted)
        "confusion": [[tn / max(tn + fp, 1), fp / max(tn + fp, 1)], [fn / max(tp + fn, 1), rec1]],
    }


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Split:
    """The three by-sample parts of a labelled set."""

    fit: LabeledSet
    val: LabeledSet
    test: LabeledSet


def split_set(data: LabeledSet, seed: int, test_fraction: float = 0.2, val_fraction: float = 0.2) -> Split:
    test = split_groups(data.group, test_fraction, seed)
    rest = data.take(~test)
    val = split_groups(rest.group, val_fraction, seed + 1)
    return Split(rest.take(~val), rest.take(val), data.take(test))


@dataclass
class Trained:
    """One fitted model, its operating threshold and its test metrics."""

    kind: str
    model: Any
    threshold: float
    metrics: dict[str, Any]  # at the operating threshold (test split)
    metrics_05: dict[str, Any]  # at 0.5 (test split)
    params: dict[str, Any]
    npz: Path | None = None
    native: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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
        "command": " ".join(["wispsim", *sys.argv[1:]]) if sys.argv else "",
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
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
        tr = fit_one(kind, split, max_fpr, seed, fast, overrides)
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


def metrics_frame(results: list[Trained]) -> pd.DataFrame:
    """One row per model and operating point (the chosen threshold, then 0.5)."""
    rows = []
    for t in results:
        for point, m in (("max-fpr", t.metrics), ("0.5", t.metrics_05)):
            c = m["confusion"]
            rows.append(
                {
                    "model": t.kind,
                    "point": point,
                    "threshold": m["threshold"],
                    "accuracy": m["accuracy"],
                    "auc": m["auc"],
                    "rec1": m["rec1"],
                    "specificity": m["specificity"],
                    "fpr": m["fpr"],
                    "bal_acc": m["balanced_accuracy"],
                    "cm_rr": c[0][0],
                    "cm_ra": c[0][1],
                    "cm_ar": c[1][0],
                    "cm_aa": c[1][1],
                }
            )
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# distribution shift
# --------------------------------------------------------------------------------------------


def shift_matrix(
    train_path: str,
    test_paths: list[str],
    kinds: list[str],
    k: int = 8,
    max_fpr: float = 0.15,
    seed: int = 0,
    label_from: str = "accept",
    fast: bool = False,
    overrides: dict[str, Any] | None = None,
) -> pd.DataFrame:
    """Train on one trace (one prompt family), test on each given trace.

    A test trace that is the training trace itself is scored on its held-out test samples (the
    in-distribution baseline); any other trace is scored on all its samples.
    """
    data, (train_trace,) = label_traces([train_path], k, label_from, seed, False)
    split = split_set(data, seed)
    rows = []
    for kind in kinds:
        tr = fit_one(kind, split, max_fpr, seed, fast, overrides)
        for tp in test_paths:
            test_trace = load_trace(str(find_trace(tp)))
            if Path(test_trace.path).resolve() == Path(train_trace.path).resolve():
                test, name = split.test, f"{Path(tp).stem} (held out)"
            else:
                test = label_trace(test_trace, k, label_from, seed, False)
                name = Path(tp).stem
            m = classification_metrics(test.y, proba(tr.model, test.x), tr.threshold)
            rows.append(
                {
                    "model": kind,
                    "train": Path(train_path).stem,
                    "test": name,
                    "n": m["n"],
                    "accept_rate": m["accept_rate"],
                    "threshold": tr.threshold,
                    "auc": m["auc"],
                    "rec1": m["rec1"],
                    "fpr": m["fpr"],
                    "bal_acc": m["balanced_accuracy"],
                    "accuracy": m["accuracy"],
                }
            )
    return pd.DataFrame(rows)
