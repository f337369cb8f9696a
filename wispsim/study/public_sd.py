"""Server-side speculative decoding checked on public runs: Qwen3-32B on an H100 with a Qwen3-1.7B
or Qwen3-4B draft model or an EAGLE-3 head, k = 1-6, concurrency 1-256 (tomasruizt/vllm-scripts,
``experiments/data/public``).

Each run is simulated as it ran (:func:`wispsim.study.public.simulate_run`: the centralized server
with ``server.speculation`` set to the run's method, draft and k, each step's accepted run drawn
from the acceptance length the server reported). The target's parameters are the shipped ones
(fitted on runs without speculation); only the two costs of a draft pass the roofline cannot see
(:mod:`wispsim.model.speculation`: per pass, per layer) are fitted here, on the ``calibration``
runs; every other run is held out. :func:`memory_check` sets the draft's weights and KV bytes per
token against what the servers logged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from wispsim.model.archs import load_arch
from wispsim.study.public import GIB, SPEC_METHODS, _f, load_runs, simulate_run

# fitted: (key, lower, upper) of wispsim/data/speculation.yaml
FITTED = (("draft_pass_ms", 0.0, 5.0), ("draft_layer_us", 0.0, 200.0))
TARGETS = ("itl_mean_ms", "tpot_median_ms", "output_throughput_tok_s")


def speculative_runs(folder: str) -> pd.DataFrame:
    """The runs with server-side speculation on a GPU the data names (the Llama-3.3-70B runs do
    not record theirs)."""
    runs = load_runs(folder)
    return runs[(runs.spec_method != "none") & runs.gpu.notna()]


@dataclass(frozen=True)
class DraftFit:
    overheads: dict[str, float]
    runs: list[str]
    cost: float
    evaluations: int


def calibrate(
    runs: pd.DataFrame,
    folder: str,
    start: dict[str, float],
    progress: Callable[[int, float], None] | None = None,
) -> DraftFit:
    """Least squares on log(simulated / real) of ITL, median TPOT and throughput of ``runs``."""
    from scipy.optimize import least_squares

    n_eval = 0

    def overheads(x: np.ndarray) -> dict[str, float]:
        return {key: float(v) for (key, _, _), v in zip(FITTED, x, strict=True)}

    def residuals(x: np.ndarray) -> np.ndarray:
        nonlocal n_eval
        res = []
        for _, row in runs.iterrows():
            sim = simulate_run(row, folder, None, overheads(x))
            for m in TARGETS:
                real = _f(row, m)
                if real and real > 0:
                    res.append(math.log(max(sim[m], 1e-9) / real))
        n_eval += 1
        r = np.asarray(res)
        if progress is not None:
            progress(n_eval, float(np.sum(r**2)))
        return r

    x0 = np.array([start[k] for k, _, _ in FITTED], dtype=float)
    lo = np.array([b[1] for b in FITTED])
    hi = np.array([b[2] for b in FITTED])
    fit = least_squares(residuals, np.clip(x0, lo, hi), bounds=(lo, hi), diff_step=0.05, max_nfev=60)
    return DraftFit(overheads(fit.x), list(runs.run_id), float(2 * fit.cost), n_eval)


def memory_check(folder: str) -> pd.DataFrame:
    """The draft's weights and KV bytes per token, wispsim's against the servers' logs (logged
    weights with the draft minus the same deployment's without; logged KV GiB over KV tokens
    minus the target's bytes per token)."""
    mem = pd.read_csv(Path(folder) / "memory.csv")
    runs = load_runs(folder)
    rows = []
    for group, g in mem.groupby("group", sort=False):
        run = runs[runs.group == group].iloc[0]
        base = mem[(mem.group == str(group).split("-sd-")[0].split("-eagle3")[0] + "-nospec")]
        if run.spec_method == "none" or pd.isna(run.gpu) or base.empty:
            continue
        r, b = g.iloc[0], base.iloc[0]
        method = SPEC_METHODS[str(run.spec_method)]
        target = load_arch(str(run.arch))
        draft = load_arch(str(run.draft_arch) if method == "draft" else f"{target.name}-eagle3")
        tp = int(r.tp)
        logged_kv = float(r.kv_cache_gib) * GIB / float(r.kv_tokens) - target.kv_bytes_per_token(2) / tp
        rows.append(
            {
                "group": group,
                "draft": draft.name,
                "draft weights GiB logged": float(r.weights_gib) - float(b.weights_gib),
                "draft weights GiB wispsim": draft.weight_bytes(2) / tp / GIB,
                "draft KV B/token logged": logged_kv,
                "draft KV B/token wispsim": draft.kv_bytes_per_token(2) / tp,
            }
        )
    return pd.DataFrame(rows)


def by_k(errors: pd.DataFrame, runs: pd.DataFrame, metrics: Sequence[str] = TARGETS) -> pd.DataFrame:
    """Median APE per deployment, k and metric (held-out runs)."""
    k = runs.set_index("run_id").num_spec_tokens
    e = errors[(errors.set == "held-out") & errors.metric.isin(metrics)]
    e = e.assign(k=e.run_id.map(k).astype(int))
    return e.groupby(["group", "k", "metric"]).ape_pct.median().unstack("metric").round(1).reset_index()
