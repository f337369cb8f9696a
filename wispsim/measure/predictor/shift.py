"""Distribution shift: a predictor trained on one prompt family, tested on others.

Each model kind is trained on one trace as ``wispsim predictor train`` trains it (same labels,
by-sample splits and operating threshold) and scored on every given trace: the training trace
itself on its held-out test samples (the in-distribution baseline), any other trace on all its
samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.measure.predictor.evaluate import classification_metrics, proba
from wispsim.measure.predictor.labels import label_trace, label_traces, split_set
from wispsim.measure.predictor.train import fit_one
from wispsim.model.acceptance import find_trace, load_trace


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
