"""Export trained rejection predictors as plain arrays, and time them (SPEC 6).

The simulator must run a trained predictor without scikit-learn, XGBoost or LightGBM, so each
library model is turned into the small ``.npz`` layout that :mod:`wispsim.model.predictor` evaluates
with NumPy (format described there). Every exporter keeps its library's exact decision rule:
XGBoost sends ``x < threshold`` left and compares single-precision inputs; LightGBM sends
``x <= threshold`` left in double precision; scikit-learn sends ``x <= threshold`` left after
casting inputs to single precision. Missing-value routing is not exported: trace features are
always finite.

The native library model is saved beside the ``.npz`` (``NAME.native.joblib``, a pickle, for
local benchmarking only) so ``wispsim predictor bench`` (:mod:`~wispsim.measure.predictor.bench`)
can compare both implementations.
This module imports the training libraries lazily (optional extra ``ml``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from wispsim.errors import WispsimError
from wispsim.model.predictor import FORMAT

ML_HINT = "install the ml extra: pip install 'wispsim[ml]'"


def require_ml(module: str) -> Any:
    """Import a training library, or fail with the one-line hint to install the ``ml`` extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise WispsimError(f"{module} is not installed; {ML_HINT}") from None


# --------------------------------------------------------------------------------------------
# library model -> arrays
# --------------------------------------------------------------------------------------------


def _flat_trees(trees: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate per-tree node tables (child indices stay local to each tree)."""
    sizes = [len(t["left"]) for t in trees]
    return {
        "tree_offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        "node_feature": np.concatenate([t["feature"] for t in trees]).astype(np.int32),
        "node_threshold": np.concatenate([t["threshold"] for t in trees]).astype(np.float64),
        "node_left": np.concatenate([t["left"] for t in trees]).astype(np.int32),
        "node_right": np.concatenate([t["right"] for t in trees]).astype(np.int32),
        "node_value": np.concatenate([t["value"] for t in trees]).astype(np.float64),
    }


def export_mlp(model: Any) -> dict[str, np.ndarray]:
    """A scikit-learn ``Pipeline(StandardScaler, MLPClassifier)``."""
    scaler, mlp = model[0], model[-1]
    if mlp.out_activation_ != "logistic":
        raise WispsimError(f"MLP output activation {mlp.out_activation_!r}: only binary models export")
    arrays: dict[str, np.ndarray] = {
        "scaler_mean": np.asarray(scaler.mean_, np.float64),
        "scaler_scale": np.asarray(scaler.scale_, np.float64),
        "n_layers": np.array(len(mlp.coefs_)),
        "activation": np.array(mlp.activation),
        "out_activation": np.array(mlp.out_activation_),
    }
    for i, (w, b) in enumerate(zip(mlp.coefs_, mlp.intercepts_, strict=True)):
        arrays[f"W{i}"] = np.asarray(w, np.float64)
        arrays[f"b{i}"] = np.asarray(b, np.float64)
    return arrays


def export_rf(model: Any) -> dict[str, np.ndarray]:
    """A scikit-learn ``RandomForestClassifier``: mean over trees of the leaf's P(class 1)."""
    pos = int(np.flatnonzero(model.classes_ == 1)[0])
    trees = []
    for est in model.estimators_:
        t = est.tree_
        leaf = t.children_left < 0
        counts = t.value[:, 0, :]
        frac = counts[:, pos] / counts.sum(axis=1)
        trees.append(
            {
                "feature": np.where(leaf, 0, t.feature),
                "threshold": np.where(leaf, 0.0, t.threshold),
                "left": t.children_left,
                "right": t.children_right,
                "value": np.where(leaf, frac, 0.0),
            }
        )
    return {
        **_flat_trees(trees),
        "decision": np.array("<="),
        "feature_dtype": np.array("float32"),
        "combine": np.array("mean"),
        "base_margin": np.array(0.0),
        "sigmoid_scale": np.array(1.0),
    }


def _xgb_base_margin(raw: str) -> float:
    """XGBoost stores the intercept as a probability, e.g. ``'[6.7E-1]'`` (3.x) or ``'6.7E-1'``."""
    p = float(np.float32(float(raw.strip("[]"))))
    return float(np.log(p / (1.0 - p)))


def export_xgboost(model: Any) -> dict[str, np.ndarray]:
    """An ``XGBClassifier`` with ``binary:logistic``: sigmoid(base margin + sum of leaf values)."""
    doc = json.loads(model.get_booster().save_raw("json"))
    learner = doc["learner"]
    if learner["objective"]["name"] != "binary:logistic":
        raise WispsimError(f"xgboost objective {learner['objective']['name']!r}: need binary:logistic")
    trees = []
    for t in learner["gradient_booster"]["model"]["trees"]:
        left = np.asarray(t["left_children"], np.int64)
        leaf = left < 0
        cond = np.asarray(t["split_conditions"], np.float32).astype(np.float64)
        trees.append(
            {
                "feature": np.where(leaf, 0, np.asarray(t["split_indices"])),
                "threshold": np.where(leaf, 0.0, cond),
                "left": left,
                "right": np.asarray(t["right_children"], np.int64),
                "value": np.where(leaf, cond, 0.0),
            }
        )
    return {
        **_flat_trees(trees),
        "decision": np.array("<"),
        "feature_dtype": np.array("float32"),
        "combine": np.array("sigmoid_sum"),
        "base_margin": np.array(_xgb_base_margin(learner["learner_model_param"]["base_score"])),
        "sigmoid_scale": np.array(1.0),
    }


def _lgb_tree(root: dict[str, Any]) -> dict[str, np.ndarray]:
    """Flatten LightGBM's nested ``tree_structure`` into node arrays (pre-order)."""
    feature: list[int] = []
    threshold: list[float] = []
    left: list[int] = []
    right: list[int] = []
    value: list[float] = []

    def visit(node: dict[str, Any]) -> int:
        i = len(feature)
        feature.append(0)
        threshold.append(0.0)
        left.append(-1)
        right.append(-1)
        value.append(0.0)
        if "leaf_value" in node:
            value[i] = float(node["leaf_value"])
            return i
        if node.get("decision_type") != "<=" or node.get("missing_type") == "Zero":
            raise WispsimError(
                "lightgbm: only numerical '<=' splits without zero-as-missing export "
                f"(got {node.get('decision_type')!r}, missing {node.get('missing_type')!r})"
            )
        feature[i] = int(node["split_feature"])
        threshold[i] = float(node["threshold"])
        left[i] = visit(node["left_child"])
        right[i] = visit(node["right_child"])
        return i

    visit(root)
    return {
        "feature": np.asarray(feature),
        "threshold": np.asarray(threshold),
        "left": np.asarray(left),
        "right": np.asarray(right),
        "value": np.asarray(value),
    }


def export_lightgbm(model: Any) -> dict[str, np.ndarray]:
    """An ``LGBMClassifier`` (binary): sigmoid(scale * sum of leaves); the init score is in the leaves."""
    doc = model.booster_.dump_model()
    objective = str(doc.get("objective", ""))
    if not objective.startswith("binary") or doc.get("num_tree_per_iteration", 1) != 1:
        raise WispsimError(f"lightgbm objective {objective!r}: need a binary model")
    if doc.get("average_output"):
        raise WispsimError("lightgbm: random-forest mode (average_output) does not export")
    scale = 1.0
    for part in objective.split():
        if part.startswith("sigmoid:"):
            scale = float(part.split(":", 1)[1])
    trees = [_lgb_tree(t["tree_structure"]) for t in doc["tree_info"]]
    return {
        **_flat_trees(trees),
        "decision": np.array("<="),
        "feature_dtype": np.array("float64"),
        "combine": np.array("sigmoid_sum"),
        "base_margin": np.array(0.0),
        "sigmoid_scale": np.array(scale),
    }


EXPORTERS = {"mlp": export_mlp, "xgboost": export_xgboost, "lightgbm": export_lightgbm, "rf": export_rf}


def write_npz(
    path: Path,
    kind: str,
    model: Any,
    features: tuple[str, ...],
    threshold: float,
    k: int,
    meta: dict[str, Any],
) -> Path:
    """Write the exported model (compressed, no pickles) and return its path."""
    arrays = EXPORTERS[kind](model)
    path.parent.mkdir(parents=True, exist_ok=True)
    content: dict[str, Any] = {
        "format": np.array(FORMAT),
        "kind": np.array(kind),
        "features": np.array(features),
        "threshold": np.array(float(threshold)),
        "k": np.array(int(k)),
        "meta": np.array(json.dumps(meta, default=str)),
        **arrays,
    }
    np.savez_compressed(path, **content)
    return path


def native_path(npz: Path) -> Path:
    return npz.with_name(npz.name.removesuffix(".npz") + ".native.joblib")


def save_native(npz: Path, model: Any) -> Path:
    joblib = require_ml("joblib")
    out = native_path(npz)
    joblib.dump(model, out)
    return out
