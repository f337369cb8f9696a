"""Time-resolved metrics of one run (SPEC 7): compliance over time, load, queue, utilization, bursts.

Compliance at time t is the share of measured responses *decided* in the trailing window
(t - window_s, t] that met their SLO; a response is decided when it finishes, or when it is
censored (it could no longer meet its SLO when the run ended). Reading it by decision time
shows what users see as they see it: a burst's damage appears as the responses caught in it
finish, which lags the burst by up to one response's length (output / SLO: 32 s for 256 tokens at
8 tok/s, 128 s at 2 tok/s).

Server series, per step: responses in flight (started, not yet finished) and, for a trace run, the
trace's target; the mean and largest queue length seen at dispatch; GPU utilization (busy time
over the step, averaged over replicas).

Bursts: the trace's peaks (:func:`scipy.signal.find_peaks`, prominence at least a quarter of the
trace's range; a plateau's peak time is where it starts). For each peak and class:
``compliance_at_peak``, the compliance of the responses decided in the window that starts at the
peak; ``trough``, the lowest compliance between the peak and the next peak; ``recovery_s``, the
time from the peak until compliance is back at or above the threshold (1 - epsilon) after having
dropped below it -- 0 if it never dropped, NaN if it had not recovered by the next peak or the
end of the run. Windows with fewer than ``min_responses`` decided responses are left out (NaN),
so sparse classes at low load do not fake drops.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from wispsim.results import Results
    from wispsim.sim.arrivals import ArrivalTrace
    from wispsim.sim.records import SimResult


def _decided_at(responses: pd.DataFrame) -> np.ndarray:
    """Finish time, or the censoring time of a censored response (output / speed after start)."""
    t_end = responses.t_end.to_numpy(dtype=float)
    cens = ~np.isfinite(t_end)
    if cens.any():
        r = responses[cens]
        t_end = t_end.copy()
        t_end[cens] = r.t_start.to_numpy() + r.output_len.to_numpy() / r.speed.to_numpy()
    return t_end


def compliance_series(
    result: SimResult, step_s: float = 10.0, window_s: float = 60.0, min_responses: int = 5
) -> pd.DataFrame:
    """Long frame: t, class (SLO, or NaN for all classes together), decided, violated, compliance."""
    resp = result.responses[result.responses.measured]
    decided = _decided_at(resp)
    end = max(result.sim_end, float(np.nanmax(decided)) if decided.size else 0.0)
    ts = np.arange(step_s, end + step_s, step_s)
    rows = []
    groups: list[tuple[float, np.ndarray]] = [
        (float(c), (resp.slo == c).to_numpy()) for c in sorted(resp.slo.unique())
    ]
    groups.append((math.nan, np.ones(len(resp), dtype=bool)))
    viol = resp.violated.to_numpy()
    for cls, mask in groups:
        d, v = decided[mask], viol[mask]
        order = np.argsort(d)
        d, v = d[order], v[order]
        cum_v = np.concatenate([[0], np.cumsum(v)])
        hi = np.searchsorted(d, ts, side="right")
        lo = np.searchsorted(d, ts - window_s, side="right")
        n = hi - lo
        nv = cum_v[hi] - cum_v[lo]
        comp = np.where(n >= min_responses, 1.0 - nv / np.maximum(n, 1), np.nan)
        rows.append(pd.DataFrame({"t": ts, "class": cls, "decided": n, "violated": nv, "compliance": comp}))
    return pd.concat(rows, ignore_index=True)


def server_series(
    result: SimResult, step_s: float = 10.0, trace: ArrivalTrace | None = None, scale: float = 1.0
) -> pd.DataFrame:
    """Per step [t - step_s, t): in-flight responses, trace target, queue length, utilization."""
    end = result.sim_end
    ts = np.arange(step_s, end + step_s, step_s)
    starts = ts - step_s
    resp = result.responses
    r0 = np.sort(resp.t_start.to_numpy(dtype=float))
    r1 = np.sort(np.where(np.isfinite(resp.t_end), resp.t_end, end).astype(float))
    mid = starts + step_s / 2
    in_flight = np.searchsorted(r0, mid, side="right") - np.searchsorted(r1, mid, side="right")
    b = result.batches
    replicas = max(int(result.info.get("replicas", 1)), 1)
    idx = np.clip((b.t_dispatch.to_numpy() // step_s).astype(int), 0, len(ts) - 1)
    q = b.queue_len.to_numpy(dtype=float)
    count = np.bincount(idx, minlength=len(ts))
    q_mean = np.bincount(idx, weights=q, minlength=len(ts)) / np.maximum(count, 1)
    q_max = np.zeros(len(ts))
    np.maximum.at(q_max, idx, q)
    # busy time of each batch split over the steps it overlaps
    busy = np.zeros(len(ts))
    for t0, t1 in zip(b.t_dispatch.to_numpy(), b.t_end.to_numpy(), strict=True):
        i0, i1 = int(t0 // step_s), min(int(t1 // step_s), len(ts) - 1)
        for i in range(i0, i1 + 1):
            busy[i] += max(0.0, min(t1, starts[i] + step_s) - max(t0, starts[i]))
    out = pd.DataFrame(
        {
            "t": ts,
            "in_flight": in_flight,
            "batches": count,
            "queue_len_mean": np.where(count > 0, q_mean, 0.0),
            "queue_len_max": q_max,
            "gpu_utilization": busy / (step_s * replicas),
        }
    )
    if trace is not None:
        out.insert(1, "target", [trace.at(t) * scale for t in mid])
    return out


def trace_peaks(trace: ArrivalTrace, scale: float = 1.0) -> pd.DataFrame:
    """The bursts of an arrival trace: peak time (plateau start) and value."""
    from scipy.signal import find_peaks

    v = trace.values * scale
    rng = float(v.max() - v.min())
    if rng <= 0:
        return pd.DataFrame({"peak_t": [], "peak_value": []})
    _, props = find_peaks(np.concatenate([[v.min()], v, [v.min()]]), prominence=rng / 4, plateau_size=1)
    left = props["left_edges"] - 1
    return pd.DataFrame({"peak_t": trace.times[left], "peak_value": v[left]})


def burst_table(
    compliance: pd.DataFrame, peaks: pd.DataFrame, threshold: float, end: float, window_s: float = 60.0
) -> pd.DataFrame:
    """Per peak and class: compliance at the peak, trough after it, recovery time (see module)."""
    rows = []
    times = [*peaks.peak_t, end]
    for k, (pt, pv) in enumerate(zip(peaks.peak_t, peaks.peak_value, strict=True)):
        nxt = times[k + 1]
        for cls, g in compliance.groupby("class", dropna=False, sort=True):
            g = g.sort_values("t")
            at_peak = g[g.t >= pt + window_s].head(1).compliance
            after = g[(g.t >= pt) & (g.t < nxt)].dropna(subset=["compliance"])
            trough = float(after.compliance.min()) if len(after) else math.nan
            below = after[after.compliance < threshold]
            if below.empty:
                recovery = 0.0
            else:
                back = after[(after.t > below.t.iloc[0]) & (after.compliance >= threshold)]
                recovery = float(back.t.iloc[0] - pt) if len(back) else math.nan
            rows.append(
                {
                    "peak": k + 1,
                    "peak_t": float(pt),
                    "peak_value": float(pv),
                    "class": "all" if isinstance(cls, float) and math.isnan(cls) else f"{cls:g}",
                    "compliance_at_peak": float(at_peak.iloc[0]) if len(at_peak) else math.nan,
                    "trough": trough,
                    "recovery_s": recovery,
                }
            )
    return pd.DataFrame(rows)


def write_timeseries(
    result: SimResult,
    folder: Results,
    step_s: float = 10.0,
    window_s: float = 60.0,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """Write timeseries.csv, server_timeseries.csv and (trace runs) bursts.csv into ``folder``;
    return the tables.

    The figure of the same tables is :func:`wispsim.plots.timeseries.compliance_figure`."""
    from wispsim.sim.arrivals import load_arrival_trace

    sc = result.scenario
    trace = (
        load_arrival_trace(sc.arrivals.trace)
        if sc.arrivals.process == "trace" and sc.arrivals.trace
        else None
    )
    comp = compliance_series(result, step_s, window_s)
    server = server_series(result, step_s, trace, sc.arrivals.scale)
    threshold = 1.0 - sc.epsilon
    bursts = None
    if trace is not None:
        peaks = trace_peaks(trace, sc.arrivals.scale)
        bursts = burst_table(comp, peaks, threshold, result.sim_end, window_s)
        folder.table("bursts.csv", bursts)
    out = comp.assign(**{"class": comp["class"].map(lambda c: "all" if math.isnan(c) else f"{c:g}")})
    folder.table("timeseries.csv", out)
    folder.table("server_timeseries.csv", server)
    return comp, server, bursts
