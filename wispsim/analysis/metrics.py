"""Summaries computed from a run's records (never from counters kept on the side).

:func:`summarize` gives one row per SLO class plus an ``all`` row. Definitions:

- ``violation_rate``: share of measured responses whose speed (output tokens / wall time from first
  draft to last commit) is below the class's target (SPEC 2.4, the primary metric). Censored
  responses (still running when they could no longer meet the SLO) count as violations.
- ``budget_miss_rate``: share of measured responses' rounds whose queue + verify time exceeded the
  round's server-side budget tau_c.
- ``goodput_tps``: committed tokens per second inside the measurement window (from rounds; for
  centralized serving, from responses that ended inside the window).
- ``acceptance_ratio``: accepted / drafted tokens; ``wasted_tokens``: mean k - L per round;
  ``wdt_ms``: mean wasted drafting time tau_d * max(0, k - L) per round.
- ``gpu_utilization``: busy time of the GPU inside the window / window length; ``mean_batch_size``
  and ``evictions`` over batches dispatched inside the window; ``prefix_hit_rate``: share of
  non-first rounds whose prefix was still cached.
- ``ttft_*_ms``, ``tpot_*_ms``, ``itl_*_ms``, ``e2e_*_ms`` (mean, median, p99) and
  ``output_throughput_tps``: token latencies as ``vllm bench serve`` reports them, over measured
  finished responses (:mod:`wispsim.analysis.token_latency`, which says how ITL is approximated).
- ``device_load`` ... ``api_server_load``, ``binds``, ``headroom``: each resource's load, the one
  nearest its limit and the share of it still free (:mod:`wispsim.analysis.binding`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from wispsim.analysis.binding import BINDING_COLUMNS, BINDING_ROUND_COLUMNS, binding_rows, demand_ratio
from wispsim.analysis.token_latency import TOKEN_LATENCY_COLUMNS, output_throughput, token_latency
from wispsim.model.fleet import device_specs, fleet_classes, fleet_size
from wispsim.sim.records import SimResult

SUMMARY_COLUMNS = [
    "class",
    "devices",
    "responses",
    "censored",
    "violation_rate",
    "speed_p5",
    "speed_p50",
    "speed_p95",
    "rounds",
    "budget_miss_rate",
    "goodput_tps",
    "acceptance_ratio",
    "mean_k",
    "wasted_tokens",
    "wdt_ms",
    "queue_p50_ms",
    "queue_p95_ms",
    "queue_p99_ms",
    "verify_p50_ms",
    "verify_p95_ms",
    "verify_p99_ms",
    "prefix_hit_rate",
    "gpu_utilization",
    "mean_batch_size",
    "batches",
    "evictions",
    *TOKEN_LATENCY_COLUMNS,
    *BINDING_COLUMNS,
]


def _q(x: pd.Series | np.ndarray, q: float, scale: float = 1.0) -> float:
    a = np.asarray(x, dtype=float)
    return float(np.quantile(a, q) * scale) if len(a) else float("nan")


def _mean(x: pd.Series | np.ndarray) -> float:
    a = np.asarray(x, dtype=float)
    return float(a.mean()) if len(a) else float("nan")


# the round columns a summary reads (all 27 are never needed at once)
SUMMARY_ROUND_COLUMNS = list(
    dict.fromkeys(["slo", "round", "k", "accepted", "tau_d", "arrival", "dispatch", "verify_time", "budget",
                   "cold", *BINDING_ROUND_COLUMNS])
)  # fmt: skip
GOODPUT_ROUND_COLUMNS = ["slo", "committed"]  # of the rounds that ended inside the window


def _class_row(
    label: str,
    devices: int,
    resp: pd.DataFrame,
    rounds: pd.DataFrame,
    ended: pd.DataFrame | None,
    all_resp: pd.DataFrame,
    window: tuple[float, float],
) -> dict[str, Any]:
    """One summary row: ``rounds`` are the class's measured rounds; ``ended`` its rounds (of any
    response) that ended inside the window (None for centralized serving: no rounds)."""
    w0, w1 = window
    span = w1 - w0
    if ended is not None:
        goodput = float(ended.committed.sum()) / span
    else:
        goodput = output_throughput(all_resp, window)
    k = rounds.k.to_numpy(float) if len(rounds) else np.empty(0)
    acc = rounds.accepted.to_numpy(float) if len(rounds) else np.empty(0)
    waste = np.maximum(0.0, k - acc)
    queue = (rounds.dispatch - rounds.arrival).to_numpy() if len(rounds) else np.empty(0)
    # cold flags of the rounds after a response's first (one column: not a copy of the frame)
    later = rounds.cold.to_numpy()[rounds["round"].to_numpy() > 0] if len(rounds) else np.empty(0)
    return {
        "class": label,
        "devices": devices,
        "responses": len(resp),
        "censored": int(resp.censored.sum()) if len(resp) else 0,
        "violation_rate": _mean(resp.violated) if len(resp) else float("nan"),
        "speed_p5": _q(resp.speed, 0.05),
        "speed_p50": _q(resp.speed, 0.50),
        "speed_p95": _q(resp.speed, 0.95),
        "rounds": len(rounds),
        "budget_miss_rate": _mean((queue + rounds.verify_time.to_numpy()) > rounds.budget.to_numpy())
        if len(rounds)
        else float("nan"),
        "goodput_tps": goodput,
        "acceptance_ratio": float(acc.sum() / k.sum()) if k.sum() > 0 else float("nan"),
        "mean_k": _mean(k),
        "wasted_tokens": _mean(waste),
        "wdt_ms": _mean(waste * rounds.tau_d.to_numpy()) * 1000 if len(rounds) else float("nan"),
        "queue_p50_ms": _q(queue, 0.50, 1000),
        "queue_p95_ms": _q(queue, 0.95, 1000),
        "queue_p99_ms": _q(queue, 0.99, 1000),
        "verify_p50_ms": _q(rounds.verify_time, 0.50, 1000) if len(rounds) else float("nan"),
        "verify_p95_ms": _q(rounds.verify_time, 0.95, 1000) if len(rounds) else float("nan"),
        "verify_p99_ms": _q(rounds.verify_time, 0.99, 1000) if len(rounds) else float("nan"),
        "prefix_hit_rate": 1.0 - _mean(later) if len(later) else float("nan"),
        **token_latency(all_resp, window),
    }


def server_stats(batches: pd.DataFrame, window: tuple[float, float], replicas: int = 1) -> dict[str, float]:
    """GPU utilization (busy share of the window, averaged over replicas), batch size, evictions."""
    w0, w1 = window
    if not len(batches):
        return {"gpu_utilization": 0.0, "mean_batch_size": float("nan"), "batches": 0, "evictions": 0}
    start = batches.t_dispatch.to_numpy()
    end = batches.t_end.to_numpy()
    busy = np.clip(np.minimum(end, w1) - np.maximum(start, w0), 0, None).sum()
    inwin = batches[(batches.t_dispatch >= w0) & (batches.t_dispatch < w1)]
    return {
        "gpu_utilization": float(busy / ((w1 - w0) * replicas)),
        "mean_batch_size": _mean(inwin["size"]),
        "batches": len(inwin),
        "evictions": int(inwin.evictions.sum()),
    }


def class_label(slo: float) -> str:
    """A class as tables name it: its SLO in tok/s, shortest form ("4", "2.5")."""
    return f"{slo:g}"


def summarize(result: SimResult) -> pd.DataFrame:
    """Per-class summary rows and an ``all`` row (columns :data:`SUMMARY_COLUMNS`)."""
    resp_all = result.responses
    resp = resp_all[resp_all.measured]
    w0, w1 = result.window
    store = result.round_records
    rounds = store.frame(SUMMARY_ROUND_COLUMNS, [("measured", "==", True)])
    in_window = store.frame(GOODPUT_ROUND_COLUMNS, [("t_end", ">=", w0), ("t_end", "<", w1)])
    ended = in_window if len(store) else None
    srv = server_stats(result.batches, result.window, result.scenario.server.replicas)
    per_class = pd.Series(device_slos(result)).value_counts()
    classes = fleet_classes(result.scenario)
    rows = []
    for slo in sorted(classes):
        sel = lambda df, s=slo: df[df.slo == s]  # noqa: E731
        row = _class_row(
            class_label(slo),
            int(per_class.get(slo, 0)),
            sel(resp),
            sel(rounds) if len(rounds) else rounds,
            sel(ended) if ended is not None else None,
            sel(resp_all),
            result.window,
        )
        rows.append({**row, **srv})
    if len(classes) > 1:
        rows.append(
            {**_class_row("all", result.devices, resp, rounds, ended, resp_all, result.window), **srv}
        )
    served = sum(r["goodput_tps"] for r in rows[: len(classes)] if r["goodput_tps"] == r["goodput_tps"])
    demand = demand_ratio(result, {slo: int(per_class.get(slo, 0)) for slo in classes}, served)
    bind = binding_rows(result, sorted(classes), rounds if ended is not None else None, demand)
    rows = [{**row, **b} for row, b in zip(rows, bind, strict=True)]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def device_slos(result: SimResult) -> list[float]:
    """The class of each device the run started (index order)."""
    sc = result.scenario
    a = sc.arrivals
    open_sessions = a.process == "poisson" or (a.process == "trace" and a.kind == "rate")
    specs = device_specs(sc, fleet_size(sc) if open_sessions else result.devices)
    return [specs[i % len(specs)].slo for i in range(result.devices)]


def replica_summary(result: SimResult) -> pd.DataFrame:
    """Per replica, over the measurement window: batches, utilization, batch size, rounds, queue and
    verify times, cold-round share and evictions."""
    b = result.batches
    w0, w1 = result.window
    store = result.round_records
    rounds = store.frame(
        ["batch", "arrival", "dispatch", "verify_time", "cold"], [("arrival", ">=", w0), ("arrival", "<", w1)]
    )
    rows = []
    replica_of = dict(zip(b.batch, b.replica, strict=True)) if len(b) else {}
    rr = rounds.batch.map(replica_of) if len(rounds) else pd.Series(dtype=float)
    for rep in range(result.scenario.server.replicas):
        mine = b[b.replica == rep]
        stats = server_stats(mine, result.window)
        sel = rounds[rr == rep] if len(rounds) else rounds
        q = (sel.dispatch - sel.arrival) if len(sel) else pd.Series(dtype=float)
        rows.append(
            {
                "replica": rep,
                "batches": stats["batches"],
                "gpu_utilization": stats["gpu_utilization"],
                "mean_batch_size": stats["mean_batch_size"],
                "rounds": len(sel),
                "rounds_per_s": len(sel) / (w1 - w0),
                "queue_p95_ms": _q(q, 0.95, 1000.0),
                "verify_p95_ms": _q(sel.verify_time, 0.95, 1000.0) if len(sel) else float("nan"),
                "cold_share": _mean(sel.cold) if len(sel) else float("nan"),
                "evictions": stats["evictions"],
            }
        )
    return pd.DataFrame(rows)


def device_counts(result: SimResult) -> pd.DataFrame:
    """Per device: measured responses and violations (clusters for the capacity bootstrap)."""
    r = result.responses[result.responses.measured]
    if r.empty:
        return pd.DataFrame(
            {
                "device": pd.Series(dtype=int),
                "slo": pd.Series(dtype=float),
                "violated": pd.Series(dtype=int),
                "responses": pd.Series(dtype=int),
            }
        )
    g = r.groupby(["device", "slo"], sort=True).violated.agg(["sum", "count"]).reset_index()
    return g.rename(columns={"sum": "violated", "count": "responses"})
