"""``wispsim profile plan|record|fit|derive|archs`` and ``wispsim estimator compare``.

The profiling workflow of SPEC 4: make a plan of batch configurations, time them on real
hardware, fit the estimator's coefficients (a profile YAML with a fit report), or derive a
profile for another model or GPU by scaling; then compare the capacity a scenario gets from the
fitted formula with what replaying the measurements gives. :func:`register` mounts the commands
on the main CLI's ``profile`` group and adds the ``estimator`` group.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from wispsim.errors import ConfigError, WispsimError

console = Console()
err_console = Console(stderr=True)
estimator_app = typer.Typer(
    help="Verification-time estimator: formula vs measurements.", no_args_is_help=True
)


def _command() -> str:
    return " ".join(["wispsim", *sys.argv[1:]])


def _progress(label: str) -> Progress:
    return Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
    )


def plan_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Plan CSV to write.")],
    counts: Annotated[
        str,
        typer.Option(
            help="Train configurations per regime: compute-bound, memory-bound, random compute-bound, "
            "random memory-bound, mixed."
        ),
    ] = "25,48,15,15,20",
    test: Annotated[int, typer.Option(help="Held-out test configurations (spread over the regimes).")] = 50,
    seed: Annotated[int, typer.Option(help="Plan seed (train and test seeds are derived from it).")] = 0,
    scale: Annotated[float, typer.Option(help="Multiply every token count (e.g. 0.25 on a CPU).")] = 1.0,
    max_context: Annotated[
        int | None, typer.Option(help="Longest request (L_total) the hardware holds; longer ones shrink.")
    ] = None,
    max_batch: Annotated[
        int | None, typer.Option(help="Most requests per batch; extra ones are dropped.")
    ] = None,
) -> None:
    """Write the configuration set of SPEC 4 (123 train + 50 test by default) as a CSV."""
    from wispsim.measure.profile.plan import CATEGORIES, PlanOptions, make_plan, plan_frame, write_plan

    try:
        cts = tuple(int(x) for x in counts.split(","))
    except ValueError:
        raise WispsimError(
            f"--counts: expected {len(CATEGORIES)} integers like 25,48,15,15,20, got {counts!r}"
        ) from None
    opts = PlanOptions(cts, test, seed, scale, max_context, max_batch)
    configs = make_plan(opts)
    write_plan(configs, out, opts, _command())
    df = plan_frame(configs)
    t = Table(
        title=f"plan {out} (seeds: train {configs[0].seed if configs else '-'}, test "
        f"{df[df.split == 'test'].seed.iloc[0] if (df.split == 'test').any() else '-'})"
    )
    for c in ("split", "category", "configs", "max batch", "max L_total", "max N_linear", "max N_cached"):
        t.add_column(c, justify="right")
    for (split, cat), g in df.groupby(["split", "category"], sort=False):
        t.add_row(
            str(split),
            str(cat),
            str(len(g)),
            str(g.batch_size.max()),
            str(g.max_l_total.max()),
            str(g.n_linear.max()),
            str(g.n_cached.max()),
        )
    console.print(t)


def record_cmd(
    plan: Annotated[Path, typer.Option(help="Plan CSV from `wispsim profile plan`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Measurement CSV (appended to; resumable).")],
    engine: Annotated[str, typer.Option(help="hf (transformers) or vllm (needs the vllm extra).")] = "hf",
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
    warmup: Annotated[int, typer.Option(help="Untimed warm-up runs per configuration.")] = 10,
    runs: Annotated[int, typer.Option(help="Timed runs per configuration.")] = 3,
    max_cv: Annotated[
        float, typer.Option(help="Coefficient of variation above which runs are repeated.")
    ] = 0.05,
    retries: Annotated[int, typer.Option(help="Repeats of the timed runs when the CV is too high.")] = 1,
    attention: Annotated[
        str, typer.Option(help="hf engine: loop (SDPA per request) or varlen (CUDA flash varlen).")
    ] = "loop",
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's).")] = None,
    limit: Annotated[int | None, typer.Option(help="Time at most this many new configurations.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
) -> None:
    """Time every configuration of a plan (warm-up, timed runs, CV); rows are written as they finish."""
    from wispsim.measure.profile import record_profile

    with _progress("recording") as prog:
        task = prog.add_task("record", total=None)
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
            command=_command(),
            progress=lambda done, total: prog.update(task, completed=done, total=total),
        )
    console.print(f"{out}: {n} configurations (details in {out}.meta.json)")


def fit_cmd(
    data: Annotated[Path, typer.Argument(help="Measurement CSV from `wispsim profile record`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile YAML to write, e.g. profiles/NAME.yaml.")],
    name: Annotated[str | None, typer.Option(help="Profile name (default: the file's stem).")] = None,
    method: Annotated[str, typer.Option(help="auto (OLS, NNLS if a coefficient < 0), ols or nnls.")] = "auto",
    bootstrap: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% intervals.")] = 1000,
    folds: Annotated[int, typer.Option(help="Cross-validation folds on the train set.")] = 5,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap and the folds.")] = 0,
    gpu: Annotated[str | None, typer.Option(help="Hardware name (default: from the recording).")] = None,
    gpu_count: Annotated[int, typer.Option(help="Devices that held the model.")] = 1,
    memory_gib: Annotated[float | None, typer.Option(help="Memory per device (default: recorded).")] = None,
    plots: Annotated[bool, typer.Option(help="Write the actual-vs-predicted and residual plots.")] = True,
) -> None:
    """Fit a, b_compute, b_read, c on the train set; write the profile, NAME.report.md, NAME.fit/."""
    from wispsim.measure.profile import fit_command

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
        command=_command(),
    )
    t = Table(title=f"profile {prof['name']} ({res.method})")
    for c in ("coefficient", "value", "95% CI"):
        t.add_column(c, justify="right")
    for k, v in res.coef.items():
        ci = res.ci95.get(k)
        t.add_row(k, f"{v:.4g}", f"[{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "-")
    console.print(t)
    tr, te = res.train, res.test
    console.print(
        f"R^2 train {tr['r2']:.4f}, test {te.get('r2', float('nan')):.4f}; MAPE train {tr['mape_pct']:.2f}%, "
        f"test {te.get('mape_pct', float('nan')):.2f}%; {res.cv['folds']}-fold CV R^2 {res.cv['r2_mean']:.4f}"
    )
    if res.note:
        console.print(f"note: {res.note}")
    console.print(f"profile: {out}; report: {out.with_name(out.stem + '.report.md')}")


def derive_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile YAML to write.")],
    arch: Annotated[str, typer.Option(help="Target architecture (see `wispsim profile archs`).")],
    source: Annotated[str, typer.Option(help="Profile to scale from.")] = "a100-qwen3-32b",
    gpu: Annotated[
        str | None,
        typer.Option(help="Target GPU: a100-80gb, a100-40gb, h100-80gb, h200, l40s (default: source's)."),
    ] = None,
    count: Annotated[int | None, typer.Option(help="GPUs holding the model (tensor parallel).")] = None,
    c_rule: Annotated[str, typer.Option(help="weights (scale c by weight-read time) or keep.")] = "weights",
    dtype: Annotated[str, typer.Option(help="Weights and KV dtype of the target.")] = "bfloat16",
    name: Annotated[str | None, typer.Option(help="Profile name (default: the file's stem).")] = None,
) -> None:
    """Derive a profile for another model or GPU by the documented scaling rule (docs/profiles.md)."""
    import yaml

    from wispsim.measure.profile.derive import derive_named, render
    from wispsim.model.profiles import parse_profile

    prof = derive_named(source, arch, gpu=gpu, count=count, name=name or out.stem, c_rule=c_rule, dtype=dtype)
    text = render(prof)
    p = parse_profile(yaml.safe_load(text), str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    e = p.estimator
    console.print(
        f"{out}: a={e.a:.4g} b_compute={e.b_compute:.4g} b_read={e.b_read:.4g} c={e.c:.4g}; "
        f"KV cache at 0.9 utilization, 1.5 GiB reserve/GPU: {p.kv_capacity_tokens(0.9, 1.5)} tokens"
    )


def archs_cmd() -> None:
    """List the named architectures with the facts profiles use."""
    from wispsim.measure.profile.archs import available_archs, load_arch

    t = Table(title="architectures (wispsim/data/archs)")
    for c in ("name", "params (B)", "layers", "heads/kv", "head dim", "KV B/token bf16"):
        t.add_column(c, justify="right")
    for n in available_archs():
        a = load_arch(n)
        t.add_row(
            n,
            f"{a.parameters / 1e9:.3f}",
            str(a.layers),
            f"{a.heads}/{a.kv_heads}",
            str(a.head_dim),
            str(a.kv_bytes_per_token(2)),
        )
    console.print(t)


@estimator_app.command("compare")
def estimator_compare(
    scenario: Annotated[Path | None, typer.Argument(help="Scenario YAML (merged over the default).")] = None,
    profile: Annotated[
        str | None, typer.Option(help="A measured profile (default: the scenario's server.profile).")
    ] = None,
    policy: Annotated[str, typer.Option(help="Policy preset.")] = "wisp",
    classes: Annotated[str | None, typer.Option(help="SLO classes, e.g. 4,8.")] = None,
    devices: Annotated[str | None, typer.Option(help="Grid of N to evaluate first.")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per N.")] = 1,
    seed: Annotated[int | None, typer.Option(help="First seed.")] = None,
    epsilon: Annotated[float | None, typer.Option(help="Allowed violation rate.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel simulations.")] = 2,
    backend: Annotated[str, typer.Option(help="Where simulations run: local or ray.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address (--backend ray).")] = None,
    start: Annotated[int, typer.Option(help="First N of the doubling bracket.")] = 8,
    max_devices: Annotated[int, typer.Option(help="Largest N the search tries.")] = 1024,
    measured: Annotated[str, typer.Option(help="measured or measured-nearest.")] = "measured",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a scenario field.")] = None,
) -> None:
    """Capacity per SLO class with the fitted formula (linear) and with replayed measurements."""
    import dataclasses
    import datetime as _dt

    import pandas as pd

    from wispsim.cli.main import parse_classes, parse_devices
    from wispsim.config import parse_set
    from wispsim.model.profiles import load_profile
    from wispsim.sim.inputs import load_scenario
    from wispsim.study.capacity import capacity_sweep, groups_for
    from wispsim.study.runners import make_runner

    if measured not in ("measured", "measured-nearest"):
        raise ConfigError("--measured", "", f"got {measured!r}; allowed: measured, measured-nearest")
    if seeds < 1 or jobs < 1:
        raise ConfigError("--seeds", "", "--seeds and --jobs must be >= 1")
    sc = load_scenario(scenario, parse_set(set_ or [])).with_policy(policy)
    prof_name = profile or sc.server.profile
    prof = load_profile(prof_name)
    if prof.kind != "measured":
        raise ConfigError(
            f"profile '{prof.name}'", "provenance.kind", f"is {prof.kind}; compare needs a measured one"
        )
    cls = parse_classes(classes) or sc.devices.classes
    eps = sc.epsilon if epsilon is None else epsilon
    base = {
        model: sc.replace(
            server=dataclasses.replace(sc.server, profile=prof_name, latency_model=model)
        ).with_devices(sc.devices.count, cls)
        for model in ("linear", measured)
    }
    first = sc.seed if seed is None else seed
    folder = out or Path("results") / f"estimator-compare-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    folder.mkdir(parents=True, exist_ok=True)
    for model, s in base.items():
        (folder / f"scenario-{model}.yaml").write_text(s.to_yaml())
    with make_runner(backend, jobs, folder, "none", address) as runner, _progress("compare") as prog:
        task = prog.add_task("compare", total=None)
        result = capacity_sweep(
            base,
            groups_for(cls, "separate"),
            [first + i for i in range(seeds)],
            eps,
            runner,
            grid=parse_devices(devices),
            start=start,
            max_devices=max_devices,
            progress=lambda d, t: prog.update(task, completed=d, total=t),
        )
    cap = result.capacity.rename(columns={"policy": "latency_model"})
    wide = cap.pivot(index="class", columns="latency_model", values="capacity").reset_index()
    wide["measured/linear"] = wide[measured] / wide["linear"].where(wide["linear"] > 0)
    wide["in_range"] = [
        _coverage(base[measured], c, int(n), first, prof.data_path)
        for c, n in zip(wide["class"], wide[measured], strict=True)
    ]
    cap.to_csv(folder / "capacity.csv", index=False)
    wide.to_csv(folder / "compare.csv", index=False)
    t = Table(title=f"capacity (devices), {policy}, profile {prof.name}: formula vs measurements")
    for c in wide.columns:
        t.add_column(str(c), justify="right")
    for _, row in wide.iterrows():
        t.add_row(*(f"{v:.3f}" if isinstance(v, float) and not pd.isna(v) else str(v) for v in row))
    console.print(t)
    console.print(
        "in_range: share of the batches simulated at the measured capacity whose N_linear, "
        "N_interactions and N_cached all lie inside the measured range (outside it, replay "
        "follows the fitted formula from the nearest measurement)."
    )
    console.print(f"compare.csv, capacity.csv: {folder}")


def _coverage(sc: Any, cls: float, n: int, seed: int, data: Path | None) -> float:
    """Share of verify batches inside the measured range, in one run at ``n`` devices."""
    from wispsim.model.measured import load_table
    from wispsim.sim.engine import simulate

    if n <= 0 or data is None:
        return float("nan")
    res = simulate(sc.with_devices(n, (float(cls),)), seed=seed)
    b = res.batches
    b = b[b.kind == "verify"] if "kind" in b else b
    if b.empty:
        return float("nan")
    inside = load_table(data).inside(b[["n_linear", "n_interactions", "n_cached"]].to_numpy())
    return float(inside.mean())


def register(profile_app: typer.Typer, app: typer.Typer) -> None:
    """Mount ``profile plan|record|fit|derive|archs`` on ``profile_app`` and ``estimator`` on ``app``."""
    profile_app.command("plan")(plan_cmd)
    profile_app.command("record")(record_cmd)
    profile_app.command("fit")(fit_cmd)
    profile_app.command("derive")(derive_cmd)
    profile_app.command("archs")(archs_cmd)
    app.add_typer(estimator_app, name="estimator")
