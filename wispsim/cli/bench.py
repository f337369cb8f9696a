"""``wispsim bench``: ``vllm bench serve`` against a simulated ``vllm serve``.

The flags are vLLM's where vLLM has them, so a planner can paste a benchmark command line: the
server (``--model``, ``--tensor-parallel-size``, ``--dtype``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--enable-prefix-caching``, ``--async-scheduling``,
``--gpu-memory-utilization``), the GPU it runs on (``--gpu``, or a measured ``--profile``), and the
client (``--dataset-name random`` with ``--random-input-len/-output-len/-prefix-len/-range-ratio``,
or ``--dataset-path`` of recorded requests; ``--num-prompts``, ``--request-rate``,
``--burstiness``, ``--max-concurrency``, ``--seed``). It prints the table ``vllm bench serve``
prints and, with ``--save-result``, writes its JSON keys. The work is
:func:`wispsim.runs.bench.run_bench`; defaults are vLLM 0.32's (its docstring).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from wispsim.cli.common import make_console
from wispsim.cli.options import SetOpt

console = make_console()
HELP = (
    "`vllm bench serve` against a simulated `vllm serve`: vLLM's flags, its table, its --save-result "
    "JSON keys, and the mean TTFT by its parts. Defaults are vLLM 0.32's: random dataset 1,024 in / "
    "128 out, 1,000 prompts, rate inf, burstiness 1; --max-num-batched-tokens/--max-num-seqs by GPU "
    "memory (2,048/256 below 70 GiB or on an A100, 8,192/1,024 from 70 GiB, 16,384/1,024 from "
    "160 GiB); prefix caching and async scheduling on."
)


def register(app: typer.Typer) -> None:
    app.command("bench", help=HELP)(bench)


def bench(
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="A shipped architecture, a HF config.json (or its folder), or a hub id of a shipped one.",
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            help="A GPU in wispsim/data/gpus.yaml, or a YAML file of entries in its format (FILE, FILE:KEY).",
        ),
    ] = None,
    tensor_parallel_size: Annotated[
        int, typer.Option("--tensor-parallel-size", "-tp", help="GPUs per replica.")
    ] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="auto (bfloat16), bfloat16 or fp8 weights.")] = "auto",
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="A measured profile (name or file) instead of --model and --gpu."),
    ] = None,
    dataset_name: Annotated[
        str, typer.Option("--dataset-name", help="random (the synthetic dataset), or give --dataset-path.")
    ] = "random",
    dataset_path: Annotated[
        Path | None,
        typer.Option(
            "--dataset-path",
            help="CSV time_s,prompt_tokens,output_tokens (as --arrivals requests: reads); times replayed.",
        ),
    ] = None,
    random_input_len: Annotated[int, typer.Option("--random-input-len")] = 1024,
    random_output_len: Annotated[int, typer.Option("--random-output-len")] = 128,
    random_prefix_len: Annotated[
        int,
        typer.Option(
            "--random-prefix-len", help="Tokens of a prefix every request shares, before its input."
        ),
    ] = 0,
    random_range_ratio: Annotated[float, typer.Option("--random-range-ratio")] = 0.0,
    num_prompts: Annotated[int, typer.Option("--num-prompts")] = 1000,
    request_rate: Annotated[
        str, typer.Option("--request-rate", help="Requests per second, or inf (all at once).")
    ] = "inf",
    burstiness: Annotated[
        float, typer.Option("--burstiness", help="Gamma shape of the gaps (1: Poisson).")
    ] = 1.0,
    max_concurrency: Annotated[int | None, typer.Option("--max-concurrency")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    max_num_seqs: Annotated[
        int | None, typer.Option("--max-num-seqs", help="Default: vLLM's for the GPU's memory.")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None, typer.Option("--max-num-batched-tokens", help="Default: vLLM's for the GPU's memory.")
    ] = None,
    enable_prefix_caching: Annotated[
        bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")
    ] = True,
    async_scheduling: Annotated[bool, typer.Option("--async-scheduling/--no-async-scheduling")] = True,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    save_result: Annotated[
        bool, typer.Option("--save-result", help="Write the JSON vllm bench serve writes.")
    ] = False,
    result_filename: Annotated[Path | None, typer.Option("--result-filename")] = None,
    set_: SetOpt = None,
) -> None:
    from wispsim.provenance import code_commit, command_line, now_iso
    from wispsim.results import check_output_file, writing
    from wispsim.runs.bench import Client, Server, profile_of, run_bench

    if save_result and result_filename is not None:
        check_output_file(result_filename, "--result-filename", (".json",))  # before any work
    prof = profile_of(model, gpu, tensor_parallel_size, dtype, profile)
    client = Client(
        dataset_name,
        dataset_path,
        random_input_len,
        random_output_len,
        random_prefix_len,
        random_range_ratio,
        num_prompts,
        request_rate,
        burstiness,
        max_concurrency,
        seed,
    )
    server = Server(
        max_num_seqs, max_num_batched_tokens, enable_prefix_caching, async_scheduling, gpu_memory_utilization
    )
    with console.status(f"simulating {num_prompts} requests on {prof.name}"):
        result, _ = run_bench(prof, client, server, set_)
    result["model_id"] = model or prof.name
    _print_table(result)
    if save_result:
        path = result_filename or Path(f"wispsim-bench-{prof.name}-{request_rate}qps-{result['date']}.json")
        result["provenance"] = {"command": command_line(), "commit": code_commit(), "written": now_iso()}
        with writing("--result-filename", path):
            path.write_text(json.dumps(result, indent=1, default=float))
        console.print(f"saved {path}")


def _print_table(r: dict[str, Any]) -> None:
    """The block ``vllm bench serve`` prints, and the mean TTFT by its parts."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result (simulated) ", n=50, c="=")]

    def row(label: str, v: Any, fmt: str = "{:<10.2f}") -> None:
        lines.append(f"{label:<40} " + (fmt.format(v) if v is not None else "None"))

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
    for name, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st token)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
    ):
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        short = name.upper()
        row(f"Mean {short} (ms):", r[f"mean_{name}_ms"])
        row(f"Median {short} (ms):", r[f"median_{name}_ms"])
        row(f"P99 {short} (ms):", r[f"p99_{name}_ms"])
    if "ttft_parts_mean_ms" in r:
        lines.append("{s:{c}^{n}}".format(s="Mean TTFT by parts (simulated)", n=50, c="-"))
        for part, label in (
            ("frontend", "API server (front end)"),
            ("step_wait", "Wait for the next step"),
            ("queue", "Queueing (admission, token budget)"),
            ("prefill", "Prefill chunks"),
        ):
            row(f"{label} (ms):", r["ttft_parts_mean_ms"][part])
    lines.append("=" * 50)
    console.print("\n".join(lines), highlight=False, markup=False)
