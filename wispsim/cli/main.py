"""The ``wispsim`` command line (typer + rich).

Commands: ``run`` (one simulation), ``sweep`` (capacity search for one policy), ``compare``
(capacity of several policies side by side), ``replay`` (a recorded per-round log under a policy),
``plan`` (replicas for a fleet), ``arrivals generate|show``, ``scenario show|validate``,
``profile ...``, ``estimator compare``, ``trace ...``, ``predictor ...``, ``ablate ...``.
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
from wispsim.cli.arrivals import arrivals_app
from wispsim.cli.experiment import experiment_app
from wispsim.cli.plot import plot_app
from wispsim.cli.predictor import predictor_app
from wispsim.cli.profile import register as register_profile_commands
from wispsim.cli.trace import trace_app
from wispsim.config import POLICY_NAMES, Scenario, parse_set
from wispsim.errors import ConfigError, WispsimError
from wispsim.sim.inputs import apply_arrivals_option, apply_server_options, load_scenario
from wispsim.study.capacity import speedups

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
app.add_typer(arrivals_app, name="arrivals")
app.add_typer(experiment_app, name="experiment")
app.add_typer(plot_app, name="plot")

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
JobsOpt = Annotated[
    int, typer.Option("--jobs", "-j", help="Parallel simulations (local processes, or Ray tasks in flight).")
]
BackendOpt = Annotated[str, typer.Option(help="Where simulations run: local (process pool) or ray.")]
AddressOpt = Annotated[
    str | None, typer.Option(help="Ray cluster address (with --backend ray; default: a local Ray instance).")
]


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


def describe_load(sc: Scenario, devices: int | None = None) -> str:
    a = sc.arrivals
    reps = f", {sc.server.replicas} replicas" if sc.server.replicas > 1 else ""
    if a.process == "closed":
        return f"N={devices or sc.devices.count}{reps}"
    if a.process == "poisson":
        return f"Poisson {a.rate:g} responses/s{reps}"
    return f"{a.kind} trace {Path(a.trace or '').name}{reps}"


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
    arrivals: Annotated[
        str | None,
        typer.Option(
            help="Arrival process: a time_s,value CSV (concurrency trace; its span becomes the "
            "measurement window), NAME:FILE with NAME concurrency or rate, or poisson:RATE.",
        ),
    ] = None,
    replicas: Annotated[int | None, typer.Option(help="Verifier replicas behind the router.")] = None,
    router: Annotated[str | None, typer.Option(help="round-robin, least-work or affinity.")] = None,
    tail: Annotated[
        float, typer.Option(help="With a trace: seconds measured after it ends (last value holds).")
    ] = 300.0,
    step: Annotated[float, typer.Option(help="Time step of the time series (s).")] = 10.0,
    window: Annotated[float, typer.Option(help="Trailing window of compliance over time (s).")] = 60.0,
    log: Annotated[
        Path | None, typer.Option(help="Also write the per-round log (.parquet or .csv) that `replay` reads.")
    ] = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run one simulation; write its records (Parquet), per-class summary and time series."""
    from wispsim.analysis.metrics import replica_summary, summarize
    from wispsim.analysis.timeseries import write_timeseries
    from wispsim.plots.timeseries import compliance_figure
    from wispsim.sim.engine import simulate

    sc = _load(scenario, set_)
    if policy is not None:
        sc = sc.with_policy(policy)
    if devices is not None and devices < 1:
        raise ConfigError("--devices", "", f"must be >= 1, got {devices}")
    if step <= 0 or window <= 0:
        raise ConfigError("--step" if step <= 0 else "--window", "", "must be > 0 seconds")
    sc = apply_server_options(apply_arrivals_option(sc, arrivals, tail), replicas, router)
    sc = sc.with_devices(devices or sc.devices.count, parse_classes(classes))
    if seed is not None:
        if seed < 0:
            raise ConfigError("--seed", "", f"must be >= 0, got {seed}")
        sc = sc.replace(seed=seed)
    folder = _out_dir(out, "run")
    who = describe_load(sc)
    with err_console.status(f"simulating {who} under {sc.policy} ..."):
        res = simulate(sc)
    summary = summarize(res)
    (folder / "scenario.yaml").write_text(sc.to_yaml())
    res.rounds.to_parquet(folder / "rounds.parquet", index=False)
    res.batches.to_parquet(folder / "batches.parquet", index=False)
    res.responses.to_parquet(folder / "responses.parquet", index=False)
    summary.to_csv(folder / "summary.csv", index=False)
    per_replica = replica_summary(res)
    per_replica.to_csv(folder / "replicas.csv", index=False)
    comp, server, bursts = write_timeseries(res, folder, step, window)
    if sc.arrivals.process != "closed":
        compliance_figure(res, comp, server, window, folder / "compliance.png")
    if log is not None:
        from wispsim.study.replay import write_log

        write_log(res, log)
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
    console.print(_table(summary, f"{sc.policy}, {describe_load(sc, res.devices)}, seed={sc.seed}", cols))
    if sc.server.replicas > 1:
        console.print(_table(per_replica, f"per replica ({sc.server.router} router)"))
    if bursts is not None and not bursts.empty:
        console.print(_table(bursts, f"bursts (threshold {1 - sc.epsilon:g}, trailing {window:g} s window)"))
    console.print(f"records and summary: {folder}  ({res.wall_s:.1f} s wall, {len(res.rounds)} rounds)")
    if not res.responses.measured.any():
        err_console.print(
            "[yellow]warning:[/yellow] no response started inside the measurement window "
            f"[{res.window[0]:g}, {res.window[1]:g}) s, so the violation rate is undefined; "
            "lengthen workload.duration_s"
        )


def _replay_tables(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The comparison in two narrow tables: violation rates, and time quantiles as rec/sim."""
    violations = pd.DataFrame(
        {
            "class": table["class"],
            "responses": [
                f"{a} / {b}" for a, b in zip(table.responses_recorded, table.responses_simulated, strict=True)
            ],
            "recorded": table.violation_recorded,
            "95% CI": [
                f"[{lo:.3f}, {hi:.3f}]"
                for lo, hi in zip(table.violation_recorded_lo, table.violation_recorded_hi, strict=True)
            ],
            "simulated": table.violation_simulated,
            "difference": table.violation_diff,
        }
    )
    if table.truncated_simulated.any():  # measured in the replay, but the log ended inside them
        violations["log ended"] = table.truncated_simulated
    ms = lambda x: "-" if x != x else f"{x:.1f}" if abs(x) < 100 else f"{x:.0f}"  # noqa: E731
    times: dict[str, Any] = {"class": table["class"]}
    for kind in ("queue", "verify"):
        for q in (50, 90, 99):
            rec, sim = table[f"{kind}_p{q}_ms_recorded"], table[f"{kind}_p{q}_ms_simulated"]
            times[f"{kind} p{q}"] = [f"{ms(float(a))}/{ms(float(b))}" for a, b in zip(rec, sim, strict=True)]
        times[f"{kind} KS"] = table[f"{kind}_ks"]
    return violations, pd.DataFrame(times)


@app.command("replay")
def replay_cmd(
    log: Annotated[
        Path, typer.Argument(help="Per-round log (.parquet or .csv) with its LOG.meta.json sidecar.")
    ],
    scenario: ScenarioArg = None,
    policy: Annotated[
        str | None,
        typer.Option(help=f"Policy preset: {', '.join(POLICY_NAMES)} (default: the recorded one)."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the server's noise (default: the log's).")] = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Replay a recorded deployment's device side under a policy; compare recorded and simulated.

    The scenario is the one in the log's sidecar; a SCENARIO file replaces it, --set overrides.
    """
    from wispsim.study.replay import compare as compare_replay
    from wispsim.study.replay import describe, log_scenario, meta_path, read_log, replay

    frame, meta = read_log(log)
    if scenario is not None:
        sc = _load(scenario, set_)
    else:
        sc = log_scenario(meta, str(meta_path(log)), parse_set(set_ or []))
    if policy is not None:
        sc = sc.with_policy(policy)
    if seed is not None and seed < 0:
        raise ConfigError("--seed", "", f"must be >= 0, got {seed}")
    folder = _out_dir(out, "replay")
    devices = frame.device.nunique()
    err_console.print(f"replay: {describe(sc, meta)}", highlight=False)
    with err_console.status(f"replaying {devices} devices, {len(frame)} rounds under {sc.policy} ..."):
        res = replay(sc, frame, meta, seed)
    table = compare_replay(frame, res, meta)
    (folder / "scenario.yaml").write_text(res.scenario.to_yaml())
    res.rounds.to_parquet(folder / "rounds.parquet", index=False)
    res.batches.to_parquet(folder / "batches.parquet", index=False)
    res.responses.to_parquet(folder / "responses.parquet", index=False)
    table.to_csv(folder / "comparison.csv", index=False)
    _manifest(
        folder,
        "replay",
        {
            "log": str(log),
            "recorded_policy": meta.get("policy"),
            "policy": sc.policy,
            "seed": res.seed,
            "devices": res.devices,
            "sim_end_s": res.sim_end,
            "wall_s": res.wall_s,
        },
    )
    violations, times = _replay_tables(table)
    title = (
        f"violation rate: recorded ({meta.get('policy', '?')}) vs simulated ({sc.policy}), seed={res.seed}"
    )
    console.print(_table(violations, title))
    console.print(_table(times, "queue and verify time (ms), recorded/simulated; KS statistic"))
    console.print(f"records and comparison: {folder}  ({res.wall_s:.1f} s wall, {len(res.rounds)} rounds)")


def parse_fleet(text: str) -> tuple[Any, ...]:
    """``2:500,4:500`` -> device groups (class:count)."""
    from wispsim.config import DeviceGroup

    groups = []
    for part in text.split(","):
        try:
            slo, cnt = part.split(":")
            g = DeviceGroup(count=int(cnt), slo=float(slo), name=f"{float(slo):g} tok/s")
        except (ValueError, ConfigError):
            raise ConfigError(
                "--fleet",
                "",
                f"expected CLASS:COUNT pairs like 2:500,4:500 (class > 0, count >= 0), got {part!r}",
            ) from None
        groups.append(g)
    if sum(g.count for g in groups) < 1:
        raise ConfigError("--fleet", "", "needs at least one device")
    return tuple(groups)


@app.command()
def plan(
    scenario: ScenarioArg = None,
    fleet: Annotated[
        str | None,
        typer.Option(help="Devices per class, e.g. 2:500,4:500,6:500,8:500 (default: devices.groups)."),
    ] = None,
    policy: Annotated[str | None, typer.Option(help=f"Policy preset: {', '.join(POLICY_NAMES)}.")] = None,
    profile: Annotated[str | None, typer.Option(help="Latency profile of every replica.")] = None,
    router: Annotated[str | None, typer.Option(help="round-robin, least-work or affinity.")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per replica count.")] = 1,
    seed: Annotated[int | None, typer.Option(help="First seed.")] = None,
    epsilon: Annotated[float | None, typer.Option(help="Allowed violation rate per class.")] = None,
    start: Annotated[int | None, typer.Option(help="First replica count tried (default N/100).")] = None,
    max_replicas: Annotated[int, typer.Option(help="Give up above this many replicas.")] = 512,
    price_per_gpu_hour: Annotated[
        float | None, typer.Option(help="GPU price (default: the profile's hardware.price_per_gpu_hour).")
    ] = None,
    jobs: JobsOpt = 2,
    backend: BackendOpt = "local",
    address: AddressOpt = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """The fewest verifier replicas that keep every class of a fleet within epsilon."""
    import dataclasses
    import time

    from wispsim.model.fleet import fleet_size
    from wispsim.model.profiles import load_profile
    from wispsim.study.replicas import plan_replicas, with_replicas
    from wispsim.study.runners import make_runner

    sc = _load(scenario, set_)
    if policy is not None:
        sc = sc.with_policy(policy)
    if fleet is not None:
        sc = sc.replace(devices=dataclasses.replace(sc.devices, groups=parse_fleet(fleet)))
    srv = sc.server
    if profile is not None:
        load_profile(profile)
        srv = dataclasses.replace(srv, profile=profile, replica_profiles=())
    if router is not None:
        from wispsim.sim.router import ROUTERS

        ROUTERS.get(router, "--router", "--router")
        srv = dataclasses.replace(srv, router=router)
    sc = sc.replace(server=srv)
    if seeds < 1 or jobs < 1:
        raise ConfigError("--seeds" if seeds < 1 else "--jobs", "", "must be >= 1")
    if max_replicas < 1 or (start is not None and not 1 <= start <= max_replicas):
        raise ConfigError("--start", "", "needs 1 <= --start <= --max-replicas")
    eps = sc.epsilon if epsilon is None else epsilon
    if not 0 <= eps < 1:
        raise ConfigError("--epsilon", "", f"must be in [0, 1), got {eps}")
    if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
        raise ConfigError("--price-per-gpu-hour", "", f"must be >= 0, got {price_per_gpu_hour}")
    first = sc.seed if seed is None else seed
    seed_list = [first + i for i in range(seeds)]
    n = fleet_size(sc)
    folder = _out_dir(out, "plan")
    (folder / "scenario.yaml").write_text(sc.to_yaml())
    t0 = time.perf_counter()
    with make_runner(backend, jobs, folder, "none", address) as runner, _progress() as prog:
        task = prog.add_task(f"plan {sc.policy}, {n} devices", total=None)
        res = plan_replicas(
            sc,
            runner,
            seed_list,
            eps,
            start=start,
            max_replicas=max_replicas,
            progress=lambda k, msg: prog.update(task, completed=k, description=f"plan {sc.policy}: {msg}"),
        )
    wall = time.perf_counter() - t0
    res.tried.to_csv(folder / "plan.csv", index=False)
    console.print(
        _table(res.tried, f"{sc.policy}, {n} devices, {sc.server.profile}, router {sc.server.router}")
    )
    prof = load_profile(sc.server.profile)
    price = price_per_gpu_hour if price_per_gpu_hour is not None else prof.price_per_gpu_hour
    extra: dict[str, Any] = {
        "devices": n,
        "policy": sc.policy,
        "profile": sc.server.profile,
        "router": sc.server.router,
        "seeds": seed_list,
        "epsilon": eps,
        "replicas": res.replicas,
        "evaluations": res.evaluations,
        "wall_s": wall,
    }
    if res.replicas is None:
        _manifest(folder, "plan", extra)
        raise WispsimError(f"plan: no replica count up to {max_replicas} keeps every class within {eps:g}")
    (folder / "scenario-answer.yaml").write_text(with_replicas(sc, res.replicas).to_yaml())
    if res.per_replica is not None:
        res.per_replica.to_csv(folder / "replicas.csv", index=False)
        console.print(_table(res.per_replica, f"per-replica load at R={res.replicas} (seed {first})"))
    gpus = res.replicas * prof.gpu_count
    line = f"answer: {res.replicas} replicas ({gpus} x {prof.gpu}) for {n} devices"
    if price is not None:
        extra["cost_per_hour"] = gpus * price
        line += f"; cost {gpus} GPUs x {price:g}/GPU-hour = {gpus * price:,.2f} per hour"
    else:
        line += "; no price (set hardware.price_per_gpu_hour in the profile or --price-per-gpu-hour)"
    _manifest(folder, "plan", extra)
    console.print(line)
    console.print(f"{res.evaluations} replica counts x {seeds} seed(s) in {wall:.0f} s; results: {folder}")


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
    backend: str = "local",
    address: str | None = None,
) -> tuple[Path, Any]:
    from wispsim.study.capacity import capacity_sweep, groups_for
    from wispsim.study.points import RECORD_MODES
    from wispsim.study.runners import make_runner

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
    with make_runner(backend, jobs, folder, records, address) as runner, _progress() as prog:
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
    result.write(folder)
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
            "backend": backend,
            "address": address,
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
    backend: BackendOpt = "local",
    address: AddressOpt = None,
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
        backend,
        address,
    )
    console.print(
        _table(
            result.capacity,
            f"capacity ({policy})",
            ["policy", "class", "capacity", "ci_low", "ci_high", "evaluated"],
        )
    )
    console.print(f"capacity.csv, curve.csv and points/: {folder}")


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
    backend: BackendOpt = "local",
    address: AddressOpt = None,
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
        backend,
        address,
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
    backend: BackendOpt = "local",
    address: AddressOpt = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Predictor on (wisp) vs off (wisp-fixed): acceptance ratio, wasted drafting, goodput."""
    from wispsim.study.ablation import ablate_predictor, write
    from wispsim.study.runners import make_runner

    sc = _load(scenario, set_)
    sc = sc.with_devices(sc.devices.count, parse_classes(classes))
    ns = list(parse_devices(devices))
    if seeds < 1:
        raise ConfigError("--seeds", "", f"must be >= 1, got {seeds}")
    first = sc.seed if seed is None else seed
    folder = _out_dir(out, "ablate")
    (folder / "scenario.yaml").write_text(sc.to_yaml())
    with make_runner(backend, jobs, folder, "responses", address) as runner, _progress() as prog:
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
    from wispsim.model.acceptance import make_acceptance
    from wispsim.model.profiles import load_profile

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
    from wispsim.model.profiles import load_profile

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
    from wispsim.model.profiles import available_profiles

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
    except Exception as e:  # usage errors, from click or from typer's vendored copy of it
        if isinstance(e, _click_exceptions()):
            e.show()  # type: ignore[attr-defined]
            sys.exit(e.exit_code)  # type: ignore[attr-defined]
        raise


def _click_exceptions() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = []
    try:
        import click

        kinds.append(click.exceptions.ClickException)
    except ImportError:  # pragma: no cover
        pass
    try:
        from typer._click import exceptions as vendored  # typer >= 0.20 vendors click

        kinds.append(vendored.ClickException)
    except ImportError:  # pragma: no cover
        pass
    return tuple(kinds)


if __name__ == "__main__":
    main()
