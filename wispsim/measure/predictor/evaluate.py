"""How well a rejection predictor separates accepted from rejected drafted tokens.

A predictor's rule is "accept when P(accept) >= threshold". The operating threshold is chosen on
the validation split: the one that maximizes recall on accepted tokens (Rec1, speculative
coverage) subject to a false-positive rate on rejected tokens of at most ``max_fpr`` (a false
positive at the first rejection is what wastes drafting). The SPEC 6 metrics -- accuracy, AUC,
Rec1, specificity, false-positive rate, balanced accuracy and the normalized confusion matrix --
are then computed on the by-sample test split, at that threshold and at 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.measure.predictor.export import require_ml


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
