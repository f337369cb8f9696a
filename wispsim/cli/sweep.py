"""``wispsim sweep``, ``wispsim compare`` and ``wispsim ablate predictor``: many runs per answer.

``sweep`` finds the capacity per SLO class of one policy (the largest N whose violation rate
stays within epsilon), ``compare`` does so for several policies on common random numbers and
adds the speed-up ratios, and ``ablate predictor`` runs wisp with and without its rejection
predictor at fixed N. Each writes its tables, the resolved scenarios and a manifest to one
folder; finished points are stored there, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from wispsim.cli.common import console, reporting, table
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
    parse_classes,
    parse_devices,
    parse_policies,
)
from wispsim.config import POLICY_NAMES
from wispsim.runs.sweep import SweepRequest
from wispsim.runs.sweep import sweep as run_sweep

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


def _request(scenario: Path | None, sets: list[str] | None, policies: list[str], **kw: Any) -> SweepRequest:
    """The sweep's plain arguments, its option strings parsed."""
    kw["classes"] = parse_classes(kw["classes"])
    kw["grid"] = parse_devices(kw.pop("devices"))
    return SweepRequest(scenario, sets, policies, **kw)


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
    pols = parse_policies(policy, "--policy")
    req = _request(scenario, set_, pols, classes=classes, devices=devices, seeds=seeds, seed=seed,
                   epsilon=epsilon, jobs=jobs, mix=mix, start=start, max_devices=max_devices,
                   records=records, backend=backend, address=address)  # fmt: skip
    with reporting(f"sweep {policy}") as report:
        o = run_sweep(req, "sweep", out, report)
    folder, result = o.folder, o.result
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
    pols = parse_policies(policies)
    req = _request(scenario, set_, pols, classes=classes, devices=devices, seeds=seeds, seed=seed,
                   epsilon=epsilon, jobs=jobs, mix=mix, start=start, max_devices=max_devices,
                   records=records, backend=backend, address=address)  # fmt: skip
    with reporting(f"compare {','.join(pols)}") as report:
        o = run_sweep(req, "compare", out, report)
    folder, wide = o.folder, o.speedups
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
    from wispsim.runs.sweep import ablate_predictor

    cls, ns = parse_classes(classes), list(parse_devices(devices))
    with reporting("ablate predictor") as report:
        o = ablate_predictor(scenario, set_, cls, ns, seeds, seed, jobs, backend, address, out, report)
    sc, result, folder = o.scenario, o.result, o.folder
    title = f"predictor ablation ({sc.acceptance.model} acceptance)"
    console.print(table(result, title, ABLATION_COLUMNS))
    console.print(f"ablation.csv, ablation_per_seed.csv, points/: {folder}")


def register(app: typer.Typer) -> None:
    """Mount ``sweep`` and ``compare`` on the root app (``ablate`` is a group of its own)."""
    app.command("sweep")(sweep)
    app.command("compare")(compare)
