"""Public GPU measurements: calibrate the roofline on some, check it on the runs the fit never saw.

``experiments/data/public/runs.csv`` holds real ``vllm bench serve`` (and inference-perf) runs on
H100 GPUs, each with its server settings, workload and figures (README.md there says where each
comes from). :func:`simulate_run` simulates one run as it ran (:mod:`wispsim.study.bench`: the
centralized server with the run's ``max_num_seqs``, ``max_num_batched_tokens`` and KV capacity,
its arrival rate and concurrency, its lengths) on the physical profile of its architecture, GPU,
tensor parallelism and precision (:func:`wispsim.model.physical.physical_profile`);
:func:`calibrate` fits the engine's efficiencies and overheads on the calibration runs (least
squares on log errors of TPOT, TTFT and throughput) and :func:`compare` puts simulated and real
side by side for every run, calibration and held-out apart.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.model.archs import load_arch, load_gpu
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import Profile, parse_profile
from wispsim.model.startup import profile_startup
from wispsim.model.weight_only import padded_experts
from wispsim.study.bench import BenchRun, bench

# figures compared, real column -> what the simulator reports under the same name
METRICS = (
    "ttft_mean_ms",
    "ttft_median_ms",
    "ttft_p99_ms",
    "tpot_mean_ms",
    "tpot_median_ms",
    "itl_mean_ms",
    "itl_median_ms",
    "itl_p99_ms",
    "e2e_mean_ms",
    "e2e_p99_ms",
    "output_throughput_tok_s",
)
# the four headline metrics: each a family of the columns above
FAMILIES = {
    "TPOT/ITL": ("tpot_median_ms", "tpot_mean_ms", "itl_mean_ms", "itl_median_ms"),
    "P99 ITL": ("itl_p99_ms",),
    "throughput": ("output_throughput_tok_s",),
    "TTFT": ("ttft_median_ms", "ttft_mean_ms", "ttft_p99_ms"),
    "E2E": ("e2e_mean_ms", "e2e_p99_ms"),
}
# fitted parameters: (section, key, lower, upper). The engine's overheads only: the kernel
# efficiencies are the GPU generation's, measured at kernel level (wispsim/data/efficiency.yaml),
# and everything else is a datasheet or config fact. The engine core's per-step and per-request
# work is the host CPU's, measured on vLLM (wispsim.model.host_cpu): what is fitted is how fast
# the GPU servers' CPU is against the measuring host's; the GPU's per-arrival term keeps what the
# data still needs beside it; ``frontend`` is the API server's latency beyond its CPU work
FITTED = (
    ("roofline", "host_cpu_speed", 0.2, 20.0),
    ("overhead_ms", "arrival", 0.0, 20.0),
    ("overhead_ms", "frontend", 0.0, 100.0),
)
MAX_PROMPTS = 3000  # long open-loop runs are simulated on their first prompts (steady state)


def data_dir(root: Path | None = None) -> Path:
    from wispsim.study.experiments.spec import experiments_dir

    return (root or experiments_dir()) / "data" / "public"


@cache
def load_runs(folder: str) -> pd.DataFrame:
    return pd.read_csv(Path(folder) / "runs.csv")


@cache
def _memory(folder: str) -> dict[str, int]:
    mem = pd.read_csv(Path(folder) / "memory.csv")
    out: dict[str, int] = {}
    for row in mem.itertuples():
        if isinstance(row.kv_tokens, int | float) and math.isfinite(row.kv_tokens):
            out.setdefault(str(row.group), int(row.kv_tokens))
    return out


@cache
def _lengths(folder: str, group: str) -> pd.DataFrame | None:
    p = Path(folder) / "lengths" / f"{group}.csv"
    return pd.read_csv(p) if p.is_file() else None


def _f(row: pd.Series, key: str) -> float | None:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return float(v)


def bench_run(row: pd.Series, folder: str) -> BenchRun:
    """The benchmark as the row says it ran."""
    lengths = _lengths(folder, str(row["group"]))
    mine = lengths[lengths.run_id == row["run_id"]] if lengths is not None else None
    if mine is not None and len(mine):
        ins, outs = mine.input_len.to_numpy(int), mine.output_len.to_numpy(int)
    else:  # only the means are published: every request at the mean (the runs fix max tokens)
        ins = np.array([round(_f(row, "input_len_mean") or 1)])
        outs = np.array([max(round(_f(row, "output_len_mean") or 1), 1)])
    conc, rate = _f(row, "concurrency"), _f(row, "request_rate")
    kv = _memory(folder).get(str(row["group"]))
    return BenchRun(
        num_prompts=min(int(_f(row, "num_prompts") or len(ins)), MAX_PROMPTS),
        input_lens=ins.tolist(),
        output_lens=outs.tolist(),
        concurrency=int(conc) if conc else None,
        request_rate=rate if rate and math.isfinite(rate) else None,
        max_num_seqs=int(_f(row, "max_num_seqs") or 256),
        max_num_batched_tokens=int(_f(row, "max_num_batched_tokens") or 8192),
        kv_tokens=kv,
        block_size=int(_f(row, "block_size") or 16),
        gpu_memory_utilization=_f(row, "gpu_memory_utilization") or 0.9,
        async_scheduling="async_scheduling=True" in str(row.get("notes", "")),
        **_engine_generation(row),
        prefix_caching=str(row.get("prefix_caching")).lower() == "true",
        prompt_groups=int(_f(row, "prompt_groups") or 0),
        prompts_per_group=int(_f(row, "prompts_per_group") or 0),
        shared_prefix_tokens=int(_f(row, "shared_prefix_tokens") or 0),
        **_speculation(row),
    )


def engine_generation(version: object) -> str:
    """V0 before vLLM 0.8, V1 from it; a source build without tags (``0.1.devN+g<hash>``, as the
    2025 runs of tomasruizt/vllm-scripts report) is V1; no version at all is ``V1?``."""
    text = str(version)
    if re.match(r"0\.1\.dev\d+\+g", text):  # setuptools-scm's version of an untagged checkout
        return "V1"
    m = re.search(r"(\d+)\.(\d+)", text)
    if not m:  # no version (NaN reads "nan")
        return "V1?"
    major, minor = int(m.group(1)), int(m.group(2))
    return "V0" if (major, minor) < (0, 8) else "V1"


def _engine_generation(row: pd.Series) -> dict[str, Any]:
    """The run's engine as it ran: V0 for vLLM before 0.8 (its scheduler), chunked prefill as the
    row says (empty: the generation's default), V0's multi-step scheduling where it was set, and
    its runs streamed at their ends before vLLM 0.6.3 (streaming from multi-step runs came with
    pull request #8335, off by default, and ``--multi-step-stream-outputs`` turned on by default
    with pull request #9047, 2024-10-03)."""
    chunked = str(row.get("chunked_prefill")).lower()
    version = str(row.get("engine_version"))
    v0 = engine_generation(version) == "V0"
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    early = m is not None and tuple(int(x) for x in m.groups()) < (0, 6, 3)
    return {
        "use_v1": False if v0 else None,
        "enable_chunked_prefill": {"true": True, "false": False}.get(chunked),
        "num_scheduler_steps": int(_f(row, "num_scheduler_steps") or 1),
        "multi_step_stream_outputs": not early,
    }


# the public runs' speculative methods -> server.speculation.method (EAGLE-3 heads are ``eagle``)
SPEC_METHODS = {"none": "none", "draft": "draft", "eagle": "eagle", "eagle3": "eagle", "ngram": "ngram"}


def _speculation(row: pd.Series) -> dict[str, Any]:
    """The run's server-side speculation as it ran: method, draft, k and the acceptance length
    the server reported (the simulator draws each step's accepted run from it)."""
    method = SPEC_METHODS[str(row.get("spec_method") or "none")]
    if method == "none":
        return {}
    draft = row.get("draft_arch")
    return {
        "spec_method": method,
        "draft_arch": str(draft) if method == "draft" and isinstance(draft, str) else None,
        "num_spec_tokens": int(_f(row, "num_spec_tokens") or 1),
        "acceptance_length": _f(row, "acceptance_length"),
    }


def profile_for(row: pd.Series, params: dict[str, Any] | None = None) -> Profile:
    """The physical profile of the row's deployment (``params``: efficiencies and overheads)."""
    arch = load_arch(str(row["arch"]))
    # fp8: an fp8 checkpoint's own weights, or vLLM's --quantization fp8 of a 16-bit one
    fp8 = str(row.get("dtype", "")).lower() in ("fp8", "float8") and not arch.quant_method
    data = physical_profile(
        arch,
        load_gpu(str(row["gpu"])),
        count=int(_f(row, "tp") or 1),
        precision="fp8" if fp8 else "bf16",
        params=params,
        noise_sigma=0.0,
    )
    return parse_profile(data, f"public run {row['run_id']}")


def simulate_run(
    row: pd.Series,
    folder: str,
    params: dict[str, Any] | None = None,
    draft: dict[str, float] | None = None,
) -> dict[str, float]:
    """Simulate one run as it ran; ``draft``: the draft-pass costs of a speculative run
    (``draft_pass_ms``, ``draft_layer_us``; None: the shipped calibration's)."""
    run = bench_run(row, folder)
    if draft is not None:
        run = dataclasses.replace(run, draft_overheads=draft)
    return bench(profile_for(row, params), run).figures()


def _get(params: dict[str, Any], sec: str, key: str) -> float:
    return float(params[key] if sec == "roofline" else params.get(sec, {}).get(key, 0.0))


def _params(
    x: Sequence[float], base: dict[str, Any], fitted: Sequence[tuple[str, str, float, float]]
) -> dict[str, Any]:
    """``base`` with the fitted parameters set to ``x`` (``roofline`` names a top-level one)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for (sec, key, _, _), v in zip(fitted, x, strict=True):
        if sec == "roofline":
            out[key] = float(v)
        else:
            out.setdefault(sec, {})[key] = float(v)
    return out


@dataclass(frozen=True)
class Calibration:
    params: dict[str, Any]
    runs: list[str]
    cost: float
    evaluations: int


def calibrate(
    runs: pd.DataFrame,
    folder: str,
    base: dict[str, Any],
    progress: Callable[[int, float], None] | None = None,
    fitted: Sequence[tuple[str, str, float, float]] = FITTED,
) -> Calibration:
    """Fit :data:`FITTED` on ``runs``: least squares on log(simulated / real) of median TPOT,
    median TTFT and output throughput (each run weighs the same)."""
    from scipy.optimize import least_squares

    targets = ("tpot_median_ms", "ttft_median_ms", "output_throughput_tok_s")
    n_eval = 0

    def residuals(x: np.ndarray) -> np.ndarray:
        nonlocal n_eval
        params = _params(x, base, fitted)
        res = []
        for _, row in runs.iterrows():
            sim = simulate_run(row, folder, params)
            for m in targets:
                real = _f(row, m)
                if real and real > 0:
                    res.append(math.log(max(sim[m], 1e-9) / real))
        n_eval += 1
        r = np.asarray(res)
        if progress is not None:
            progress(n_eval, float(np.sum(r**2)))
        return r

    x0 = np.array([_get(base, sec, key) for sec, key, _, _ in fitted], dtype=float)
    lo = np.array([b[2] for b in fitted])
    hi = np.array([b[3] for b in fitted])
    fit = least_squares(residuals, np.clip(x0, lo, hi), bounds=(lo, hi), diff_step=0.05, max_nfev=80)
    return Calibration(_params(fit.x, base, fitted), list(runs.run_id), float(2 * fit.cost), n_eval)


def compare(
    runs: pd.DataFrame,
    folder: str,
    params: dict[str, Any] | None,
    calibration_runs: Sequence[str],
    draft: dict[str, float] | None = None,
) -> pd.DataFrame:
    """Simulated and real side by side, one row per run and metric, with the absolute
    percentage error and whether the fit saw the run."""
    rows = []
    seen = set(calibration_runs)
    for _, row in runs.iterrows():
        sim = simulate_run(row, folder, params, draft)
        # a family the source's own numbers rule out (runs.csv ``excluded_metrics`` says why)
        excluded = str(row.get("excluded_metrics") or "").split(":")[0].split(",")
        for m in METRICS:
            real = _f(row, m)
            if real is None or real <= 0 or any(e.strip() and m.startswith(e.strip()) for e in excluded):
                continue
            rows.append(
                {
                    "run_id": row["run_id"],
                    "group": row["group"],
                    "set": "calibration" if row["run_id"] in seen else "held-out",
                    "metric": m,
                    "real": real,
                    "simulated": sim[m],
                    "ape_pct": abs(sim[m] - real) / real * 100,
                    "concurrency": _f(row, "concurrency"),
                    "request_rate": _f(row, "request_rate"),
                    "preemptions": sim["preemptions"],
                }
            )
    return pd.DataFrame(rows)


GIB = 1024**3


def memory_check(folder: str) -> pd.DataFrame:
    """wispsim's memory facts against what the public runs' servers logged, per deployment without
    speculation: weight GiB per GPU, KV bytes per token per GPU (logged: KV GiB over KV tokens;
    inference-sim logs KV blocks, not weights), and the activation reserve the engine kept
    (GPU memory x utilization - weights - KV) beside wispsim's (vLLM's start-up profile at the run's
    ``max_num_seqs`` and ``max_num_batched_tokens``, :mod:`wispsim.model.startup`), and the KV tokens
    logged beside those wispsim gives the server."""
    mem = pd.read_csv(Path(folder) / "memory.csv")
    runs = load_runs(folder)
    rows = []
    for group, g in mem.groupby("group", sort=False):
        r = g.iloc[0]
        if pd.isna(r.gpu):  # the GPU was not recorded: nothing to hold the memory against
            continue
        run = runs[runs.group == group].iloc[0]
        if run.spec_method != "none":  # a draft model's weights and KV share the GPU (next issue)
            continue
        tp = int(r.tp)
        gpu = load_gpu(str(r.gpu))
        arch = padded_experts(load_arch(str(run["arch"])), gpu.generation, tp)  # its experts as stored
        weights = arch.weight_bytes(2)
        logged_w = float(r.weights_gib) if pd.notna(r.weights_gib) else math.nan
        kv_gib = float(r.kv_cache_gib)
        util = float(r.gpu_memory_utilization) if pd.notna(r.gpu_memory_utilization) else 0.9
        prof = profile_for(run)
        start = profile_startup(prof, int(run.max_num_seqs), int(run.max_num_batched_tokens))
        rows.append(
            {
                "group": group,
                "gpu": r.gpu,
                "tp": tp,
                "weights GiB/GPU logged": logged_w,
                "weights GiB/GPU wispsim": weights / tp / GIB,
                "KV B/token/GPU logged": kv_gib * GIB / float(r.kv_tokens),
                "KV B/token/GPU wispsim": arch.kv_bytes_per_token(2) / tp,
                "reserve GiB/GPU implied": gpu.memory_gib * util
                - (weights / tp / GIB if math.isnan(logged_w) else logged_w)
                - kv_gib,
                "reserve GiB/GPU wispsim": start.reserve_gib,
                "KV tokens logged": int(r.kv_tokens),
                "KV tokens wispsim": prof.kv_capacity_tokens(util, start.reserve_gib),
            }
        )
    return pd.DataFrame(rows)


def summary(errors: pd.DataFrame) -> pd.DataFrame:
    """Median and mean APE per metric family, set and group (the issue's MAPE table)."""
    fam = {m: f for f, ms in FAMILIES.items() for m in ms}
    e = errors.assign(family=errors.metric.map(fam))
    by = e.groupby(["set", "family"]).ape_pct.agg(["median", "mean", "count"]).round(1)
    return by.reset_index()
