"""``wispsim trace record|inspect``: record acceptance traces from real models, and inspect them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from wispsim.cli.common import console, progress
from wispsim.cli.options import NON_NEGATIVE, SEED, whole
from wispsim.config.limits import MAX_DRAFT, MAX_TOKENS
from wispsim.errors import ConfigError, WispsimError
from wispsim.provenance import command_line
from wispsim.results import check_output_file, writing

trace_app = typer.Typer(help="Record and inspect per-position acceptance traces.", no_args_is_help=True)


@trace_app.command("record")
def record(
    draft: Annotated[
        str, typer.Option(help="Draft model: an HF folder, a .gguf file, or a model hub id (org/name).")
    ],
    target: Annotated[
        str, typer.Option(help="Target model: an HF folder, a .gguf file, or a model hub id (org/name).")
    ],
    prompts: Annotated[Path, typer.Option(help="Prompts: .jsonl with id, family, prompt (or .txt lines).")],
    out: Annotated[Path, typer.Option(help="Trace to write, e.g. traces/NAME.parquet.")],
    temperature: Annotated[
        float,
        typer.Option(
            help="0 = greedy; > 0 samples the target (--engine hf only: the vllm recorder is greedy only).",
            parser=NON_NEGATIVE,
        ),
    ] = 0.0,
    max_new_tokens: Annotated[
        int, typer.Option(help="Longest response per prompt.", parser=whole(1, MAX_TOKENS))
    ] = 128,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    seed: Annotated[
        int, typer.Option(help="Seed of the sampling and of the realized verdicts.", parser=SEED)
    ] = 0,
    limit: Annotated[int | None, typer.Option(help="Only the first N prompts.", parser=whole(1))] = None,
    notes: Annotated[str, typer.Option(help="Free text stored in the trace metadata.")] = "",
    generate_dtype: Annotated[
        str, typer.Option(help="dtype of the target copy that generates responses: float32 or bfloat16.")
    ] = "float32",
    engine: Annotated[
        str,
        typer.Option(
            help="hf (transformers) or vllm (greedy only: --temperature 0; entropy and logit_std "
            "approximated from the draft's top --top-k logprobs)."
        ),
    ] = "hf",
    top_k: Annotated[
        int,
        typer.Option(
            help="--engine vllm: how many of the draft's top logprobs vLLM returns per position "
            "(-1: the whole vocabulary, every column exact, slow for a large vocabulary).",
            parser=whole(-1, 10_000_000),
        ),
    ] = 20,
    vllm_dtype: Annotated[str, typer.Option(help="--engine vllm: dtype of the vLLM engines.")] = "float32",
) -> None:
    """Record a trace; resumable (finished samples are kept in OUT.parts/). --engine vllm is
    greedy only (--temperature 0)."""
    from wispsim.measure.trace import record_trace, record_trace_vllm

    _check_engine_options(engine, temperature, generate_dtype, top_k, vllm_dtype)
    if device not in ("cpu", "cuda"):
        raise WispsimError(f"--device: got {device!r}; allowed: cpu, cuda")
    check_output_file(out, "--out", (".parquet",))  # before any work
    with writing("--out", out), progress() as prog:
        task = prog.add_task("recording", total=None)
        common: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "limit": limit,
            "notes": notes,
            "command": command_line(),
            "progress": lambda done, total: prog.update(task, completed=done, total=total),
        }
        if engine == "vllm":
            n = record_trace_vllm(draft, target, prompts, out, top_k=top_k, dtype=vllm_dtype, **common)
        else:
            n = record_trace(
                draft,
                target,
                prompts,
                out,
                temperature=temperature,
                device=device,
                generate_dtype=generate_dtype,
                **common,
            )
    console.print(f"{out}: {n} positions")


@trace_app.command("inspect")
def inspect(
    trace: Annotated[str, typer.Argument(help="Trace file or name under traces/.")],
    k: Annotated[
        int,
        typer.Option(help="Verification window for the accepted-length figures.", parser=whole(1, MAX_DRAFT)),
    ] = 5,
    accept_from: Annotated[str, typer.Option(help="Verdicts: flag, greedy or beta.")] = "flag",
    plot: Annotated[Path | None, typer.Option(help="Write the figure here (PNG).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Mean acceptance, per-window-position acceptance, accepted-length histogram, feature
    correlations and acceptance by top-1 probability."""
    from wispsim.measure.trace import format_report, inspect_trace
    from wispsim.model.acceptance import find_trace, load_trace
    from wispsim.plots.figure import FIGURE_SUFFIXES
    from wispsim.plots.trace import plot_report

    if accept_from not in ("flag", "greedy", "beta"):
        raise WispsimError(f"--accept-from: got {accept_from!r}; allowed: flag, greedy, beta")
    if plot is not None:  # checked before any work; a name without a suffix gets .png
        check_output_file(plot, "--plot")
        if plot.suffix and plot.suffix.lower() not in FIGURE_SUFFIXES:
            raise ConfigError("--plot", "", f"{plot}: the name must end in {', '.join(FIGURE_SUFFIXES)}")
    tr = load_trace(str(find_trace(trace)))
    report = inspect_trace(tr, k, accept_from)
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        typer.echo(format_report(report))
    if plot is not None:
        with writing("--plot", plot):
            plot.parent.mkdir(parents=True, exist_ok=True)
            plot_report(report, tr, plot)
        typer.echo(f"figure: {plot}")


def _check_engine_options(
    engine: str, temperature: float, generate_dtype: str, top_k: int, vllm_dtype: str
) -> None:
    """``record``'s engine options fit together: vllm is greedy, each dtype option belongs to one engine."""
    if engine not in ("hf", "vllm"):
        raise WispsimError(f"--engine: got {engine!r}; allowed: hf, vllm")
    if engine == "vllm" and temperature > 0:
        raise WispsimError(
            f"--temperature: the vllm recorder is greedy only (temperature 0), got {temperature}; "
            "use --engine hf to sample"
        )
    if engine == "vllm" and generate_dtype != "float32":
        raise WispsimError(
            "--generate-dtype: --engine hf only (with vllm, --vllm-dtype sets the engines' dtype)"
        )
    if engine == "hf" and (top_k != 20 or vllm_dtype != "float32"):
        raise WispsimError("--top-k and --vllm-dtype: --engine vllm only")
    if engine == "vllm" and top_k != -1 and top_k < 2:
        raise WispsimError(f"--top-k: must be >= 2 (or -1: the whole vocabulary), got {top_k}")
    if vllm_dtype not in ("float32", "bfloat16", "float16"):
        raise WispsimError(f"--vllm-dtype: got {vllm_dtype!r}; allowed: float32, bfloat16, float16")
    if generate_dtype not in ("float32", "bfloat16", "float16"):
        raise WispsimError(f"--generate-dtype: got {generate_dtype!r}; allowed: float32, bfloat16, float16")
