"""Attribution of SLO violations to queueing or compute (SPEC 7).

A round of a measured response that violated its SLO is *compute-dominant* when its verify time
exceeds ``factor`` x the moving average latency of the ``window`` batches dispatched before its
batch on the same replica (a batch slower than the recent ones: the GPU was the bottleneck),
otherwise *queue-dominant* (the time went to waiting for a slot).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from wispsim.analysis.tables import BATCH_COLUMNS
from wispsim.errors import ConfigError
from wispsim.results import check_columns

COMPUTE, QUEUE = "compute-dominant", "queue-dominant"


def _trailing_mean(x: np.ndarray, window: int) -> np.ndarray:
    """Mean of the up to ``window`` values before each position (NaN for the first)."""
    c = np.concatenate([[0.0], np.cumsum(x, dtype=float)])
    i = np.arange(len(x))
    lo = np.maximum(i - window, 0)
    n = i - lo
    return np.where(n > 0, (c[i] - c[lo]) / np.maximum(n, 1), np.nan)


def attribute_rounds(
    rounds: pd.DataFrame, batches: pd.DataFrame, window: int = 20, factor: float = 1.5
) -> pd.DataFrame:
    """Label each round compute- or queue-dominant (see the module docstring).

    Returns ``rounds`` with ``queue_time`` (dispatch - arrival), ``batch_ma`` (the moving average
    latency of the ``window`` batches dispatched before the round's batch on its replica; NaN for
    a replica's first batch, whose round is then queue-dominant) and ``label``.
    """
    if window < 1:
        raise ConfigError("attribution", "window", f"must be >= 1, got {window}")
    if not factor > 0:
        raise ConfigError("attribution", "factor", f"must be > 0, got {factor}")
    check_columns(rounds, ("batch", "arrival", "dispatch", "verify_time"), "rounds")
    check_columns(batches, BATCH_COLUMNS, "batches")
    b = batches.sort_values(["replica", "t_dispatch", "batch"], kind="stable")
    ma = np.empty(len(b))
    rep = b.replica.to_numpy()
    lat = b.latency.to_numpy(float)
    for r in np.unique(rep):
        idx = np.flatnonzero(rep == r)
        ma[idx] = _trailing_mean(lat[idx], window)
    by_batch = pd.Series(ma, index=b.batch.to_numpy())
    out = rounds.copy()
    out["queue_time"] = out.dispatch - out.arrival
    out["batch_ma"] = out.batch.map(by_batch).to_numpy(float)
    compute = (out.verify_time > factor * out.batch_ma).to_numpy(bool)
    out["label"] = np.where(compute, COMPUTE, QUEUE)
    return out


def violated_rounds(rounds: pd.DataFrame, responses: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rounds of measured responses that violated their SLO.

    With ``responses`` (responses.parquet) the verdict is the simulator's own. Without it, each
    response's speed is worked out from its rounds (committed tokens over first draft to last
    verdict, which is how the simulator measures a finished response); a censored response --
    one the run ended before it could finish -- cannot be told apart from its rounds alone and
    is then missed.
    """
    check_columns(rounds, ("response", "measured"), "rounds")
    mine = rounds[rounds.measured.astype(bool)]
    if responses is not None:
        check_columns(responses, ("response", "violated", "measured"), "responses")
        bad = responses[responses.measured.astype(bool) & responses.violated.astype(bool)].response
        return mine[mine.response.isin(bad)]
    if "violated" in mine:
        return mine[mine.violated.astype(bool)]
    check_columns(mine, ("slo", "t_start", "t_end", "committed"), "rounds")
    g = mine.groupby("response").agg(
        slo=("slo", "first"), t0=("t_start", "min"), t1=("t_end", "max"), out=("committed", "sum")
    )
    speed = g.out / (g.t1 - g.t0).where(g.t1 > g.t0)
    bad_ids = g.index[(speed < g.slo).to_numpy(bool)]
    return mine[mine.response.isin(bad_ids)]
