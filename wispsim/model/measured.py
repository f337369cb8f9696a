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

import math
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from wispsim.errors import ConfigError, WispsimError
from wispsim.model.cost import AggregateCost
from wispsim.tabular import numeric_column, read_table

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
    # the plan's lengths; l_new / l_cached are what the engine served (vLLM caches whole blocks)
    "l_new_plan",
    "l_cached_plan",
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


SPLITS = ("train", "test")


def read_measurements(path: Path, *, ok_only: bool = True) -> pd.DataFrame:
    """Read and check a recorder CSV; with ``ok_only`` keep the configurations that were timed.

    Checked (one-line errors naming the file, the column, the row and the value): ``split`` is
    train or test; the aggregates ``n_linear``, ``n_interactions``, ``n_cached`` are finite
    integers >= 0; on timed rows ``latency_s`` is a finite number > 0, ``cv`` (if present) a
    finite number >= 0 or empty, and every run of ``runs_s`` a finite number > 0.
    """
    src = str(path)
    if Path(path).is_dir() or not Path(path).is_file():
        raise WispsimError(f"{path}: measurement file not found")
    need = ["config_id", "split", "category", *AGGREGATES, "status", "latency_s"]
    df = read_table(
        path,
        kind="csv",
        columns=need,
        dtype={"l_new": str, "l_cached": str, "runs_s": str, "config_id": str, "split": str, "status": str},
    )
    dup = df.config_id.astype(str).duplicated().to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise ConfigError(src, "config_id", f"row {i + 1}: {df.config_id.iloc[i]!r} appears twice")
    if ok_only:
        status = df.status.astype(str).str.strip()
        left = status[status != "ok"].value_counts()
        df = df[status == "ok"]
        # configurations that were not timed (OOM, error), left out: the caller says how many
        df.attrs["not_timed"] = {str(k): int(v) for k, v in left.items()}
    rows = (df.index.to_numpy() + 1).tolist()  # the file's data rows, counted from 1
    df = df.reset_index(drop=True)
    split = df.split.astype(str).str.strip()
    bad = np.flatnonzero(~split.isin(SPLITS).to_numpy(bool))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(src, "split", f"row {rows[i]}: must be train or test, got {df.split.iloc[i]!r}")
    df["split"] = split
    for col in AGGREGATES:
        df[col] = numeric_column(df, col, src, integer=True, lo=0, rows=rows)
    if ok_only:
        df["latency_s"] = numeric_column(df, "latency_s", src, lo=0, lo_open=True, rows=rows)
        if "cv" in df:
            df["cv"] = numeric_column(df, "cv", src, lo=0, allow_empty=True, rows=rows)
        if "runs_s" in df:
            for i, text in enumerate(df.runs_s):
                _check_runs(text, src, rows[i])
            runs = run_times(df)
            for i, (r, mean) in enumerate(zip(runs, df.latency_s, strict=True)):
                if abs(float(r.mean()) - mean) > 0.01 * mean + 1e-5:  # a column in ms beside one in s
                    raise ConfigError(
                        src,
                        "latency_s",
                        f"row {rows[i]}: {mean:g} s is not the mean of runs_s ({r.mean():g} s)",
                    )
    _check_sums(df, src, rows)
    df.attrs["source"] = src
    return df


def _check_sums(df: pd.DataFrame, src: str, rows: list[int]) -> None:
    """N_linear and N_cached are the members' sums (``l_new``, ``l_cached``: one value a member;
    N_interactions is left: a recording of engine steps counts a prompt chunk's causal pairs)."""
    if "l_new" not in df or "l_cached" not in df:
        return
    for i, (ln, lc) in enumerate(zip(df.l_new, df.l_cached, strict=True)):
        try:
            new = [int(x) for x in str(ln).split(";")]
            cached = [int(x) for x in str(lc).split(";")]
        except ValueError:
            raise ConfigError(src, "l_new", f"row {rows[i]}: whole numbers separated by ';'") from None
        if len(new) != len(cached):
            raise ConfigError(src, "l_cached", f"row {rows[i]}: {len(cached)} members, l_new has {len(new)}")
        for col, v in (("n_linear", sum(new)), ("n_cached", sum(cached))):
            got = int(df[col].iloc[i])
            if got != v:
                raise ConfigError(
                    src, col, f"row {rows[i]}: {got}, but its members (l_new, l_cached) sum to {v}"
                )


def _check_runs(text: object, src: str, row: int) -> None:
    if not isinstance(text, str):
        return  # empty: run_times falls back to the mean
    for part in text.split(";"):
        if part in ("", "nan"):
            continue
        try:
            v = float(part)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(
                src, "runs_s", f"row {row}: runs must be finite numbers > 0 separated by ';', got {part!r}"
            )


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
        # requests per measured batch (for an estimator form with a per-request term)
        self.sizes = (
            df.batch_size.to_numpy(dtype=float) if "batch_size" in df else np.zeros(len(df), dtype=float)
        )
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


class MeasuredCost(AggregateCost):
    """The ``measured`` form: a batch costs its nearest measured configuration's mean time (in
    the table's normalized aggregate space), scaled by the estimator's ratio T_hat(batch) /
    T_hat(neighbour) where ``correct`` (the ``measured`` latency model; ``measured-nearest``
    answers the neighbour's time as is). The neighbour and factor are memoized per shape."""

    __slots__ = ("_near", "correct", "estimator", "form", "table")

    def __init__(self, estimator: AggregateCost, table: MeasuredTable, correct: bool = True) -> None:
        self.estimator = estimator
        self.table = table
        self.correct = correct
        self.form = "measured" if correct else "measured-nearest"
        self._near: dict[tuple[float, float, float, float], tuple[int, float]] = {}

    def neighbour(
        self, n_linear: float, n_interactions: float, n_cached: float, n_requests: float, t_hat: float
    ) -> tuple[int, float]:
        """(row of the nearest measured configuration, the factor its time is scaled by), given
        the batch's own estimate ``t_hat``."""
        key = (n_linear, n_interactions, n_cached, t_hat)  # t_hat: whatever else the estimator reads
        hit = self._near.get(key)
        if hit is None:
            if len(self._near) > 200_000:  # bound the memo on long runs
                self._near.clear()
            i = self.table.nearest(n_linear, n_interactions, n_cached)
            lin, inter, cac = self.table.points[i]
            there = self.estimator.batch(lin, inter, cac, self.table.sizes[i])
            factor = t_hat / there if self.correct else 1.0
            hit = self._near[key] = (i, factor)
        return hit

    def batch(self, n_linear: float, n_interactions: float, n_cached: float, n_requests: float = 0,
              n_arrivals: float = 0, n_logits: float | None = None, n_prefill_interactions: float = 0,
              n_prefill_cached: float = 0) -> float:  # fmt: skip
        t_hat = self.estimator.batch(
            n_linear, n_interactions, n_cached, n_requests, n_arrivals, n_logits,
            n_prefill_interactions, n_prefill_cached,
        )  # fmt: skip
        i, factor = self.neighbour(n_linear, n_interactions, n_cached, n_requests, t_hat)
        return float(self.table.latency[i]) * factor

    @property
    def prefill_above(self) -> int:
        return self.estimator.prefill_above

    def marginal(self, l_new: int, l_cached: int) -> float:
        return self.estimator.marginal(l_new, l_cached)

    @property
    def fastest(self) -> float:
        return float(self.table.latency.min())
