"""Token latencies of a run as ``vllm bench serve`` reports them, from its response records.

``vllm bench serve`` reports, over completed requests: TTFT (time to first token), TPOT (time per
output token after the first, ``(E2E - TTFT) / (output_len - 1)`` per request), ITL (the gaps
between consecutive streamed chunks, pooled over all requests; with speculative decoding a chunk
holds several tokens) and E2E latency, each as mean, median and p99, and the output throughput.
:func:`token_latency` gives the same figures from a run's responses (columns
:data:`TOKEN_LATENCY_COLUMNS`; times in ms, throughput in tok/s), so a simulated centralized run
can be set against a public benchmark run.

A response record holds when its first token (``t_first``) and its last (``t_end``) reached the
device and how many chunks its output came in (``rounds``: one per verification round, or one
per token under centralized serving), not the time of every chunk. So each response contributes
``rounds - 1`` gaps of its *mean* gap ``(t_end - t_first) / (rounds - 1)``: the ITL mean is the
pooled mean exactly, but the ITL median and p99 are of per-response mean gaps weighted by their
number of gaps, not of individual gaps (they understate the spread within a response).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

TOKEN_LATENCY_COLUMNS = [
    "ttft_mean_ms",
    "ttft_median_ms",
    "ttft_p99_ms",
    "tpot_mean_ms",
    "tpot_median_ms",
    "tpot_p99_ms",
    "itl_mean_ms",
    "itl_median_ms",
    "itl_p99_ms",
    "e2e_mean_ms",
    "e2e_median_ms",
    "e2e_p99_ms",
    "output_throughput_tps",
]


def output_throughput(responses: pd.DataFrame, window: tuple[float, float]) -> float:
    """Output tokens per second inside ``window``: the output of the responses that ended inside
    it (any response, measured or not; a censored one has no end) over the window's length."""
    w0, w1 = window
    done = responses[(responses.t_end >= w0) & (responses.t_end < w1)]
    return float(done.output_len.sum()) / (w1 - w0)


def _stats(name: str, x: np.ndarray, scale: float = 1000.0) -> dict[str, float]:
    """``name``'s mean, median and p99 of ``x`` (NaN values left out) times ``scale``."""
    x = x[~np.isnan(x)]
    if not len(x):
        nan = float("nan")
        return {f"{name}_mean_ms": nan, f"{name}_median_ms": nan, f"{name}_p99_ms": nan}
    return {
        f"{name}_mean_ms": float(x.mean() * scale),
        f"{name}_median_ms": float(np.median(x) * scale),
        f"{name}_p99_ms": float(np.percentile(x, 99) * scale),
    }


def pooled_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The ``q`` quantile of the pool holding each of ``values`` ``weights`` times (whole numbers
    >= 1), as ``np.quantile(np.repeat(values, weights), q)`` (linear interpolation) gives it,
    without building the pool."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    ends = np.cumsum(weights[order])  # pool positions 0..n-1: value i holds [ends[i-1], ends[i])
    n = int(ends[-1])
    pos = q * (n - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, n - 1)
    a, b = v[np.searchsorted(ends, [lo, hi], side="right")]
    return float(a + (b - a) * (pos - lo))


def token_latency(responses: pd.DataFrame, window: tuple[float, float]) -> dict[str, float]:
    """TTFT, TPOT, ITL and E2E (mean, median, p99, in ms) and the output throughput (tok/s) of a
    run's responses (module docstring); keys :data:`TOKEN_LATENCY_COLUMNS`.

    Latencies are over the measured, finished responses of ``responses`` (a run's table, or a
    class's part of it): TTFT ``t_first - t_start``, E2E ``t_end - t_start``, TPOT
    ``(t_end - t_first) / (output_len - 1)`` of the responses with ``output_len > 1``, ITL the
    per-response mean gaps ``(t_end - t_first) / (rounds - 1)`` of the responses with
    ``rounds > 1``, weighted by ``rounds - 1``. A response without a first-token time (NaN) is
    left out of TTFT, TPOT and ITL. The throughput is :func:`output_throughput` over ``window``
    (the run's measurement window), what ``goodput_tps`` is for centralized serving.
    """
    r = responses[responses.measured & ~responses.censored]
    t0 = r.t_start.to_numpy(float)
    first = r.t_first.to_numpy(float)
    end = r.t_end.to_numpy(float)
    out = r.output_len.to_numpy(float)
    chunks = r.rounds.to_numpy()
    after = end - first  # from the first token to the last
    multi = out > 1
    streamed = (chunks > 1) & ~np.isnan(after)
    gaps = chunks[streamed] - 1
    mean_gap = after[streamed] / gaps
    if len(gaps):
        itl = {
            "itl_mean_ms": float(after[streamed].sum() / gaps.sum() * 1000.0),
            "itl_median_ms": pooled_quantile(mean_gap, gaps, 0.5) * 1000.0,
            "itl_p99_ms": pooled_quantile(mean_gap, gaps, 0.99) * 1000.0,
        }
    else:
        itl = {"itl_mean_ms": float("nan"), "itl_median_ms": float("nan"), "itl_p99_ms": float("nan")}
    return {
        **_stats("ttft", first - t0),
        **_stats("tpot", after[multi] / (out[multi] - 1)),
        **itl,
        **_stats("e2e", end - t0),
        "output_throughput_tps": output_throughput(responses, window),
    }
