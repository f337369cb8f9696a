"""Calibrate a physical profile from a user's own ``vllm bench serve --save-result`` files.

Each result file is one benchmark run: its client settings (``num_prompts``, ``request_rate``,
``burstiness``, ``max_concurrency``; the per-request ``input_lens`` / ``output_lens`` where it was
saved with ``--save-detailed``, else the totals' means) and its figures (``median_tpot_ms``,
``median_ttft_ms``, ``output_throughput``, ...). The server's flags come from the file's
``server`` mapping (``wispsim bench`` writes one) or from the command line. The kernel efficiencies
stay the GPU generation's (measured at kernel level, wispsim/data/efficiency.yaml); what is fitted
is the engine on that host: ``step``, ``request``, ``arrival`` and ``frontend`` (ms), by least
squares on log(simulated / real) of median TPOT, median TTFT and output throughput, every run
weighing the same. :func:`leave_one_out` refits without each run and reports its errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wispsim.errors import ConfigError

FITTED = (("step", 0.0, 20.0), ("request", 0.0, 1.0), ("arrival", 0.0, 20.0), ("frontend", 0.0, 200.0))
TARGETS = ("median_tpot_ms", "median_ttft_ms", "output_throughput")
REPORTED = ("median_tpot_ms", "mean_itl_ms", "median_ttft_ms", "mean_e2el_ms", "output_throughput")


@dataclass(frozen=True)
class Result:
    """One ``vllm bench serve`` result file, as it ran."""

    path: str
    run: Any  # wispsim.study.bench.BenchRun
    real: dict[str, float]


def _num(d: dict[str, Any], key: str, src: str, *, required: bool = True) -> float | None:
    v = d.get(key)
    if isinstance(v, str):  # vLLM writes an infinite request rate as "inf"
        try:
            v = float(v)
        except ValueError:
            raise ConfigError(src, key, f"got {v!r}; allowed: a number >= 0 or inf") from None
    if v is None:
        if required:
            raise ConfigError(src, key, "is missing (a vllm bench serve --save-result file has it)")
        return None
    if key == "request_rate" and v == math.inf:
        return math.inf
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ConfigError(src, key, f"got {v!r}; allowed: a number >= 0")
    return float(v)


def read_result(path: Path, server: dict[str, Any], max_prompts: int | None = None) -> Result:
    """A result file and the server flags it ran with (the file's ``server`` mapping first)."""
    from wispsim.study.bench import BenchRun
    from wispsim.tabular import read_json

    src = str(path)
    d = read_json(path, allow_nan=True)
    if not isinstance(d, dict):
        raise ConfigError(src, "", "must be a JSON object of vllm bench serve's result keys")
    done = int(_num(d, "completed", src) or 0)
    if done < 1:
        raise ConfigError(src, "completed", "no completed requests to calibrate on")
    prompts = _num(d, "num_prompts", src, required=False)
    if prompts is not None and done > prompts:
        raise ConfigError(src, "completed", f"{done} is more than num_prompts ({prompts:g}); allowed: <= it")
    ins = _lens(d, "input_lens", 0, src) or [round((_num(d, "total_input_tokens", src) or 0) / done)]
    outs = _lens(d, "output_lens", 0, src)  # a failed request's: 0
    if not outs:
        total = _num(d, "total_output_tokens", src) or 0
        if total < done:
            raise ConfigError(
                src, "total_output_tokens", f"{total:g} for {done} completed requests; allowed: >= {done}"
            )
        outs = [round(total / done)]
    n = int(prompts or done)
    if max_prompts:
        n = min(n, max_prompts)
    rate = _num(d, "request_rate", src, required=False)
    flags = {**server, **(d.get("server") or {})}
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if flags.get(key) is None:
            raise ConfigError(src, f"server.{key}", f"is missing: give --{key.replace('_', '-')}")
    run = BenchRun(
        num_prompts=n,
        input_lens=[int(x) for x in ins],
        output_lens=[max(int(x), 1) for x in outs],
        concurrency=int(d["max_concurrency"]) if d.get("max_concurrency") else None,
        request_rate=rate if rate and math.isfinite(rate) else None,
        burstiness=float(d.get("burstiness") or 1.0),
        max_num_seqs=int(flags["max_num_seqs"]),
        max_num_batched_tokens=int(flags["max_num_batched_tokens"]),
        prefix_caching=bool(flags.get("enable_prefix_caching", True)),
        # absent: vLLM's default for the engine's generation (bench_scenario: on for V1)
        async_scheduling=_switch(flags, "async_scheduling"),
        enable_chunked_prefill=_switch(flags, "enable_chunked_prefill"),
        num_scheduler_steps=int(flags.get("num_scheduler_steps") or 1),
        multi_step_stream_outputs=_switch(flags, "multi_step_stream_outputs") is not False,
        use_v1=_switch(flags, "vllm_use_v1"),
        gpu_memory_utilization=float(flags.get("gpu_memory_utilization", 0.9)),
        seed=int(d.get("seed") or 0),
    )
    real = {}
    for k in REPORTED:  # absent or NaN (vLLM's for a metric it could not compute): not reported
        v = d.get(k)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
            raise ConfigError(src, k, f"got {v!r}; allowed: a number > 0, or NaN where vLLM had none")
        real[k] = float(v)
    if not any(k in real for k in TARGETS):
        raise ConfigError(src, "median_tpot_ms", f"the file has none of {', '.join(TARGETS)}")
    return Result(src, run, real)


def _lens(d: dict[str, Any], key: str, least: int, src: str) -> list[int]:
    """A ``--save-detailed`` list of per-request lengths (empty where the file has none)."""
    v = d.get(key)
    if v is None or v == []:
        return []
    bad = not isinstance(v, list) or any(
        isinstance(x, bool) or not isinstance(x, int | float) or not least <= x < math.inf or x != int(x)
        for x in v
    )
    if bad:
        raise ConfigError(src, key, f"allowed: a list of whole numbers >= {least}, one per request")
    return [int(x) for x in v]


def _switch(flags: dict[str, Any], key: str) -> bool | None:
    """A server flag as a run's result file gives it (None: absent, the default)."""
    v = flags.get(key)
    return None if v is None else bool(v)


def simulate(profile_data: dict[str, Any], r: Result, overheads: dict[str, float]) -> dict[str, float]:
    """The run on the profile with these engine overheads (ms), in vLLM's result keys."""
    from wispsim.model.profiles import parse_profile
    from wispsim.study.bench import bench
    from wispsim.study.bench_metrics import vllm_result

    data = {**profile_data, "roofline": {**profile_data["roofline"]}}
    data["roofline"]["overhead_ms"] = {**data["roofline"]["overhead_ms"], **overheads}
    prof = parse_profile(data, "calibration")
    res = bench(prof, r.run)
    return vllm_result(res, r.run, r.run.request_rate, r.run.concurrency)


def fit(
    profile_data: dict[str, Any], results: Sequence[Result], progress: Callable[[int], None] | None = None
) -> dict[str, float]:
    from scipy.optimize import least_squares

    start = profile_data["roofline"]["overhead_ms"]
    x0 = np.array([min(max(float(start.get(k, 0.0)), lo), hi) for k, lo, hi in FITTED])
    evals = 0

    def resid(x: np.ndarray) -> np.ndarray:
        nonlocal evals
        over = {k: float(v) for (k, _, _), v in zip(FITTED, x, strict=True)}
        out = []
        for r in results:
            sim = simulate(profile_data, r, over)
            out += [math.log(max(sim[m], 1e-9) / r.real[m]) for m in TARGETS if m in r.real]
        evals += 1
        if progress:
            progress(evals)
        return np.array(out)

    lo = [b[1] for b in FITTED]
    hi = [b[2] for b in FITTED]
    sol = least_squares(resid, x0, bounds=(lo, hi), diff_step=0.05, max_nfev=40)
    return {k: float(f"{v:.4g}") for (k, _, _), v in zip(FITTED, sol.x, strict=True)}


def errors(profile_data: dict[str, Any], r: Result, over: dict[str, float]) -> dict[str, float]:
    sim = simulate(profile_data, r, over)
    return {m: abs(sim[m] / r.real[m] - 1) * 100 for m in REPORTED if m in r.real}


def leave_one_out(
    profile_data: dict[str, Any], results: Sequence[Result], progress: Callable[[int], None] | None = None
) -> list[dict[str, Any]]:
    """Each run's errors under the fit of the other runs (with one run: under the starting point)."""
    rows = []
    for i, r in enumerate(results):
        rest = [x for j, x in enumerate(results) if j != i]
        over = fit(profile_data, rest, progress) if rest else dict(profile_data["roofline"]["overhead_ms"])
        rows.append(
            {"run": Path(r.path).name, **{k: round(v, 1) for k, v in errors(profile_data, r, over).items()}}
        )
    return rows


def calibrate(
    results: Sequence[Path],
    profile_data: dict[str, Any],
    server: dict[str, Any],
    max_prompts: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], dict[str, float], list[dict[str, Any]]]:
    """Fit ``profile_data``'s engine overheads on the result files; returns the calibrated profile
    mapping, the fitted overheads (ms) and each run's errors under the fit of the others."""
    if not results:
        raise ConfigError("wispsim profile calibrate", "RESULT", "give one or more result JSON files")
    runs = [read_result(p, server, max_prompts) for p in results]
    over = fit(profile_data, runs, progress)
    loo = leave_one_out(profile_data, runs, progress) if len(runs) > 1 else []
    data = {**profile_data, "roofline": {**profile_data["roofline"]}}
    data["roofline"]["overhead_ms"] = {**data["roofline"]["overhead_ms"], **over}
    data["roofline"]["fit"] = {
        "by": "wispsim profile calibrate",
        "results": [str(p) for p in results],
        "fitted": (
            "engine overheads (step, request, arrival, frontend); "
            "kernel efficiencies are the GPU generation's"
        ),
        "leave_one_run_out_ape_pct": loo,
    }
    files = [str(p) for p in results]
    desc = str(profile_data.get("description", ""))
    data["description"] = (
        desc.split(", vLLM:")[0] + f", vLLM: physical roofline, engine overheads calibrated on {len(files)} "
        f"of the user's runs ({', '.join(Path(f).name for f in files)})"
    )
    prov = data["provenance"]
    data["provenance"] = {
        **prov,
        "kind": "calibrated",
        "rule": prov["rule"].replace(" from the '", " starting from the '")
        + "; engine overheads fitted by `wispsim profile calibrate` on "
        + ", ".join(files),
        "inputs": {**prov.get("inputs", {}), "calibrated_on": files},
    }
    return data, over, loo
