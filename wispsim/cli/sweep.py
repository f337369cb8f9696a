"""``wispsim sweep``, ``wispsim compare`` and ``wispsim ablate predictor``: many runs per answer.

``sweep`` finds the capacity per SLO class of one policy (the largest N whose violation rate
stays within epsilon), ``compare`` does so for several policies on common random numbers and
adds the speed-up ratios, and ``ablate predictor`` runs wisp with and without its rejection
predictor at fixed N. Each writes its tables, the resolved scenarios and a manifest to one
folder; finished points are stored there, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from wispsim.cli.common import (
    AddressOpt,
    BackendOpt,
    JobsOpt,
    MaxDevicesOpt,
    OutOpt,
    ScenarioArg,
    SetOpt,
    StartOpt,
    console,
    out_dir,
    parse_classes,
    parse_devices,
    parse_policies,
    progress,
    resolve_scenario,
    table,
)
from wispsim.config import POLICY_NAMES
from wispsim.errors import ConfigError
from wispsim.provenance import write_manifest
from wispsim.study.capacity import SweepResult

RecordsOpt = Annotated[str, typer.Option(help="Records kept per point: none, responses, all.")]
ABLATION_COLUMNS = [
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

ablate_app = typer.Typer(help="Ablation studies.", no_args_is_help=True)


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
) -> tuple[Path, SweepResult]:
    """Check the options, run the capacity sweep of ``policies`` and write its folder."""
    from wispsim.study.capacity import capacity_sweep, groups_for
    from wispsim.study.points import RECORD_MODES
    from wispsim.study.runners import make_runner

    sc = resolve_scenario(scenario, sets)
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
    folder = out_dir(out, command)
    for p, s in base.items():
        (folder / (f"scenario-{p}.yaml" if len(base) > 1 else "scenario.yaml")).write_text(s.to_yaml())
    groups = groups_for(cls, mix)
    with make_runner(backend, jobs, folder, records, address) as runner, progress() as prog:
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
    write_manifest(
        folder,
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
    start: StartOpt = 8,
    max_devices: MaxDevicesOpt = 4096,
    records: RecordsOpt = "responses",
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
    columns = ["policy", "class", "capacity", "ci_low", "ci_high", "evaluated"]
    console.print(table(result.capacity, f"capacity ({policy})", columns))
    console.print(f"capacity.csv, curve.csv and points/: {folder}")


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
    start: StartOpt = 8,
    max_devices: MaxDevicesOpt = 4096,
    records: RecordsOpt = "responses",
    set_: SetOpt = None,
) -> None:
    """Capacity of several policies side by side, with speedup ratios."""
    from wispsim.study.capacity import speedups

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
    console.print(table(wide, "capacity (devices) by policy"))
    console.print(f"compare.csv, capacity.csv, curve.csv: {folder}")


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

    sc = resolve_scenario(scenario, set_)
    sc = sc.with_devices(sc.devices.count, parse_classes(classes))
    ns = list(parse_devices(devices))
    if seeds < 1:
        raise ConfigError("--seeds", "", f"must be >= 1, got {seeds}")
    first = sc.seed if seed is None else seed
    folder = out_dir(out, "ablate")
    (folder / "scenario.yaml").write_text(sc.to_yaml())
    with make_runner(backend, jobs, folder, "responses", address) as runner, progress() as prog:
        task = prog.add_task("ablate predictor", total=None)
        per_seed, result = ablate_predictor(
            sc,
            ns,
            [first + i for i in range(seeds)],
            runner,
            progress=lambda d, t: prog.update(task, completed=d, total=t),
        )
    write(per_seed, result, folder)
    write_manifest(
        folder,
        {
            "devices": ns,
            "seeds": seeds,
            "first_seed": first,
            "acceptance": sc.acceptance.model,
            "trace": sc.acceptance.trace,
            "predictor": sc.drafting.predictor.name,
        },
    )
    title = f"predictor ablation ({sc.acceptance.model} acceptance)"
    console.print(table(result, title, ABLATION_COLUMNS))
    console.print(f"ablation.csv, ablation_per_seed.csv, points/: {folder}")


def register(app: typer.Typer) -> None:
    """Mount ``sweep`` and ``compare`` on the root app (``ablate`` is a group of its own)."""
    app.command("sweep")(sweep)
    app.command("compare")(compare)
