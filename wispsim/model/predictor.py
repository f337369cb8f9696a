"""Rejection predictors: would the target accept the token just drafted? (SPEC 6)

A predictor maps draft-distribution features (columns :data:`wispsim.model.acceptance.FEATURES`) to a
decision "accept" (True) or "reject" (False). Predictors evaluate a whole response's positions at
once, so a device computes its decisions once per response instead of once per token.

- ``confidence``: a threshold on the draft's top-1 probability (the simplest thing that works).
- ``npz``: a trained model (MLP, XGBoost, LightGBM or random forest) exported by
  ``wispsim predictor train`` as plain arrays and evaluated here with NumPy alone, so the
  simulator never imports the training libraries. The file carries its own decision threshold.

Exported format (``format = "wispsim-predictor/1"``): ``kind``, ``features`` (names, in input
order), ``threshold`` (predict accept when P(accept) >= threshold), ``k`` (window used for the
labels), ``meta`` (JSON: metrics and provenance) and either

- MLP: ``scaler_mean``, ``scaler_scale``, ``W0..W{n-1}``, ``b0..b{n-1}``, ``activation`` (hidden
  layers) and ``out_activation`` (``logistic``); or
- trees: one flat node table for all trees (``node_feature``, ``node_threshold``, ``node_left``,
  ``node_right`` with -1 at leaves, ``node_value`` at leaves) and ``tree_offsets`` (tree i owns
  nodes ``tree_offsets[i]:tree_offsets[i+1]``; child indices are local to the tree), ``decision``
  (``<``: xgboost, ``<=``: lightgbm and scikit-learn; true goes left), ``feature_dtype``
  (``float32`` where the library compares single-precision inputs), ``combine`` (``sigmoid_sum``:
  sigmoid(scale * (base_margin + sum of leaves)); ``mean``: mean of the leaves' class-1
  probabilities), ``base_margin`` and ``sigmoid_scale``.

The simulator passes exactly the four FEATURES; a model trained with the extra window-position
feature cannot be used there (the position in the window is not known before drafting).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from wispsim.config import PredictorConfig
from wispsim.config.limits import MAX_DRAFT, finite
from wispsim.errors import ConfigError, WispsimError
from wispsim.model.acceptance import FEATURES
from wispsim.paths import predictors_dir, resolve_named
from wispsim.registry import Registry
from wispsim.tabular import check_file, describe, reading

FORMAT = "wispsim-predictor/1"
#: the model kinds ``wispsim predictor train`` exports (mlp; the others are tree ensembles)
KINDS = ("mlp", "xgboost", "lightgbm", "rf")


class Predictor(Protocol):
    def predict_accept(self, features: np.ndarray) -> np.ndarray:
        """Boolean array: True where the token is predicted to be accepted."""
        ...


PREDICTORS: Registry[type] = Registry("predictor")


@PREDICTORS.register("confidence")
class ConfidencePredictor:
    """Predict "accept" when the draft's top-1 probability is at least ``threshold``."""

    def __init__(self, cfg: PredictorConfig) -> None:
        self.threshold = 0.5 if cfg.threshold is None else cfg.threshold

    def predict_accept(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(features[:, 0] >= self.threshold)


# --------------------------------------------------------------------------------------------
# Exported models, evaluated with NumPy
# --------------------------------------------------------------------------------------------

_ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda h: np.maximum(h, 0.0),
    "tanh": np.tanh,
    "logistic": lambda h: 1.0 / (1.0 + np.exp(-h)),
    "identity": lambda h: h,
}


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-z)))


@dataclass(frozen=True, slots=True)
class MlpArrays:
    """A feed-forward network after a standard scaler (scikit-learn's MLPClassifier layout)."""

    mean: np.ndarray
    scale: np.ndarray
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    activation: str
    out_activation: str

    def proba(self, x: np.ndarray) -> np.ndarray:
        h = (x - self.mean) / self.scale
        act = _ACTIVATIONS[self.activation]
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w + b
            h = act(h) if i < last else _ACTIVATIONS[self.out_activation](h)
        return np.asarray(h[:, 0])


@dataclass(frozen=True, slots=True)
class TreeArrays:
    """All trees of an ensemble as one node table, walked for every tree and row at once.

    At load time leaves become self-loops (both children point at the leaf), so a walk of exactly
    ``depth`` steps ends at every tree's leaf without checking which rows are done.
    """

    roots: np.ndarray  # (trees,) global index of each root
    feature: np.ndarray  # (nodes,) feature index (0 at leaves)
    threshold: np.ndarray  # (nodes,)
    left: np.ndarray  # (nodes,) global index; self at leaves
    right: np.ndarray
    value: np.ndarray  # (nodes,) leaf value (0 inside)
    depth: int
    strict: bool  # "<" (xgboost) instead of "<="
    float32: bool
    combine: str
    base_margin: float
    sigmoid_scale: float

    def proba(self, x: np.ndarray) -> np.ndarray:
        if self.float32:
            x = x.astype(np.float32).astype(np.float64)
        n, nf = x.shape
        flat = x.ravel()
        row = (np.arange(n) * nf)[None, :]
        node = np.repeat(self.roots[:, None], n, axis=1)
        for _ in range(self.depth):
            xv = flat[row + self.feature[node]]
            thr = self.threshold[node]
            go_left = xv < thr if self.strict else xv <= thr
            node = np.where(go_left, self.left[node], self.right[node])
        leaves = self.value[node]
        if self.combine == "mean":
            return np.asarray(leaves.mean(axis=0))
        return _sigmoid(self.sigmoid_scale * (self.base_margin + leaves.sum(axis=0)))


def tree_depth(left: np.ndarray, right: np.ndarray, roots: np.ndarray) -> int:
    """Number of edges on the longest root-to-leaf path over all trees (leaves have left -1).

    A path longer than the node count means the children loop: a ValueError, not a hang."""
    depth = 0
    level = roots
    while True:
        inner = level[left[level] >= 0]
        if len(inner) == 0:
            return depth
        level = np.concatenate([left[inner], right[inner]])
        depth += 1
        if depth > len(left) or len(level) > 2 * len(left) * len(roots):
            raise ValueError("the trees' child indices form a loop")


def _trees_from_npz(z: Any) -> TreeArrays:
    offsets = z["tree_offsets"].astype(np.int64)
    counts = np.diff(offsets)
    base = np.repeat(offsets[:-1], counts)
    local_left = z["node_left"].astype(np.int64)
    local_right = z["node_right"].astype(np.int64)
    leaf = local_left < 0
    idx = np.arange(len(local_left))
    left = np.where(leaf, idx, local_left + base)
    right = np.where(leaf, idx, local_right + base)
    roots = offsets[:-1]
    glob_left = np.where(leaf, -1, left)
    return TreeArrays(
        roots=roots,
        feature=np.where(leaf, 0, z["node_feature"]).astype(np.int64),
        threshold=z["node_threshold"].astype(np.float64),
        left=left,
        right=right,
        value=np.where(leaf, z["node_value"], 0.0).astype(np.float64),
        depth=tree_depth(glob_left, right, roots),
        strict=str(z["decision"]) == "<",
        float32=str(z["feature_dtype"]) == "float32",
        combine=str(z["combine"]),
        base_margin=float(z["base_margin"]),
        sigmoid_scale=float(z["sigmoid_scale"]),
    )


def _mlp_from_npz(z: Any) -> MlpArrays:
    n = int(z["n_layers"])
    return MlpArrays(
        mean=z["scaler_mean"].astype(np.float64),
        scale=z["scaler_scale"].astype(np.float64),
        weights=tuple(z[f"W{i}"].astype(np.float64) for i in range(n)),
        biases=tuple(z[f"b{i}"].astype(np.float64) for i in range(n)),
        activation=str(z["activation"]),
        out_activation=str(z["out_activation"]),
    )


@dataclass(frozen=True, slots=True)
class ExportedPredictor:
    """A loaded ``.npz`` predictor: P(accept) from features, and its own decision threshold."""

    path: str
    kind: str
    features: tuple[str, ...]
    threshold: float
    k: int
    model: MlpArrays | TreeArrays
    meta: dict[str, Any] = field(default_factory=dict)

    def proba(self, features: np.ndarray) -> np.ndarray:
        """P(accept) for each row of ``features`` (columns in the order of ``self.features``)."""
        x = np.asarray(features, dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        return self.model.proba(x)

    def predict_accept(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(self.proba(features) >= self.threshold)


def find_predictor(path: str) -> Path:
    """``path`` as given, else under the shipped ``predictors/`` folder (or its parent)."""
    folder = predictors_dir()
    found = resolve_named(path, folder, (".npz",))
    if found is None and (folder.parent / path).is_file():
        found = folder.parent / path
    if found is None:
        known = ", ".join(sorted(p.name for p in folder.glob("*.npz"))) or "none"
        raise ConfigError(
            "scenario", "drafting.predictor.path", f"no predictor file {path!r}; shipped predictors: {known}"
        )
    return found


@functools.lru_cache(maxsize=16)
def load_exported(path: str) -> ExportedPredictor:
    """Read an exported predictor (cached: every run of a sweep uses the same file).

    Every array is checked (:func:`check_arrays`): a damaged, truncated or foreign file, a missing
    array, a wrong shape, a NaN weight or an index out of range is a one-line error naming it.
    """
    check_file(path, error=WispsimError)
    unreadable = "not a readable predictor file"
    with reading(path, "npz", WispsimError, failed=unreadable), np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    fmt = str(arrays["format"]) if "format" in arrays else "?"
    if fmt != FORMAT:
        raise WispsimError(f"{path}: not a wispsim predictor (format {fmt!r}, expected {FORMAT!r})")
    check_arrays(arrays, path)
    try:
        meta = json.loads(str(arrays["meta"]), parse_constant=lambda c: None)
    except (ValueError, RecursionError) as e:
        raise WispsimError(f"{path}: meta: not valid JSON ({describe(e)})") from None
    kind = str(arrays["kind"])
    with reading(path, "npz", WispsimError, failed=unreadable):
        model = _mlp_from_npz(arrays) if kind == "mlp" else _trees_from_npz(arrays)
    return ExportedPredictor(
        path=path,
        kind=kind,
        features=tuple(str(f) for f in arrays["features"]),
        threshold=float(arrays["threshold"]),
        k=int(arrays["k"]),
        model=model,
        meta=meta if isinstance(meta, dict) else {},
    )


_MLP_KEYS = ("scaler_mean", "scaler_scale", "n_layers", "activation", "out_activation")
_TREE_KEYS = (
    "tree_offsets",
    "node_feature",
    "node_threshold",
    "node_left",
    "node_right",
    "node_value",
    "decision",
    "feature_dtype",
    "combine",
    "base_margin",
    "sigmoid_scale",
)


def check_arrays(z: dict[str, np.ndarray], path: str) -> None:
    """The arrays of an exported predictor are complete, of the right shapes, finite and in range
    (the module docstring describes the format); else a one-line WispsimError naming the array."""

    def bad(name: str, what: str) -> WispsimError:
        return WispsimError(f"{path}: {name}: {what}")

    def need(*names: str) -> None:
        missing = [n for n in names if n not in z]
        if missing:
            raise bad(missing[0], f"missing array(s) {', '.join(missing)}")

    def scalar(name: str, kind: str) -> Any:
        a = z[name]
        if a.ndim != 0 or a.dtype.kind not in kind:
            raise bad(
                name, f"must be a single {'string' if kind == 'U' else 'number'}, got {a.dtype} {a.shape}"
            )
        return a.item()

    def numbers(name: str, ndim: int, integer: bool = False) -> np.ndarray:
        a = z[name]
        if a.ndim != ndim or a.dtype.kind not in ("iu" if integer else "iuf"):
            want = "integers" if integer else "numbers"
            raise bad(name, f"must be a {ndim}-D array of {want}, got {a.dtype} with shape {a.shape}")
        if not np.all(np.isfinite(a)):
            raise bad(name, "holds NaN or infinite values")
        return a

    need("kind", "features", "threshold", "k", "meta")
    kind = scalar("kind", "U")
    if kind not in KINDS:
        raise bad("kind", f"got {kind!r}; allowed: {', '.join(KINDS)}")
    feats = z["features"]
    if feats.ndim != 1 or feats.dtype.kind != "U" or len(feats) == 0:
        raise bad("features", f"must be a list of feature names, got {feats.dtype} {feats.shape}")
    nf = len(feats)
    thr = scalar("threshold", "iuf")
    if not (finite(thr) and 0 <= thr <= 1):
        raise bad("threshold", f"must be a probability in [0, 1], got {thr}")
    k = scalar("k", "iu")
    if not 1 <= k <= MAX_DRAFT:
        raise bad("k", f"must be an integer in [1, {MAX_DRAFT}], got {k}")
    scalar("meta", "U")
    if kind == "mlp":
        need(*_MLP_KEYS)
        n = scalar("n_layers", "iu")
        if not 1 <= n <= len(z):  # each layer is two arrays of the file
            raise bad("n_layers", f"must be an integer in [1, {len(z)}], got {n}")
        need(*(f"W{i}" for i in range(n)), *(f"b{i}" for i in range(n)))
        for name in ("activation", "out_activation"):
            act = scalar(name, "U")
            if act not in _ACTIVATIONS:
                raise bad(name, f"unknown activation {act!r}; known: {', '.join(_ACTIVATIONS)}")
        for name in ("scaler_mean", "scaler_scale"):
            if numbers(name, 1).shape != (nf,):
                raise bad(name, f"must hold {nf} values (one per feature), got {z[name].shape[0]}")
        if np.any(z["scaler_scale"] == 0):
            raise bad("scaler_scale", "holds a zero (division by zero)")
        width = nf
        for i in range(n):
            w, b = numbers(f"W{i}", 2), numbers(f"b{i}", 1)
            if w.shape[0] != width:
                raise bad(f"W{i}", f"has {w.shape[0]} rows, expected {width} (the previous layer's width)")
            if b.shape != (w.shape[1],):
                raise bad(f"b{i}", f"has shape {b.shape}, expected ({w.shape[1]},)")
            width = w.shape[1]
        if width != 1:
            raise bad(f"W{n - 1}", f"the output layer must have 1 unit, got {width}")
        return
    need(*_TREE_KEYS)
    off = numbers("tree_offsets", 1, integer=True)
    nodes = len(z["node_left"])
    if len(off) < 2 or off[0] != 0 or off[-1] != nodes or np.any(np.diff(off) < 1):
        raise bad("tree_offsets", f"must rise from 0 to the node count {nodes}, each tree with >= 1 node")
    for name in ("node_feature", "node_left", "node_right"):
        if numbers(name, 1, integer=True).shape != (nodes,):
            raise bad(name, f"must hold {nodes} values (one per node), got {z[name].shape[0]}")
    for name in ("node_threshold", "node_value"):
        a = z[name]
        if a.ndim != 1 or a.dtype.kind not in "iuf" or a.shape != (nodes,):
            raise bad(name, f"must hold {nodes} numbers (one per node), got {a.dtype} {a.shape}")
    leaf = z["node_left"] < 0
    size = np.repeat(np.diff(off), np.diff(off))
    for name in ("node_left", "node_right"):
        child = z[name][~leaf]
        if np.any((child < 0) | (child >= size[~leaf])):
            raise bad(name, "a child index lies outside its tree")
    if np.any(z["node_right"][leaf] >= 0):
        raise bad("node_right", "a leaf (node_left -1) has a right child")
    feat = z["node_feature"][~leaf]
    if np.any((feat < 0) | (feat >= nf)):
        raise bad("node_feature", f"a feature index lies outside 0..{nf - 1}")
    if not np.all(np.isfinite(z["node_threshold"][~leaf])):
        raise bad("node_threshold", "holds NaN or infinite values")
    if not np.all(np.isfinite(z["node_value"][leaf])):
        raise bad("node_value", "holds NaN or infinite values")
    for name, allowed in (
        ("decision", ("<", "<=")),
        ("feature_dtype", ("float32", "float64")),
        ("combine", ("sigmoid_sum", "mean")),
    ):
        v = scalar(name, "U")
        if v not in allowed:
            raise bad(name, f"got {v!r}; allowed: {', '.join(allowed)}")
    for name in ("base_margin", "sigmoid_scale"):
        v = scalar(name, "iuf")
        if not finite(v):
            raise bad(name, f"must be a finite number, got {v}")


@PREDICTORS.register("npz")
class NpzPredictor:
    """A trained predictor exported as arrays (``drafting.predictor: {name: npz, path: ...}``).

    The decision threshold is the one stored in the file (chosen for a low false-positive rate at
    training time) unless ``drafting.predictor.threshold`` sets another: a planner's knob for the
    operating point (a lower threshold drafts longer, so fewer server rounds per token).
    """

    def __init__(self, cfg: PredictorConfig) -> None:
        if not cfg.path:
            raise ConfigError("scenario", "drafting.predictor.path", "the npz predictor needs a path")
        self.model = load_exported(str(find_predictor(cfg.path)))
        if self.model.features != FEATURES:
            raise ConfigError(
                "scenario",
                "drafting.predictor.path",
                f"{self.model.path} was trained on features {', '.join(self.model.features)}; the "
                f"simulator supplies only {', '.join(FEATURES)} (train without --window-position)",
            )
        self.threshold = self.model.threshold if cfg.threshold is None else cfg.threshold

    def predict_accept(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(self.model.proba(features) >= self.threshold)


def make_predictor(cfg: PredictorConfig) -> Predictor:
    predictor: Predictor = PREDICTORS.get(cfg.name, field="drafting.predictor.name")(cfg)
    return predictor
