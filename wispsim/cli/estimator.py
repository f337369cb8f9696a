"""``wispsim estimator compare``: capacity with the fitted formula vs with replayed measurements.

The check that closes the profiling workflow (``wispsim profile ...``): does the linear estimator
fitted to a measured profile give the same capacity as replaying the measurements themselves?
:mod:`wispsim.study.estimator_compare` builds the two scenarios and the comparison table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from wispsim.cli.common import console, reporting, table
from wispsim.cli.options import (
    JOBS,
    SEEDS,
    EpsilonOpt,
    FirstSeedOpt,
    MaxDevicesOpt,
    StartOpt,
    parse_classes,
    parse_devices,
)

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
    from wispsim.runs.sweep import SweepRequest
    from wispsim.runs.sweep import estimator_compare as run_compare

    req = SweepRequest(
        scenario, set_, [policy], parse_classes(classes), parse_devices(devices), seeds, seed, epsilon,
        jobs, "separate", start, max_devices, "none", backend, address,
    )  # fmt: skip
    with reporting("compare", eta=True) as report:
        o = run_compare(req, profile, measured, out, report)
    wide, folder = o.compare, o.folder
    title = f"capacity (devices), {policy}, profile {o.profile}: formula vs measurements"
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
