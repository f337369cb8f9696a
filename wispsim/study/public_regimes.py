"""Errors on public runs by regime: GPU x tensor parallelism x load x engine generation (x dense
or mixture), the way issue 45 asks them read.

:func:`regime_of` names a run's regime from its ``runs.csv`` row: the GPU and TP size; the load
(``light``: at most 8 requests in flight by ``--max-concurrency``; ``all at once``: every request
sent at t=0, so TTFT is mostly queueing; ``open loop``: Poisson arrivals at a rate; ``closed
loop``: a concurrency above 8); the engine generation (vLLM's V0 engine before 0.8, V1 from it,
as the row's version says); and whether the model is a mixture of experts. :func:`regime_table`
gives, per regime and metric family, the median absolute and the median signed error (simulated /
real - 1: negative = the simulator is too fast or too optimistic) over a
:func:`wispsim.study.public.compare` table.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pandas as pd

from wispsim.model.archs import load_arch
from wispsim.study.bench import BenchRun, bench
from wispsim.study.public import FAMILIES, METRICS, bench_run, engine_generation, profile_for


def load_of(row: pd.Series) -> str:
    conc = row.get("concurrency")
    rate = row.get("request_rate")
    conc = float(conc) if conc is not None and not pd.isna(conc) else math.nan
    rate = float(rate) if rate is not None and not pd.isna(rate) else math.inf
    if conc <= 8:
        return "light"
    if math.isfinite(rate):
        return "open loop"
    return "closed loop" if math.isfinite(conc) else "all at once"


def regime_of(row: pd.Series) -> dict[str, str]:
    arch = load_arch(str(row["arch"]))
    return {
        "gpu": str(row["gpu"]),
        "tp": str(int(row["tp"])),
        "load": load_of(row),
        "engine": engine_generation(row.get("engine_version")),
        "model": "MoE" if arch.experts > 1 else "dense",
    }


def regime_table(errors: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Median |error| and median signed error (%) per regime and metric family."""
    fam = {m: f for f, ms in FAMILIES.items() for m in ms}
    reg = pd.DataFrame([{"run_id": r.run_id, **regime_of(r)} for _, r in runs.iterrows()])
    e = errors.merge(reg, on="run_id").assign(
        family=errors.metric.map(fam), signed=(errors.simulated / errors.real - 1) * 100
    )
    e = e[e.family.notna()]
    keys = ["gpu", "tp", "model", "load", "engine", "family"]
    out = e.groupby(keys).agg(
        runs=("run_id", "nunique"), median_ape=("ape_pct", "median"), median_signed=("signed", "median")
    )
    return out.round(1).reset_index()


def regime_wide(table: pd.DataFrame) -> pd.DataFrame:
    """One row per regime; each family's cell is ``median |error| (median signed error)`` in %."""
    keys = ["gpu", "tp", "model", "load", "engine"]
    t = table.assign(
        cell=table.median_ape.map("{:.0f}".format) + " (" + table.median_signed.map("{:+.0f}".format) + ")"
    )
    wide = t.pivot_table(index=keys, columns="family", values="cell", aggfunc="first").reset_index()
    wide = wide.merge(t.groupby(keys).runs.max().reset_index(), on=keys)
    cols = [*keys, "runs", *[f for f in FAMILIES if f in wide]]
    return wide[cols].fillna("-")


SPREAD_CV = 1.0  # the sensitivity's length spread (coefficient of variation), not a fitted value


def spread(run: BenchRun, dataset: str, seed: int = 0, outputs: bool = True) -> BenchRun:
    """``run`` (a :class:`wispsim.study.bench.BenchRun` whose requests all have the run's mean
    lengths) with lengths spread around the same means: outputs lognormal with coefficient of
    variation :data:`SPREAD_CV`, at most 4x the mean (end-of-sequence stops a request anywhere);
    inputs spread the same way for ShareGPT (at most 1,024, vLLM's filter), kept for synthetic
    prompts. A sensitivity check of the mean-lengths replay, not the model's default."""
    rng = np.random.default_rng(seed)
    n = run.num_prompts

    def draw(mean: float, hi: float) -> list[int]:
        s = math.sqrt(math.log(1 + SPREAD_CV**2))
        x = rng.lognormal(math.log(mean) - s * s / 2, s, n)
        return np.clip(np.round(x), 1, hi).astype(int).tolist()

    out_mean = float(np.mean(run.output_lens))
    in_mean = float(np.mean(run.input_lens))
    ins = draw(in_mean, 1024) if "sharegpt" in dataset.lower() else list(run.input_lens)
    outs = draw(out_mean, 4 * out_mean) if outputs else list(run.output_lens)
    return dataclasses.replace(run, input_lens=ins, output_lens=outs)


def spread_errors(runs: pd.DataFrame, folder: str) -> pd.DataFrame:
    """:func:`wispsim.study.public.compare`'s table for the runs replayed at their mean lengths,
    simulated again with :func:`spread` lengths: outputs spread unless the client fixed them
    (``--ignore-eos`` in the row's notes), ShareGPT inputs spread; runs with per-request lengths,
    and runs where nothing varies, are left out."""
    rows = []
    for _, row in runs.iterrows():
        run = bench_run(row, folder)
        if len(run.input_lens) > 1 or len(run.output_lens) > 1:  # per-request lengths known
            continue
        text = f"{row.get('notes', '')} {row.get('dataset', '')}".lower()
        # the client fixed every output's length (--ignore-eos), unless the notes say it did not
        fixed = bool(re.search(r"ignore[-_]eos", text)) and not re.search(r"\bno\s+-*ignore[-_]eos", text)
        dataset = str(row.get("dataset", ""))
        if fixed and "sharegpt" not in dataset.lower():
            continue  # nothing varies in the real run either
        sim = bench(profile_for(row), spread(run, dataset, outputs=not fixed)).figures()
        excluded = str(row.get("excluded_metrics") or "").split(":")[0].split(",")
        for m in METRICS:
            real = row.get(m)
            if real is None or pd.isna(real) or real <= 0:
                continue
            if any(e.strip() and m.startswith(e.strip()) for e in excluded):
                continue
            rows.append(
                {"run_id": row["run_id"], "metric": m, "real": float(real), "simulated": sim[m],
                 "ape_pct": abs(sim[m] - real) / real * 100}
            )  # fmt: skip
    return pd.DataFrame(rows)
