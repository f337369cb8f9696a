"""``wispsim estimator compare``: capacity with the fitted formula vs with replayed measurements.

The check that closes the profiling workflow (``wispsim profile ...``): does the linear estimator
fitted to a measured profile give the same capacity as replaying the measurements themselves?
:mod:`wispsim.study.estimator_compare` builds the two scenarios and the comparison table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
    JOBS,
    SEEDS,
    EpsilonOpt,
    FirstSeedOpt,
    MaxDevicesOpt,
    StartOpt,
    applying,
    check_backend,
    check_seeds,
    check_start,
    parse_classes,
    parse_devices,
)
from wispsim.errors import ConfigError
from wispsim.provenance import write_manifest

estimator_app = typer.Typer(
    help="Verification-time estimator: formula vs measurements.", no_args_is_help=True
)


@estimator_app.command("compare")
def estimator_compare(
    scenario: Annotated[Path | None, typer.Argument(help="Scenario YAML (merged over the default).")] = None,
    profile: Annotated[
        str | None, typer.Option(help="A measured profile (default: the scenario's server.profile).")
    ] = None,
    policy: Annotated[str, typer.Option(help="Policy preset.")] = "wisp",
    classes: Annotated[str | None, typer.Option(help="SLO classes, e.g. 4,8.")] = None,
    devices: Annotated[str | None, typer.Option(help="Grid of N to evaluate first.")] = None,
    seeds: Annotated[int, typer.Option(help="Seeds per N.", parser=SEEDS)] = 1,
    seed: FirstSeedOpt = None,
    epsilon: EpsilonOpt = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Parallel simulations.", parser=JOBS)] = 2,
    backend: Annotated[str, typer.Option(help="Where simulations run: local or ray.")] = "local",
    address: Annotated[str | None, typer.Option(help="Ray cluster address (--backend ray).")] = None,
    start: StartOpt = 8,
    max_devices: MaxDevicesOpt = 1024,
    measured: Annotated[str, typer.Option(help="measured or measured-nearest.")] = "measured",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output folder.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a scenario field.")] = None,
) -> None:
    """Capacity per SLO class with the fitted formula (linear) and with replayed measurements."""
    from wispsim.model.profiles import load_profile
    from wispsim.study.capacity import capacity_sweep, groups_for
    from wispsim.study.estimator_compare import MEASURED_MODELS, compare_capacities, latency_scenarios
    from wispsim.study.runners import make_runner

    folder = out_path(out, "estimator-compare")  # checked before any work
    if measured not in MEASURED_MODELS:
        raise ConfigError("--measured", "", f"got {measured!r}; allowed: {', '.join(MEASURED_MODELS)}")
    parsed = parse_classes(classes)
    grid = parse_devices(devices)
    check_start(start, max_devices)
    check_backend(backend, address)
    sc = resolve_scenario(scenario, set_).with_policy(policy)
    prof_name = profile or sc.server.profile
    prof = load_profile(prof_name)
    if prof.kind != "measured":
        raise ConfigError(
            f"profile '{prof.name}'", "provenance.kind", f"is {prof.kind}; compare needs a measured one"
        )
    cls = parsed or sc.devices.classes
    eps = sc.epsilon if epsilon is None else epsilon
    with applying("--classes"):
        base = latency_scenarios(sc, prof_name, measured, cls)
    for s in base.values():
        checked(s, classes=classes, profile=profile)
    first = sc.seed if seed is None else seed
    seed_list = check_seeds(first, seeds)
    folder = out_dir(folder, "estimator-compare")
    with output(folder) as o:  # removes an old manifest.json: the folder is incomplete until the end
        for model, s in base.items():
            (o / f"scenario-{model}.yaml").write_text(s.to_yaml())
    with (
        output(folder),
        make_runner(backend, jobs, folder, "none", address) as runner,
        progress(eta=True) as prog,
    ):
        task = prog.add_task("compare", total=None)
        result = capacity_sweep(
            base,
            groups_for(cls, "separate"),
            seed_list,
            eps,
            runner,
            grid=grid,
            start=start,
            max_devices=max_devices,
            progress=lambda d, t: prog.update(task, completed=d, total=t),
        )
    cap, wide = compare_capacities(result, base, measured, first, prof.data_path)
    with output(folder) as o:  # manifest.json last: a folder without it is incomplete
        cap.to_csv(o / "capacity.csv", index=False)
        wide.to_csv(o / "compare.csv", index=False)
        write_manifest(
            o.path,
            {
                "profile": prof.name,
                "policy": policy,
                "measured": measured,
                "classes": list(cls),
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
    title = f"capacity (devices), {policy}, profile {prof.name}: formula vs measurements"
    console.print(table(wide.map(_cell), title))
    console.print(
        "in_range: share of the batches simulated at the measured capacity whose N_linear, "
        "N_interactions and N_cached all lie inside the measured range (outside it, replay "
        "follows the fitted formula from the nearest measurement)."
    )
    console.print(f"compare.csv, capacity.csv: {folder}")


def _cell(v: Any) -> str:
    # this table has always shown every float to 3 decimals and NaN as "nan" (common.fmt
    # shows "-" and whole numbers from 100 on); kept so the printed table does not change
    return f"{v:.3f}" if isinstance(v, float) and v == v else str(v)
