"""The ``wispsim`` command line (typer + rich).

Commands: ``run`` (one simulation), ``sweep`` (capacity search for one policy), ``compare``
(capacity of several policies side by side), ``scenario show|validate``, ``profile show|list``.
Every command that writes results puts them in one folder with the resolved scenario, so each
number can be traced back to the config and seed that produced it. Bad input is reported in one
line with exit code 2.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from wispsim import __version__
from wispsim.cli_predictor import predictor_app
from wispsim.cli_profile import register as register_profile_commands
from wispsim.cli_trace import trace_app
from wispsim.config import POLICY_NAMES, Scenario, load_scenario, parse_set
from wispsim.errors import ConfigError, WispsimError

app = typer.Typer(
    name="wispsim",
    help="Capacity planning for distributed speculative LLM serving at the edge.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
scenario_app = typer.Typer(help="Show or check a scenario.", no_args_is_help=True)
profile_app = typer.Typer(
    help="Show, plan, record, fit and derive verification-latency profiles.", no_args_is_help=True
)
app.add_typer(scenario_app, name="scenario")
app.add_typer(profile_app, name="profile")
register_profile_commands(profile_app, app)
app.add_typer(trace_app, name="trace")
app.add_typer(predictor_app, name="predictor")

console = Console()
err_console = Console(stderr=True)

ScenarioArg = Annotated[
    Path | None, typer.Argument(help="Scenario YAML (merged over the default scenario).", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a scenario field, e.g. --set server.delta_ms=3 (repeatable)."),
]
OutOpt = Annotated[
    Path | None, typer.Option("--out", "-o", help="Output folder (default: a new folder under results/).")
]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", help="Parallel simulations (local processes).")]


# ------------------------------------------------------------------------------------------
# option parsing
# ------------------------------------------------------------------------------------------


def parse_classes(text: str | None, option: str = "--classes") -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(
            option, "", f"expected comma-separated token speeds like 2,4,6,8, got {text!r}"
        ) from None
    if not vals or any(v <= 0 for v in vals):
        raise ConfigError(option, "", f"token speeds must be > 0, got {text!r}")
    return vals


def parse_devices(text: str | None) -> tuple[int, ...]:
    """``10:200:10`` (inclusive range) or ``10,20,50``."""
    if not text:
        return ()
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) == 2:
                parts.append(1)
            lo, hi, step = parts
            if lo < 1 or hi < lo or step < 1:
                raise ValueError
            return tuple(range(lo, hi + 1, step))
        vals = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
        if not vals or vals[0] < 1:
            raise ValueError
        return vals
    except ValueError:
        raise ConfigError(
            "--devices", "", f"expected LO:HI:STEP or a list like 10,20,50 with values >= 1, got {text!r}"
        ) from None


def parse_policies(text: str) -> list[str]:
    pols = [p.strip() for p in text.split(",") if p.strip()]
    for p in pols:
        if p not in POLICY_NAMES:
            raise ConfigError("--policies", "", f"unknown policy {p!r}; allowed: {', '.join(POLICY_NAMES)}")
    if not pols:
        raise ConfigError("--policies", "", "needs at least one policy")
    return pols


def _load(scenario: Path | None, sets: list[str] | None) -> Scenario:
    return load_scenario(scenario, parse_set(sets or []))


def _out_dir(out: Path | None, command: str) -> Path:
    if out is None:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("results") / f"{command}-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _manifest(out: Path, command: str, extra: dict[str, Any]) -> None:
    info = {
        "command": " ".join(["wispsim", *sys.argv[1:]]) if sys.argv else command,
        "wispsim_version": __version__,
        "python": platform.python_version(),
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        **extra,
    }
    (out / "manifest.json").write_text(json.dumps(info, indent=1, default=str))


def _fmt(v: Any) -> str:
    if isinstance(v, float | np.floating):
        x = float(v)
        if x != x:
            return "-"
        return f"{x:.3f}" if abs(x) < 100 else f"{x:.0f}"
    return str(v)


def _table(df: pd.DataFrame, title: str, columns: list[str] | None = None) -> Table:
    t = Table(title=title, show_lines=False)
    cols = columns or list(df.columns)
    for c in cols:
        t.add_column(c, justify="right")
    for row in df[cols].itertuples(index=False):  # itertuples keeps each column's type
        t.add_row(*(_fmt(v) for v in row))
    return t


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )


# ------------------------------------------------------------------------------------------
# commands
# ------------------------------------------------------------------------------------------


@app.command()
def run(
    scenario: ScenarioArg = None,
    policy: Annotated[str | None, typer.Option(help=f"Policy preset: {', '.join(POLICY_NAMES)}.")] = None,
    devices: Annotated[int | None, typer.Option(help="Number of devices N.")] = None,
    classes: Annotated[str | None, typer.Option(help="SLO classes in tokens/s, e.g. 2,4,6,8.")] = None,
    seed: Annotated[int | None, typer.Option(help="Run seed.")] = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run one simulation and write its records (Parquet) and per-class summary."""
    from wispsim.metrics import summarize
    from wispsim.simulation import simulate

    sc = _load(scenario, set_)
    if policy is not None:
        sc = sc.with_policy(policy)
    if devices is not None and devices < 1:
        raise ConfigError("--devices", "", f"must be >= 1, got {devices}")
    sc = sc.with_devices(devices or sc.devices.count, parse_classes(classes))
    if seed is not None:
        if seed < 0:
            raise ConfigError("--seed", "", f"must be >= 0, got {seed}")
        sc = sc.replace(seed=seed)
    folder = _out_dir(out, "run")
    with err_console.status(f"simulating {sc.devices.count} devices under {sc.policy} ..."):
        res = simulate(sc)
    summary = summarize(res)
    (folder / "scenario.yaml").write_text(sc.to_yaml())
    res.rounds.to_parquet(folder / "rounds.parquet", index=False)
    res.batches.to_parquet(folder / "batches.parquet", index=False)
    res.responses.to_parquet(folder / "responses.parquet", index=False)
    summary.to_csv(folder / "summary.csv", index=False)
    _manifest(
        folder,
        "run",
        {
            "seed": sc.seed,
            "devices": sc.devices.count,
            "policy": sc.policy,
            "sim_end_s": res.sim_end,
            "wall_s": res.wall_s,
            **res.info,
        },
    )
    cols = [
        "class",
        "devices",
        "responses",
        "violation_rate",
        "speed_p50",
        "budget_miss_rate",
        "goodput_tps",
        "acceptance_ratio",
        "queue_p95_ms",
        "verify_p95_ms",
        "gpu_utilization",
        "mean_batch_size",
    ]
    console.print(_table(summary, f"{sc.policy}, N={sc.devices.count}, seed={sc.seed}", cols))
    console.print(f"records and summary: {folder}  ({res.wall_s:.1f} s wall, {len(res.rounds)} rounds)")
    if not res.responses.measured.any():
        err_console.print(
            "[yellow]warning:[/yellow] no response started inside the measurement window "
            f"[{res.window[0]:g}, {res.window[1]:g}) s, so the violation rate is undefined; "
            "lengthen workload.duration_s"
        )


def _sweep_common(
    scenario: Path | None,
    sets: list[str] | None,
    policies: list[str],
    classes: str | None,
    devices: str | None,
    seeds: int,
    seed: int | None,
    epsilon: float | None,
    jobs: int,
    out: Path | None,
    mix: str,
    start: int,
    max_devices: int,
    records: str,
    command: str,
) -> tuple[Path, Any]:
    from wispsim.sweep import RECORD_MODES, LocalRunner, capacity_sweep, groups_for

    sc = _load(scenario, sets)
    cls = parse_classes(classes) or sc.devices.classes
    grid = parse_devices(devices)
    if seeds < 1:
        raise ConfigError("--seeds", "", f"must be >= 1, got {seeds}")
    if jobs < 1:
        raise ConfigError("--jobs", "", f"must be >= 1, got {jobs}")
    if mix not in ("separate", "shared"):
        raise ConfigError("--mix", "", f"got {mix!r}; allowed: separate, shared")
    if records not in RECORD_MODES:
        raise ConfigError("--records", "", f"got {records!r}; allowed: {', '.join(RECORD_MODES)}")
    if start < 1 or max_devices < start:
        raise ConfigError("--max-devices", "", "needs 1 <= --start <= --max-devices")
    eps = sc.epsilon if epsilon is None else epsilon
    if not 0 <= eps < 1:
        raise ConfigError("--epsilon", "", f"must be in [0, 1), got {eps}")
    base_seed = sc.seed if seed is None else seed
    seed_list = [base_seed + i for i in range(seeds)]
    base = {p: sc.with_policy(p).with_devices(sc.devices.count, cls) for p in policies}
    folder = _out_dir(out, command)
    for p, s in base.items():
        (folder / (f"scenario-{p}.yaml" if len(base) > 1 else "scenario.yaml")).write_text(s.to_yaml())
    groups = groups_for(cls, mix)
    with _progress() as prog, LocalRunner(jobs, folder, records) as runner:
        task = prog.add_task(f"{command} {','.join(policies)}", total=None)
        result = capacity_sweep(
            base,
            groups,
            seed_list,
            eps,
            runner,
            grid=grid,
            start=start,
            max_devices=max_devices,
            progress=lambda done, total: prog.update(task, completed=done, total=total),
        )
    result.capacity.to_csv(folder / "capacity.csv", index=False)
    result.curve.to_csv(folder / "curve.csv", index=False)
    result.pooled.to_csv(folder / "curve_pooled.csv", index=False)
    _manifest(
        folder,
        command,
        {
            "policies": policies,
            "classes": list(cls),
            "mix": mix,
            "seeds": seed_list,
            "epsilon": eps,
            "grid": list(grid),
            "start": start,
            "max_devices": max_devices,
            "jobs": jobs,
        },
    )
    return folder, result


@app.command()
def sweep(
    scenario: ScenarioArg = None,
    policy: Annotated[str, typer.Option(help=f"Policy preset: {', '.join(POLICY_NAMES)}.")] = "wisp",
    classes: Annotated[
        str | None, typer.Option(help="SLO classes, e.g. 2,4,6,8 (default: the scenario's).")
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(help="Grid of N to evaluate first, LO:HI:STEP or a list; bisection refines it."),
    ] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per N (common random numbers across N).")] = 3,
    seed: Annotated[int | None, typer.Option(help="First seed (default: the scenario's).")] = None,
    epsilon: Annotated[
        float | None, typer.Option(help="Allowed violation rate (default: the scenario's, 0.05).")
    ] = None,
    jobs: JobsOpt = 2,
    out: OutOpt = None,
    mix: Annotated[
        str, typer.Option(help="separate: each class alone; shared: all classes on one server.")
    ] = "separate",
    start: Annotated[int, typer.Option(help="First N of the doubling bracket.")] = 8,
    max_devices: Annotated[int, typer.Option(help="Largest N the search tries.")] = 4096,
    records: Annotated[str, typer.Option(help="Records kept per point: none, responses, all.")] = "responses",
    set_: SetOpt = None,
) -> None:
    """Capacity per SLO class for one policy: the largest N with violation rate <= epsilon."""
    folder, result = _sweep_common(
        scenario,
        set_,
        parse_policies(policy),
        classes,
        devices,
        seeds,
        seed,
        epsilon,
        jobs,
        out,
        mix,
        start,
        max_devices,
        records,
        "sweep",
    )
    console.print(
        _table(
            result.capacity,
            f"capacity ({policy})",
            ["policy", "class", "capacity", "ci_low", "ci_high", "evaluated"],
        )
    )
    console.print(f"capacity.csv, curve.csv and points/: {folder}")


def speedups(cap: pd.DataFrame, policies: list[str]) -> pd.DataFrame:
    """Wide table: class, capacity per policy, and ratios of the first policy to the others."""
    wide = cap.pivot(index="class", columns="policy", values="capacity").reindex(columns=policies)
    wide = wide.reset_index()
    first = policies[0]
    for p in policies[1:]:
        wide[f"{first}/{p}"] = wide[first] / wide[p].where(wide[p] > 0)
    return wide


@app.command()
def compare(
    scenario: ScenarioArg = None,
    policies: Annotated[str, typer.Option(help="Comma-separated policy presets.")] = "wisp,centralized,sled",
    classes: Annotated[str | None, typer.Option(help="SLO classes, e.g. 2,4,6,8.")] = None,
    devices: Annotated[str | None, typer.Option(help="Grid of N to evaluate first.")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per N.")] = 3,
    seed: Annotated[int | None, typer.Option(help="First seed.")] = None,
    epsilon: Annotated[float | None, typer.Option(help="Allowed violation rate.")] = None,
    jobs: JobsOpt = 2,
    out: OutOpt = None,
    mix: Annotated[str, typer.Option(help="separate or shared.")] = "separate",
    start: Annotated[int, typer.Option(help="First N of the doubling bracket.")] = 8,
    max_devices: Annotated[int, typer.Option(help="Largest N the search tries.")] = 4096,
    records: Annotated[str, typer.Option(help="Records kept per point: none, responses, all.")] = "responses",
    set_: SetOpt = None,
) -> None:
    """Capacity of several policies side by side, with speedup ratios."""
    pols = parse_policies(policies)
    folder, result = _sweep_common(
        scenario,
        set_,
        pols,
        classes,
        devices,
        seeds,
        seed,
        epsilon,
        jobs,
        out,
        mix,
        start,
        max_devices,
        records,
        "compare",
    )
    wide = speedups(result.capacity, pols)
    wide.to_csv(folder / "compare.csv", index=False)
    console.print(_table(wide, "capacity (devices) by policy"))
    console.print(f"compare.csv, capacity.csv, curve.csv: {folder}")


ablate_app = typer.Typer(help="Ablation studies.", no_args_is_help=True)
app.add_typer(ablate_app, name="ablate")


@ablate_app.command("predictor")
def ablate_predictor_cmd(
    scenario: ScenarioArg = None,
    devices: Annotated[str, typer.Option(help="N values, e.g. 2,4,8,16.")] = "2,4,8,16",
    classes: Annotated[str | None, typer.Option(help="SLO classes of the devices.")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per N (the same for both arms).")] = 3,
    seed: Annotated[int | None, typer.Option(help="First seed.")] = None,
    jobs: JobsOpt = 2,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Predictor on (wisp) vs off (wisp-fixed): acceptance ratio, wasted drafting, goodput."""
    from wispsim.ablation import ablate_predictor, write
    from wispsim.sweep import LocalRunner

    sc = _load(scenario, set_)
    sc = sc.with_devices(sc.devices.count, parse_classes(classes))
    ns = list(parse_devices(devices))
    if seeds < 1:
        raise ConfigError("--seeds", "", f"must be >= 1, got {seeds}")
    first = sc.seed if seed is None else seed
    folder = _out_dir(out, "ablate")
    (folder / "scenario.yaml").write_text(sc.to_yaml())
    with _progress() as prog, LocalRunner(jobs, folder, "responses") as runner:
        task = prog.add_task("ablate predictor", total=None)
        per_seed, table = ablate_predictor(
            sc,
            ns,
            [first + i for i in range(seeds)],
            runner,
            progress=lambda d, t: prog.update(task, completed=d, total=t),
        )
    write(per_seed, table, folder)
    _manifest(
        folder,
        "ablate predictor",
        {
            "devices": ns,
            "seeds": seeds,
            "first_seed": first,
            "acceptance": sc.acceptance.model,
            "trace": sc.acceptance.trace,
            "predictor": sc.drafting.predictor.name,
        },
    )
    cols = [
        "devices",
        "acceptance_ratio_off",
        "acceptance_ratio_on",
        "wasted_tokens_off",
        "wasted_tokens_on",
        "wdt_ms_off",
        "wdt_ms_on",
        "goodput_tps_off",
        "goodput_tps_on",
        "goodput_gain",
    ]
    console.print(_table(table, f"predictor ablation ({sc.acceptance.model} acceptance)", cols))
    console.print(f"ablation.csv, ablation_per_seed.csv, points/: {folder}")


@scenario_app.command("show")
def scenario_show(scenario: ScenarioArg = None, set_: SetOpt = None) -> None:
    """Print the resolved scenario (defaults filled in, policy preset applied)."""
    sc = _load(scenario, set_)
    typer.echo(sc.to_yaml(), nl=False)


@scenario_app.command("validate")
def scenario_validate(scenario: ScenarioArg = None, set_: SetOpt = None) -> None:
    """Check a scenario and its profile; exit 2 with a one-line error if something is wrong."""
    from wispsim.acceptance import make_acceptance
    from wispsim.profiles import load_profile

    sc = _load(scenario, set_)
    prof = load_profile(sc.server.profile)
    make_acceptance(sc.acceptance)
    srv = sc.server
    cap = prof.kv_capacity_tokens(srv.gpu_memory_utilization, srv.activation_reserve_gib)
    typer.echo(
        f"ok: {scenario or 'default scenario'} (policy {sc.policy}, profile {prof.name}, "
        f"KV cache {cap} tokens)"
    )


@profile_app.command("show")
def profile_show(
    name: Annotated[str, typer.Argument(help="Profile name or path.")] = "a100-qwen3-32b",
) -> None:
    """Print a profile's coefficients, memory facts and provenance."""
    from wispsim.profiles import load_profile

    p = load_profile(name)
    t = Table(title=f"profile {p.name} ({p.provenance.get('kind')})")
    t.add_column("coefficient")
    t.add_column("value", justify="right")
    t.add_column("95% CI", justify="right")
    for k in ("a", "b_compute", "b_read", "c"):
        ci = p.ci95.get(k)
        t.add_row(k, f"{getattr(p.estimator, k):.4g}", f"[{ci[0]:.3g}, {ci[1]:.3g}]" if ci else "-")
    console.print(t)
    m = p.model
    console.print(
        f"hardware: {p.gpu_count}x {p.gpu} ({p.gpu_memory_gib:g} GiB), engine {p.engine}, {p.precision}\n"
        f"model: {m.name}, {m.parameters / 1e9:.1f}B params, KV {m.kv_bytes_per_token} bytes/token, "
        f"weights {m.weight_bytes / 1e9:.1f} GB\n"
        f"KV cache at 0.9 utilization, 1.5 GiB reserve: {p.kv_capacity_tokens(0.9, 1.5)} tokens\n"
        f"noise sigma: {p.noise_sigma:g}\nprovenance: {p.provenance.get('kind')}: "
        f"{_provenance_line(p.provenance)}"
    )


def _provenance_line(prov: dict[str, Any]) -> str:
    text = prov.get("citation") or prov.get("rule") or prov.get("data") or ""
    return " ".join(str(text).split())


@profile_app.command("list")
def profile_list() -> None:
    """List the shipped profiles."""
    from wispsim.profiles import available_profiles

    for name in available_profiles():
        typer.echo(name)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        typer.echo(f"wispsim {__version__}")
        raise typer.Exit()


def main() -> None:
    """Console entry point: one-line errors with exit code 2 instead of tracebacks."""
    try:
        app(standalone_mode=False)
    except WispsimError as e:
        err_console.print("[red]error:[/red] " + escape(str(e)), highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted: finished points are kept; run the same command to resume")
        sys.exit(130)
    except typer.Abort:
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        raise


if __name__ == "__main__":
    main()
