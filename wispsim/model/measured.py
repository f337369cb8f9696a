"""Measured verification latencies: the recorder's CSV, and nearest-configuration look-up.

``wispsim profile record`` writes one row per configuration of a plan (the plan's columns, then
the timing: mean, spread and each measured run, the coefficient of variation, the engine, model,
device and dtype). ``wispsim profile fit`` fits the estimator to these rows, and the ``measured``
latency model replays them. :class:`MeasuredTable` finds the measured configuration nearest to a
batch in the space of the estimator's three aggregates (N_linear, N_interactions, N_cached),
each taken as log(1 + x) and divided by its range over the data, so that a factor of two counts
the same in every dimension and no dimension dominates by its units.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from wispsim.errors import WispsimError

TIMING_COLUMNS = [
    "status",
    "latency_s",
    "latency_std_s",
    "latency_min_s",
    "latency_max_s",
    "cv",
    "cv_ok",
    "runs_s",
    "warmup",
    "attempts",
    "prefix_build_s",
    "engine",
    "model",
    "device",
    "dtype",
    "recorded_at",
]
# the columns of a profiling plan (:mod:`wispsim.measure.profile.plan`): what each configuration batches
PLAN_COLUMNS = [
    "config_id",
    "split",
    "category",
    "seed",
    "batch_size",
    "l_new",
    "l_cached",
    "n_linear",
    "n_interactions",
    "n_cached",
    "max_l_total",
]

DATA_COLUMNS = PLAN_COLUMNS + TIMING_COLUMNS
AGGREGATES = ["n_linear", "n_interactions", "n_cached"]


def read_measurements(path: Path, *, ok_only: bool = True) -> pd.DataFrame:
    """Read a recorder CSV; with ``ok_only`` keep the configurations that were timed."""
    if not path.is_file():
        raise WispsimError(f"{path}: measurement file not found")
    try:
        df = pd.read_csv(path, dtype={"l_new": str, "l_cached": str, "runs_s": str, "config_id": str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise WispsimError(f"{path}: not a measurement CSV ({e})") from None
    need = ["config_id", "split", "category", *AGGREGATES, "status", "latency_s"]
    missing = [c for c in need if c not in df]
    if missing:
        raise WispsimError(f"{path}: not a measurement CSV: missing columns {', '.join(missing)}")
    if ok_only:
        df = df[df.status == "ok"].reset_index(drop=True)
        bad = df[~(df.latency_s > 0)]
        if len(bad):
            raise WispsimError(f"{path}: config {bad.config_id.iloc[0]!r}: latency_s must be > 0")
    return df


def run_times(df: pd.DataFrame) -> list[np.ndarray]:
    """Per row, the measured runs' times (falls back to the mean if ``runs_s`` is missing)."""
    if "runs_s" not in df:
        return [np.array([t]) for t in df.latency_s]
    out = []
    for text, mean in zip(df.runs_s, df.latency_s, strict=True):
        vals = [float(x) for x in str(text).split(";") if x not in ("", "nan")]
        out.append(np.array(vals) if vals else np.array([mean]))
    return out


class MeasuredTable:
    """The measured configurations of one data file, searchable by nearest aggregates."""

    def __init__(self, df: pd.DataFrame, source: str = "measurements") -> None:
        from scipy.spatial import cKDTree

        if df.empty:
            raise WispsimError(f"{source}: no successfully timed configurations")
        self.source = source
        self.points = df[AGGREGATES].to_numpy(dtype=float)
        self.latency = df.latency_s.to_numpy(dtype=float)
        self.runs = run_times(df)
        self.config_ids = df.config_id.astype(str).tolist()
        logs = np.log1p(self.points)
        self._lo = logs.min(axis=0)
        span = logs.max(axis=0) - self._lo
        self._span = np.where(span > 0, span, 1.0)
        self._tree = cKDTree((logs - self._lo) / self._span)

    def normalize(self, n_linear: float, n_interactions: float, n_cached: float) -> np.ndarray:
        return (np.log1p(np.array([n_linear, n_interactions, n_cached], dtype=float)) - self._lo) / self._span

    def inside(self, points: np.ndarray) -> np.ndarray:
        """Per row of ``points`` (N_linear, N_interactions, N_cached): whether each aggregate lies
        within the measured range (between the smallest and largest measured value), i.e. whether
        replay there interpolates rather than extrapolates along every axis."""
        pts = np.asarray(points, dtype=float).reshape(-1, 3)
        lo, hi = self.points.min(axis=0), self.points.max(axis=0)
        return np.all((pts >= lo) & (pts <= hi), axis=1)

    def nearest(self, n_linear: float, n_interactions: float, n_cached: float) -> int:
        """Row index of the measured configuration nearest to these aggregates."""
        _, i = self._tree.query(self.normalize(n_linear, n_interactions, n_cached))
        return int(i)


@cache
def _table(path: str, mtime: float) -> MeasuredTable:
    return MeasuredTable(read_measurements(Path(path)), path)


def load_table(path: Path) -> MeasuredTable:
    """A data file's table, cached per process (and re-read when the file changes)."""
    if not path.is_file():
        raise WispsimError(f"{path}: measurement file not found")
    return _table(str(path.resolve()), path.stat().st_mtime)
