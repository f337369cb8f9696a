"""Recorded versus simulated: what a replay changes, and how its outcomes compare with the log.

:func:`describe` says in one paragraph what a replay under a scenario keeps from the log and what
it simulates. :func:`compare` puts the recorded outcomes (:func:`recorded_responses`, from the
log) and the simulated ones (a :class:`~wispsim.sim.records.SimResult` from
:func:`wispsim.study.replay.drive.replay`) side by side per class: violation rates with a Wilson
interval on the recorded one, queue and verify time quantiles, and Kolmogorov-Smirnov statistics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from wispsim.analysis.metrics import class_label
from wispsim.config import Scenario
from wispsim.sim.records import SimResult
from wispsim.sim.serving import serving_of
from wispsim.study.replay.log import UNFINISHED_KEYS


def describe(scenario: Scenario, meta: Mapping[str, Any]) -> str:
    """What a replay under ``scenario`` keeps from the log and what it changes (one paragraph)."""
    srv = scenario.server
    recorded = meta.get("policy")
    if serving_of(scenario).name == "centralized":
        return (
            "centralized: the recorded responses (start gaps, prompt and output lengths, first uplink "
            "and last downlink times) are served by the centralized engine; nothing is drafted"
        )
    what = (
        f"scheduler {srv.scheduler}, prefix cache {'on' if srv.engine.enable_prefix_caching else 'off'}, "
        f"profile {srv.profile}, {srv.replicas} replica(s)"
        + (f", {srv.router} router" if srv.replicas > 1 else "")
    )
    same = (
        " (the recorded policy)" if recorded == scenario.policy else f" (recorded: {recorded or 'unknown'})"
    )
    return (
        f"{scenario.policy}{same}: the device side (k, acceptance, draft and network times, response "
        f"gaps) is replayed as recorded; only the server side is simulated: {what}. A per-round log has "
        "no draft features, so another drafting controller cannot be replayed (use an acceptance "
        "trace for that)"
    )


def recorded_responses(log: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per logged response: device, class, measured, finished, speed, violated.

    A finished response (its rounds committed ``output_tokens``) is violated when output_tokens /
    (last t_end - response_start) < slo. An unfinished one (recording stopped inside it, or it
    completed no round: ``meta["unfinished"]``) counts as violated, as wispsim counts a censored
    response: it was still running when the run had to end."""
    g = log.groupby("response", sort=True)
    head = g.first()
    last = g.last()
    done = last.position + last.committed
    finished = np.isfinite(head.output_tokens) & (done >= head.output_tokens)
    wall = last.t_end - head.response_start
    speed = np.where(wall > 0, head.output_tokens / wall.where(wall > 0, 1.0), np.inf)
    df = pd.DataFrame(
        {
            "response": head.index.to_numpy(),
            "device": head.device.to_numpy(),
            "slo": head.slo.to_numpy(),
            "measured": head.measured.to_numpy(dtype=bool),
            "finished": finished.to_numpy(),
            "speed": np.where(finished, speed, np.nan),
        }
    )
    unf = pd.DataFrame(list((meta or {}).get("unfinished", [])), columns=list(UNFINISHED_KEYS))
    if len(unf):
        stub = pd.DataFrame(
            {
                "response": unf.response.astype("int64"),
                "device": unf.device.astype("int64"),
                "slo": unf.slo.astype(float),
                "measured": unf.measured.astype(bool),
                "finished": False,
                "speed": np.nan,
            }
        )
        df = pd.concat([df, stub], ignore_index=True)
    df["violated"] = ~df.finished | (df.speed < df.slo)
    return df


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (95% by default)."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(c - h, 0.0), min(c + h, 1.0)


QUANTILES = (50, 90, 99)


def _time_quantiles(rec: np.ndarray, sim: np.ndarray, name: str) -> dict[str, float]:
    from scipy.stats import ks_2samp

    rec = rec[np.isfinite(rec)]
    sim = sim[np.isfinite(sim)]
    row: dict[str, float] = {}
    for q in QUANTILES:
        a = float(np.quantile(rec, q / 100)) * 1000 if len(rec) else math.nan
        b = float(np.quantile(sim, q / 100)) * 1000 if len(sim) else math.nan
        row[f"{name}_p{q}_ms_recorded"] = a
        row[f"{name}_p{q}_ms_simulated"] = b
        row[f"{name}_p{q}_ms_diff"] = b - a
    row[f"{name}_ks"] = (
        float(ks_2samp(rec, sim, method="asymp").statistic) if len(rec) and len(sim) else math.nan
    )
    return row


def _compare_row(
    label: str,
    rec: pd.DataFrame,
    sim: pd.DataFrame,
    rec_rounds: pd.DataFrame,
    sim_rounds: pd.DataFrame,
    truncated: int,
) -> dict[str, Any]:
    n = len(rec)
    k = int(rec.violated.sum())
    lo, hi = wilson(k, n)
    v_rec = k / n if n else math.nan
    v_sim = float(sim.violated.mean()) if len(sim) else math.nan
    sim_queue = (sim_rounds.dispatch - sim_rounds.arrival).to_numpy(float)
    sim_verify = sim_rounds.verify_time.to_numpy(float)
    return {
        "class": label,
        "responses_recorded": n,
        "responses_simulated": len(sim),
        "unfinished_recorded": int((~rec.finished).sum()),
        "unfinished_simulated": int(sim.unfinished.sum()),
        "truncated_simulated": truncated,
        "violation_recorded": v_rec,
        "violation_recorded_lo": lo,
        "violation_recorded_hi": hi,
        "violation_simulated": v_sim,
        "violation_diff": v_sim - v_rec,
        **_time_quantiles(rec_rounds.queue_s.to_numpy(float), sim_queue, "queue"),
        **_time_quantiles(rec_rounds.verify_s.to_numpy(float), sim_verify, "verify"),
    }


def compare(log: pd.DataFrame, simulated: SimResult, meta: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Recorded versus simulated, per class and ``all``, over measured responses and their rounds.

    Violation rates (the recorded one with a 95% Wilson interval, which treats responses as
    independent), queue and verify time quantiles in ms with differences (simulated - recorded),
    and the two-sample Kolmogorov-Smirnov statistic of the queue and verify time distributions.
    Under centralized serving there are no simulated rounds, so those columns are empty."""
    rec = recorded_responses(log, meta)
    rec = rec[rec.measured]
    rec_rounds = log[log.measured]
    sr = simulated.rounds
    sim_rounds = sr[sr.measured]
    sim = simulated.responses[simulated.responses.measured].copy()
    # a censored response may still have finished before the run ended (it was late anyway):
    # unfinished means its rounds never committed the whole output, as on the recorded side
    reached = (sim_rounds.position + sim_rounds.committed).groupby(sim_rounds.response).max()
    sim["unfinished"] = sim.censored & ~(sim.response.map(reached) >= sim.output_len)
    cut = pd.Series(simulated.info.get("truncated", {}), dtype=float)
    rows = []
    for slo in sorted(set(rec.slo) | set(sim.slo) | set(cut)):
        rows.append(
            _compare_row(
                class_label(slo),
                rec[rec.slo == slo],
                sim[sim.slo == slo],
                rec_rounds[rec_rounds.slo == slo],
                sim_rounds[sim_rounds.slo == slo],
                int((cut == slo).sum()),
            )
        )
    rows.append(_compare_row("all", rec, sim, rec_rounds, sim_rounds, len(cut)))
    return pd.DataFrame(rows)
