"""What binds a run: each resource's load over the measurement window, and the one nearest its limit.

A GPU that batches whatever is queued as soon as it frees is busy at almost any load
(``gpu_utilization`` reads 0.98 with eight devices), so busy time says nothing about headroom. Each
resource here gets a *load*, 0 when idle and 1 at its limit (past 1 where work queues for it), read
from the run's records, never from counters the model keeps on the side:

- ``device_load`` (speculative serving): of the time the SLO allows a round (``committed / slo``
  seconds: the round's tokens at the class's least speed), the share the device spends drafting
  and on the link (draft + uplink + downlink).
- ``gpu_load``: of the same time, the share the server takes (queue + pass: ``dispatch - arrival +
  verify_time``); under centralized serving, of the time the SLO allows a token after the first
  (``1 / slo``), the share a response's decode takes (its TPOT). Both over the measured responses'
  rounds after each first (a first round waits for its prefill and, under admission control, for
  KV room: ``kv_load`` speaks for that), pooled per class; a run's is its tightest class's. The
  queue includes a round's wait for its API server, which ``api_server_load`` separates.
- ``gpu_backlog``: the share of the window the GPU spent on passes that left admitted work waiting
  behind them (rounds still queued: a batch limit or the scheduler's time budget held them back;
  running sequences a centralized step's token budget could not take), against passes that took
  everything there was. Responses waiting for KV room or a sequence slot are not the GPU's:
  ``kv_load`` and ``seqs_load`` speak for them.
- ``kv_load``: the share of the replica's KV blocks held, mean over the passes begun in the window:
  reserved under admission control (``server.verifier.kv_policy: admission``, where the rest
  wait for room), else in use (cached prefixes count: evicting them makes the next round cold).
- ``seqs_load``: the share of ``server.engine.max_num_seqs`` taken, mean over the same passes:
  the sequences running (centralized), a pass's rounds (speculative).
- ``engine_cpu_load``: the engine core's CPU seconds (``cpu_s``) inside the window over its length,
  busiest replica (NaN where the host is not modelled, or a real server logs no CPU), at the
  rate the SLO needs (below).
- ``api_server_load``: the busiest API-server process's busy share of the window (NaN where the
  host is not modelled, and against a real server: its holdings and API servers are not logged,
  so ``kv_load``, ``seqs_load`` and ``gpu_backlog`` are NaN there too), at the rate the SLO
  needs.

*At the rate the SLO needs*: closed-loop devices send their next round (or request) as soon as the
last is answered, so a CPU that serves them is busy whatever their number: 500 devices at 2 tok/s
keep one API-server process busy all the time while each of them makes 3.9 tok/s. What the SLO
needs is ``sum(devices x slo)`` committed tokens a second; a CPU's busy share is scaled by that over
the tokens the run committed (``goodput_tps``), its work being per round or request. Under open
arrivals the rate is the arrivals', and the busy share is the load.

``binds`` names the resource with the highest load (``gpu`` counts the larger of its two);
``headroom`` is one minus that load: the share of its limit still free (negative: past it). At
light load every load is low and ``binds`` names the nearest limit, not a bottleneck: read
``headroom``. The loads are shares of limits, not capacities: a resource at 0.5 does not mean
twice the devices (a pass's cost is not linear in its batch); the capacity search answers that.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from wispsim.sim.records import SimResult

BINDING_COLUMNS = [
    "device_load",
    "gpu_load",
    "gpu_backlog",
    "kv_load",
    "seqs_load",
    "engine_cpu_load",
    "api_server_load",
    "binds",
    "headroom",
]
# the resources ``binds`` names, each with the load columns it takes the largest of
RESOURCES = {
    "device": ("device_load",),
    "gpu": ("gpu_load", "gpu_backlog"),
    "kv": ("kv_load",),
    "max_num_seqs": ("seqs_load",),
    "engine_cpu": ("engine_cpu_load",),
    "api_server": ("api_server_load",),
}
BINDING_ROUND_COLUMNS = ["slo", "round", "committed", "draft_time", "uplink_time", "downlink_time",
                         "arrival", "dispatch", "verify_time"]  # fmt: skip
NAN = float("nan")


def shared_loads(result: SimResult, demand: float = 1.0) -> dict[str, float]:
    """The loads every class shares: the GPU's backlog, KV, batch slots, engine CPU, API servers
    (the busiest replica's where there are several); ``demand``: the rate the SLO needs over the
    rate the run served, which scales the CPUs' busy shares (module text)."""
    w0, w1 = result.window
    span = w1 - w0
    b = result.batches
    out = {k: NAN for k in ("gpu_backlog", "kv_load", "seqs_load", "engine_cpu_load")}
    if len(b) and span > 0 and (b.cpu_s.to_numpy(float) > 0).any():
        start, end = b.t_dispatch.to_numpy(float), b.t_end.to_numpy(float)
        inside = np.clip(np.minimum(end, w1) - np.maximum(start, w0), 0.0, None)
        share = np.where(end > start, inside / np.where(end > start, end - start, 1.0), 0.0)
        cpu = pd.Series(b.cpu_s.to_numpy(float) * share).groupby(b.replica.to_numpy()).sum()
        out["engine_cpu_load"] = float(cpu.max() / span) * demand
    backlog = result.info.get("gpu_backlog_s")
    if backlog and span > 0:
        out["gpu_backlog"] = max(backlog) / span
    for key, info in (("kv_load", "kv_held_share"), ("seqs_load", "seqs_held_share")):
        held = [v for v in result.info.get(info, ()) if v == v]
        if held:  # the busiest replica's
            out[key] = max(held)
    busy = result.info.get("api_server_busy_s")
    out["api_server_load"] = (
        max(max(per) for per in busy if per) / span * demand if busy and any(busy) and span > 0 else NAN
    )
    return out


def class_loads(rounds: pd.DataFrame | None, responses: pd.DataFrame, slo: float) -> dict[str, float]:
    """A class's device and GPU loads (module text) from its measured rounds (None: centralized
    serving, from its measured finished responses)."""
    if rounds is not None:
        r = rounds[rounds["round"].to_numpy() > 0]
        allowed = float(r.committed.sum()) / slo
        if not len(r) or allowed <= 0:
            return {"device_load": NAN, "gpu_load": NAN}
        device = (r.draft_time + r.uplink_time + r.downlink_time).sum()
        server = (r.dispatch - r.arrival + r.verify_time).sum()
        return {"device_load": float(device / allowed), "gpu_load": float(server / allowed)}
    done = responses[responses.measured & ~responses.censored & (responses.output_len > 1)]
    after = (done.t_end - done.t_first).to_numpy(float)
    ok = ~np.isnan(after)
    allowed = float((done.output_len.to_numpy(float)[ok] - 1).sum()) / slo
    return {"device_load": NAN, "gpu_load": float(after[ok].sum() / allowed) if allowed > 0 else NAN}


def verdict(loads: dict[str, float]) -> dict[str, Any]:
    """``binds`` and ``headroom`` from a row's loads (module text)."""
    best, top = "", -math.inf
    for name, cols in RESOURCES.items():
        vals = [loads.get(c, NAN) for c in cols]
        vals = [v for v in vals if v == v]
        if vals and max(vals) > top:
            best, top = name, max(vals)
    return {"binds": best or "none", "headroom": 1.0 - top if best else NAN}


def demand_ratio(result: SimResult, devices: dict[float, int], committed_tps: float) -> float:
    """The rate the SLO needs over the rate the run served (module text): ``devices`` per class SLO,
    ``committed_tps`` what they committed; 1 under open arrivals (the arrivals set the rate)."""
    if result.scenario.arrivals.process != "closed" or not committed_tps > 0:
        return 1.0
    return sum(n * slo for slo, n in devices.items()) / committed_tps


def binding_rows(
    result: SimResult, classes: list[float], rounds: pd.DataFrame | None, demand: float = 1.0
) -> list[dict[str, Any]]:
    """Per class (in ``classes``' order) and, where there are several, for all: the loads, what
    binds and its headroom (:data:`BINDING_COLUMNS`). ``rounds``: the run's measured rounds with
    :data:`BINDING_ROUND_COLUMNS` (None under centralized serving); ``demand``:
    :func:`demand_ratio`."""
    shared = shared_loads(result, demand)
    resp = result.responses
    rows = []
    for slo in classes:
        mine = rounds[rounds.slo == slo] if rounds is not None else None
        own = class_loads(mine, resp[resp.slo == slo], slo)
        rows.append({**own, **shared})
    if len(classes) > 1:
        tight = {
            c: max((r[c] for r in rows if r[c] == r[c]), default=NAN) for c in ("device_load", "gpu_load")
        }
        rows.append({**tight, **shared})
    return [{**r, **verdict(r)} for r in rows]


NAMES = {
    "device": "devices (drafting, link)",
    "gpu": "GPU",
    "kv": "KV memory",
    "max_num_seqs": "max_num_seqs",
    "engine_cpu": "engine-core CPU",
    "api_server": "API server",
}


def describe(row: pd.Series | dict[str, Any]) -> str:
    """One line a run prints: what binds, with its headroom, then the other loads, largest first
    (the GPU's with its busy share, which is not its load)."""
    if row["binds"] == "none":
        return "binds: nothing measured (no batch or round inside the window)"
    loads = []
    for name, cols in RESOURCES.items():
        vals = [float(row[c]) for c in cols if row[c] == row[c]]
        if vals:
            loads.append((max(vals), name))
    loads.sort(reverse=True)
    busy = row.get("gpu_utilization", NAN)

    def said(name: str, load: float) -> str:
        extra = f" (busy {busy:.2f})" if name == "gpu" and busy == busy else ""
        return f"{NAMES[name]} {load:.2f}{extra}"

    head = float(row["headroom"])
    room = "past its limit" if head < 0 else f"{head:.0%} headroom"
    others = [said(n, v) for v, n in loads if n != row["binds"]]
    return (
        f"binds: {NAMES[row['binds']]} (load {1 - head:.2f}, {room}); "
        f"other loads: {', '.join(others) or 'none'} (wispsim.analysis.binding)"
    )
