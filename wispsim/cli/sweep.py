"""``wispsim sweep``, ``wispsim compare`` and ``wispsim ablate predictor``: many runs per answer.

``sweep`` finds the capacity per SLO class of one policy (the largest N whose violation rate
stays within epsilon), ``compare`` does so for several policies on common random numbers and
adds the speed-up ratios, and ``ablate predictor`` runs wisp with and without its rejection
predictor at fixed N. Each writes its tables, the resolved scenarios and a manifest to one
folder; finished points are stored there, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from wispsim.cli.common import (
    checked,
    console,
    out_dir,
    out_path,
    output,
    progress,
    resolve_scenario,
    table,
)
from wispsim.cli.options import (
    FRACTION_OPEN,
    SEED,
    SEEDS,
    AddressOpt,
    BackendOpt,
    EpsilonOpt,
    FirstSeedOpt,
    JobsOpt,
    MaxDevicesOpt,
    OutOpt,
    ScenarioArg,
    SeedsOpt,
    SetOpt,
    StartOpt,
    applying,
    check_backend,
    check_seeds,
    check_start,
    parse_classes,
    parse_devices,
    parse_policies,
)
from wispsim.config import POLICY_NAMES
from wispsim.errors import ConfigError
from wispsim.paths import OutputFolder
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
    also: Callable[[SweepResult, OutputFolder], None] | None = None,
) -> tuple[Path, SweepResult]:
    """Check the options, run the capacity sweep of ``policies`` and write its folder (``also``
    writes the command's own tables; the manifest comes after them)."""
    from wispsim.study.capacity import capacity_sweep, groups_for
    from wispsim.study.points import RECORD_MODES
    from wispsim.study.runners import make_runner

    folder = out_path(out, command)  # checked before any work
    cls = parse_classes(classes)
    grid = parse_devices(devices)
    if mix not in ("separate", "shared"):
        raise ConfigError("--mix", "", f"got {mix!r}; allowed: separate, shared")
    if records not in RECORD_MODES:
        raise ConfigError("--records", "", f"got {records!r}; allowed: {', '.join(RECORD_MODES)}")
    check_start(start, max_devices)
    check_backend(backend, address)
    sc = resolve_scenario(scenario, sets)
    cls = cls or sc.devices.classes
    eps = sc.epsilon if epsilon is None else epsilon
    seed_list = check_seeds(sc.seed if seed is None else seed, seeds)
    with applying("--classes"):
        base = {p: sc.with_policy(p).with_devices(sc.devices.count, cls) for p in policies}
    for p, s in base.items():
        checked(s, classes=classes, policy=p if p != sc.policy else None)
    folder = out_dir(folder, command)
    with output(folder) as o:  # removes an old manifest.json: the folder is incomplete until the end
        for p, s in base.items():
            (o / (f"scenario-{p}.yaml" if len(base) > 1 else "scenario.yaml")).write_text(s.to_yaml())
    groups = groups_for(cls, mix)
    with (
        output(folder) as o,  # a full disk while storing points: one line; finished points stay
        make_runner(backend, jobs, folder, records, address) as runner,
        progress() as prog,
    ):
        o.current = None
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
    with output(folder) as o:  # manifest.json last: a folder without it is incomplete
        result.write(o.path)
        if also is not None:
            also(result, o)
        write_manifest(
            o.path,
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
    seeds: SeedsOpt = 3,
    seed: Annotated[
        int | None, typer.Option(help="First seed (default: the scenario's).", parser=SEED)
    ] = None,
    epsilon: Annotated[
        float | None,
        typer.Option(help="Allowed violation rate (default: the scenario's, 0.05).", parser=FRACTION_OPEN),
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
        parse_policies(policy, "--policy"),
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
    seeds: Annotated[int, typer.Option(help="Seeds per N.", parser=SEEDS)] = 3,
    seed: FirstSeedOpt = None,
    epsilon: EpsilonOpt = None,
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
    wide = None

    def write_compare(result: SweepResult, o: OutputFolder) -> None:
        nonlocal wide
        wide = speedups(result.capacity, pols)
        wide.to_csv(o / "compare.csv", index=False)

    folder, _ = _sweep_common(
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
        write_compare,
    )
    assert wide is not None
    console.print(table(wide, "capacity (devices) by policy"))
    console.print(f"compare.csv, capacity.csv, curve.csv: {folder}")


@ablate_app.command("predictor")
def ablate_predictor_cmd(
    scenario: ScenarioArg = None,
    devices: Annotated[str, typer.Option(help="N values, e.g. 2,4,8,16.")] = "2,4,8,16",
    classes: Annotated[str | None, typer.Option(help="SLO classes of the devices.")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per N (the same for both arms).", parser=SEEDS)] = 3,
    seed: FirstSeedOpt = None,
    jobs: JobsOpt = 2,
    backend: BackendOpt = "local",
    address: AddressOpt = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """Predictor on (wisp) vs off (wisp-fixed): acceptance ratio, wasted drafting, goodput."""
    from wispsim.study.ablation import ablate_predictor, write
    from wispsim.study.runners import make_runner

    folder = out_path(out, "ablate")  # checked before any work
    cls = parse_classes(classes)
    ns = list(parse_devices(devices))
    check_backend(backend, address)
    sc = resolve_scenario(scenario, set_)
    with applying("--classes"):
        sc = sc.with_devices(sc.devices.count, cls)
    checked(sc, classes=classes)
    first = sc.seed if seed is None else seed
    seed_list = check_seeds(first, seeds)
    folder = out_dir(folder, "ablate")
    with output(folder) as o:  # removes an old manifest.json: the folder is incomplete until the end
        (o / "scenario.yaml").write_text(sc.to_yaml())
    with (
        output(folder),
        make_runner(backend, jobs, folder, "responses", address) as runner,
        progress() as prog,
    ):
        task = prog.add_task("ablate predictor", total=None)
        per_seed, result = ablate_predictor(
            sc,
            ns,
            seed_list,
            runner,
            progress=lambda d, t: prog.update(task, completed=d, total=t),
        )
    with output(folder) as o:  # manifest.json last
        write(per_seed, result, o.path)
        write_manifest(
            o.path,
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
