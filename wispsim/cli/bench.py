"""``wispsim bench``: ``vllm bench serve`` against a simulated ``vllm serve``.

The flags are vLLM's where vLLM has them, so a planner can paste a benchmark command line: the
server (``--model``, ``--tensor-parallel-size``, ``--dtype``, ``--max-num-seqs``,
``--max-num-batched-tokens``, ``--enable-prefix-caching``, ``--async-scheduling``, V0's
``--enable-chunked-prefill`` and ``--num-scheduler-steps``,
``--gpu-memory-utilization``), the GPU it runs on (``--gpu``, or a measured ``--profile``), and the
client (``--dataset-name random`` with ``--random-input-len/-output-len/-prefix-len/-range-ratio``,
or ``--dataset-path`` of recorded requests; ``--num-prompts``, ``--request-rate``,
``--burstiness``, ``--max-concurrency``, ``--seed``). Every other ``vllm bench serve`` flag is
read by :mod:`wispsim.runs.bench_flags` (honoured, accepted as a client-side no-op, or refused by
name). It prints the table ``vllm bench serve`` prints and, with ``--save-result``, writes its JSON
keys; ``--compare REAL.json`` re-creates a real run from its result file and prints simulated
beside real. The work is :func:`wispsim.runs.bench.run_bench`; defaults are vLLM 0.32's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

from wispsim.cli.common import make_console
from wispsim.cli.options import SetOpt
from wispsim.errors import ConfigError
from wispsim.runs.bench_flags import EPILOG, Extras, extras_of

console = make_console()
HELP = (
    "`vllm bench serve` against a simulated `vllm serve`: vLLM's flags, its table, its --save-result "
    "JSON keys, and the mean TTFT by its parts. Defaults are vLLM 0.32's: random dataset 1,024 in / "
    "128 out, 1,000 prompts, rate inf, burstiness 1; --max-num-batched-tokens/--max-num-seqs by GPU "
    "memory (2,048/256 below 70 GiB or on an A100, 8,192/1,024 from 70 GiB, 16,384/1,024 from "
    "160 GiB); prefix caching, chunked prefill and async scheduling on (vLLM V1; "
    "--num-scheduler-steps > 1 or --set server.engine.use_v1=false runs V0, without the last two)."
)


class PlainHelp(typer.core.TyperCommand):
    """Click's plain help: wrapped to the terminal, nothing cut (rich's option table cuts flag
    names and help at 80 columns). A bare ``--profile`` (vLLM's server-profiling switch, no value)
    is taken out before parsing; ``--profile NAME`` stays wispsim's measured profile."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.rich_markup_mode = None

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        kept = [
            a
            for i, a in enumerate(args)
            if not (a == "--profile" and (i + 1 == len(args) or args[i + 1].startswith("-")))
        ]
        return super().parse_args(ctx, kept)


def _context_of(model: str | None, quantization: str | None) -> int | None:
    """vLLM's default ``max_model_len``: the model's ``max_position_embeddings`` (None: a measured
    --profile, or a config that does not say)."""
    if model is None:
        return None
    from wispsim.runs.bench_profile import arch_of

    n = arch_of(model, quantization).hf.get("max_position_embeddings")
    return int(n) if isinstance(n, int | float) and n >= 1 else None


def _true_or_false(value: str, flag: str) -> bool:
    """vLLM's boolean flag value (``--flag True``), else a one-line error naming the flag."""
    v = value.strip().lower()
    if v not in ("true", "false", "1", "0"):
        raise ConfigError(flag, flag.lstrip("-").replace("-", "_"), f"got {value!r}; allowed: True, False")
    return v in ("true", "1")


def register(app: typer.Typer) -> None:
    app.command(
        "bench",
        help=HELP,
        epilog=EPILOG,
        cls=PlainHelp,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )(bench)


def bench(
    ctx: typer.Context,
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
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            help="auto, bfloat16 (half, float16: priced alike, the same bytes and tensor-core rate) or "
            "fp8 (as --quantization fp8).",
        ),
    ] = "auto",
    quantization: Annotated[
        str | None,
        typer.Option(
            "--quantization",
            "-q",
            help="vLLM's: fp8 quantizes an unquantized checkpoint at load (W8A8 on fp8 tensor cores, "
            "FP8 Marlin below Ada); a quantized checkpoint's own method is a no-op.",
        ),
    ] = None,
    kv_cache_dtype: Annotated[
        str, typer.Option("--kv-cache-dtype", help="auto (bfloat16), fp8, fp8_e4m3 or fp8_e5m2.")
    ] = "auto",
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="A measured profile (name or file) instead of --model and --gpu. Bare (no value), "
            "it is vLLM's server-profiling switch: accepted and ignored.",
        ),
    ] = None,
    dataset_name: Annotated[
        str,
        typer.Option(
            "--dataset-name",
            help="random, prefix_repetition, or from --dataset-path: sharegpt (JSON), custom (JSONL), "
            "burstgpt (CSV); sharegpt and custom count tokens with --tokenizer FOLDER (or --model FOLDER).",
        ),
    ] = "random",
    dataset_path: Annotated[
        Path | None,
        typer.Option(
            "--dataset-path",
            help="The dataset's file; with --dataset-name random, a CSV time_s,prompt_tokens,output_tokens "
            "(as --arrivals requests: reads) whose times are replayed (--no-self-timed: sent at "
            "--request-rate).",
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
        int | None, typer.Option("--max-num-seqs", help="Default: vLLM's (V1: by the GPU's memory; V0: 256).")
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-num-batched-tokens",
            help="Default: vLLM's (V1: by the GPU's memory; V0: 2,048; prompts taken whole: "
            "max(max_model_len, 2048)).",
        ),
    ] = None,
    enable_prefix_caching: Annotated[
        bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")
    ] = True,
    async_scheduling: Annotated[
        bool | None,
        typer.Option("--async-scheduling/--no-async-scheduling", help="Default: on (V1), off (V0)."),
    ] = None,
    enable_chunked_prefill: Annotated[
        bool | None,
        typer.Option(
            "--enable-chunked-prefill/--no-enable-chunked-prefill",
            help="Default: on (V1), off (V0). Off, prompts are prefilled whole (V0: in prefill-only steps).",
        ),
    ] = None,
    num_scheduler_steps: Annotated[
        int,
        typer.Option(
            "--num-scheduler-steps",
            help="vLLM V0's multi-step scheduling: decode steps per scheduling (> 1 runs V0; "
            "--set server.engine.use_v1=false runs V0 without it).",
        ),
    ] = 1,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            "--max-model-len",
            help="The longest request (prompt + output) the server takes. Default: the model's "
            "max_position_embeddings; without chunked prefill, max_num_batched_tokens' default too.",
        ),
    ] = None,
    multi_step_stream_outputs: Annotated[
        str,
        typer.Option(
            "--multi-step-stream-outputs",
            help="True (vLLM's default): a multi-step run streams step by step; False: at its end "
            "(as vLLM 0.6.0 did).",
        ),
    ] = "True",
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    save_result: Annotated[
        bool, typer.Option("--save-result", help="Write the JSON vllm bench serve writes.")
    ] = False,
    result_filename: Annotated[
        Path | None,
        typer.Option("--result-filename", help="Default: vLLM's name (label, rate, model, date)."),
    ] = None,
    compare: Annotated[
        Path | None,
        typer.Option(
            "--compare",
            help="A real run's result JSON (vllm bench serve with --save-result): its workload "
            "(prompts, lengths, start times, rate, burstiness, concurrency) is re-created on the server "
            "these flags describe, and the figures are printed simulated beside real. Workload "
            "flags are refused beside it but --random-prefix-len, which the file does not record.",
        ),
    ] = None,
    set_: SetOpt = None,
) -> None:
    from wispsim.provenance import code_commit, command_line, now_iso
    from wispsim.results import check_output_file, writing
    from wispsim.runs.bench import Client, Server, run_bench
    from wispsim.runs.bench_compare import (
        WORKLOAD_FLAGS,
        real_run,
        same_model,
        vllm_file_name,
        workload_extras,
    )
    from wispsim.runs.bench_profile import profile_of

    ex = extras_of(list(ctx.args))
    if ex.ramp_up is not None and request_rate.strip().lower() != "inf":
        raise ConfigError(
            "--request-rate", "request_rate", "give --request-rate or --ramp-up-strategy, not both"
        )
    if seed < 0:
        raise ConfigError("--seed", "seed", f"got {seed}; allowed: an integer >= 0")
    real = real_run(compare) if compare is not None else None
    if real is not None:  # the file gives the workload: a flag that sets it too is a contradiction
        given = [
            n for n in WORKLOAD_FLAGS if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"
        ]
        given += [f for f, v in workload_extras(ex) if v]
        if given:
            flag = given[0] if given[0].startswith("--") else "--" + given[0].replace("_", "-")
            raise ConfigError(
                flag, "compare", f"--compare takes the workload from {compare}; give one or the other"
            )
    prof = profile_of(
        model, gpu, tensor_parallel_size, dtype, profile, gpu_memory_utilization, quantization, kv_cache_dtype
    )
    tokenizer = ex.tokenizer or (model if model and Path(model).is_dir() else None)
    client = Client(
        dataset_name,
        dataset_path,
        ex.input_len or random_input_len,
        ex.output_len or random_output_len,
        random_prefix_len,
        random_range_ratio,
        num_prompts,
        request_rate,
        burstiness,
        max_concurrency,
        seed,
        tokenizer,
        ex.sharegpt_output_len if dataset_name == "sharegpt" else ex.custom_output_len,
        ex.prefix_repetition,
        not ex.disable_shuffle,
        ex.no_oversample,
        ex.self_timed,
        ex.ramp_up,
        chat_template=ex.chat_template,
    )
    notes: list[str] = []
    if real is not None:
        client, notes = real.client(client)
        served = real.data.get("model_id")
        if model is not None and isinstance(served, str) and not same_model(served, model):
            notes.append(f"the real run served {served}; this simulates {model}")
    label = ex.label or ex.backend
    path = None
    if save_result or ex.append_result:  # the file is named and checked before any work
        # a config.json named by its path: the file is named after its folder, as the model is
        named = str(Path(model).resolve().parent) if model and model.endswith(".json") else model
        name = result_filename or Path(vllm_file_name(label, client, named or prof.name))
        path = (ex.result_dir / name) if ex.result_dir is not None else name
        check_output_file(str(path).replace("{date}", "0"), "--result-filename", (".json",))
    server = Server(
        max_num_seqs,
        max_num_batched_tokens,
        enable_prefix_caching,
        async_scheduling,
        gpu_memory_utilization,
        ex.endpoint,
        enable_chunked_prefill,
        num_scheduler_steps,
        _true_or_false(multi_step_stream_outputs, "--multi-step-stream-outputs"),
        max_model_len if max_model_len is not None else _context_of(model, quantization),
        ex.attention_backend,
    )
    with console.status(f"simulating {client.num_prompts} requests on {prof.name}"):
        result, _ = run_bench(prof, client, server, set_, ex.reporting)
    date = str(result["date"])
    setup = {
        "date": date,
        "endpoint_type": ex.backend,
        "backend": ex.backend,
        "label": label,
        "model_id": model or prof.name,
        "tokenizer_id": tokenizer or model or prof.name,
        "num_prompts": result["num_prompts"],
    }
    # vLLM's order: the setup, then --metadata (which may restate a setup key), then the traffic
    # and the benchmark's results, which metadata cannot overwrite
    result = {**setup, **ex.metadata, **{k: v for k, v in result.items() if k not in setup}}
    if ex.ignored:
        result["ignored_client_flags"] = list(ex.ignored)
    _print_table(result, ex)
    srv = result["server"]
    if not srv["vllm_use_v1"]:  # the engine loop is V0's: say how it ran (docs/model.md)
        steps = srv["num_scheduler_steps"]
        console.print(
            f"engine: vLLM V0, chunked prefill {'on' if srv['enable_chunked_prefill'] else 'off'}, "
            + (f"{steps} scheduler steps a run, streamed "
               + ("step by step" if srv["multi_step_stream_outputs"] else "at each run's end")
               if steps > 1 else "single-step")
            + "; its per-step CPU is priced as V1's engine core (docs/model.md, vLLM V0's engine loop)",
            highlight=False,
            markup=False,
        )  # fmt: skip
    if gpu is not None:
        from wispsim.model.archs import load_gpu
        from wispsim.model.physical import generation_efficiency

        card = load_gpu(gpu)
        gen = card.generation
        basis = str(generation_efficiency(gen)["basis"])
        result["kernel_basis"] = f"{gen}: {basis}"
        if basis.startswith("inherited"):
            cap = (
                f", no GEMM above its max-achievable {card.bf16_maf_tflops:g} of "
                f"{card.bf16_tflops:g} bf16 TFLOPs"
                if card.bf16_maf_tflops
                else ""
            )
            console.print(
                f"note: no kernel measurements of {gen} GPUs here; {gpu} is priced with its own "
                f"datasheet peaks at {basis.split(' (')[0].removeprefix('inherited from ')}'s kernel "
                f"efficiencies (wispsim/data/efficiency.yaml){cap}: expect larger errors "
                "(experiments/REPORT.md, held-out public runs)",
                highlight=False,
                markup=False,
            )
    if real is not None:
        for note in notes:
            console.print(f"note: {note}", highlight=False, markup=False)
        console.print(real.side_by_side(result), highlight=False, markup=False)
    if path is not None:
        path = Path(str(path).replace("{date}", date))
        result["provenance"] = {"command": command_line(), "commit": code_commit(), "written": now_iso()}
        if not ex.reporting.detailed:  # vLLM drops the per-request lists
            for k in (
                "input_lens",
                "output_lens",
                "start_times",
                "ttfts",
                "itls",
                "generated_texts",
                "errors",
            ):
                result.pop(k, None)
        with writing("--result-filename", path):
            path.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(result, default=float)
            if ex.append_result and path.is_file() and path.stat().st_size:
                text = "\n" + text
            with path.open("a" if ex.append_result else "w", encoding="utf-8") as f:
                f.write(text)
        console.print(f"saved {path}")


def _print_table(r: dict[str, Any], ex: Extras) -> None:
    """The block ``vllm bench serve`` prints, and the mean TTFT by its parts."""
    from wispsim.study.bench_metrics import TITLES

    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result (simulated) ", n=50, c="=")]

    def row(label: str, v: Any, fmt: str = "{:<10.2f}") -> None:
        lines.append(f"{label:<40} " + (fmt.format(v) if v is not None else "None"))

    row("Successful requests:", r["completed"], "{:<10}")
    row("Failed requests:", r["failed"], "{:<10}")
    if r.get("max_concurrency") is not None:
        row("Maximum request concurrency:", r["max_concurrency"], "{:<10}")
    if r.get("request_rate") not in (None, "inf"):
        row("Request rate configured (RPS):", r["request_rate"])
    row("Benchmark duration (s):", r["duration"])
    row("Total input tokens:", r["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", r["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", r["request_throughput"])
    if r.get("request_goodput") is not None:
        row("Request goodput (req/s):", r["request_goodput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"])
    row("Peak concurrent requests:", r["max_concurrent_requests"])
    row("Total token throughput (tok/s):", r["total_token_throughput"])
    for name in ex.reporting.percentile_metrics:
        short, title = TITLES[name]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        row(f"Mean {short} (ms):", r[f"mean_{name}_ms"])
        row(f"Median {short} (ms):", r[f"median_{name}_ms"])
        for p in ex.reporting.percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            row(f"P{word} {short} (ms):", r[f"p{word}_{name}_ms"])
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
