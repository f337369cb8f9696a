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
StopOpt = Annotated[
    str,
    typer.Option(
        help="When a point ends: sequential (once its violation rate's interval clears epsilon, "
        "else at the horizon) or horizon (always the whole window)."
    ),
]
SearchOpt = Annotated[
    str,
    typer.Option(
        help="Where the search ends: knee (once both ends of its bracket are within the noise of "
        "epsilon; the capacity is where the rate crosses it between them) or exact (bisect to the "
        "integer)."
    ),
]
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


CAPACITY_COLUMNS = ["class", "capacity", "ci_low", "ci_high", "saturated", "binds", "estimate", "evaluated"]


def _shown(cap: Any) -> Any:
    """The capacity table as printed: what binds at capacity with its headroom, the estimate with
    what binds it, saturated as yes/no."""
    return cap.assign(
        binds=[f"{b} ({h:.0%})" if b else "-" for b, h in zip(cap.binds, cap.headroom, strict=True)],
        estimate=[f"{e} ({b})" for e, b in zip(cap.estimate, cap.estimate_binds, strict=True)],
        saturated=cap.saturated.map({True: "yes", False: "no"}),
    )


def _legend(o: Any) -> None:
    """What the capacity table's columns mean, under it."""
    f = o.facts
    seeds = len(f["seeds"])
    for pol, text in o.servers.items():
        console.print(f"server ({pol}): {text}" if len(o.servers) > 1 else f"server: {text}")
    console.print(
        f"class: the devices' SLO, the least speed a response may have (tok/s). capacity: the most "
        f"devices of one class the server serves with at most {f['epsilon']:g} of their responses "
        f"slower than that (epsilon), pooled over {seeds} seed{'s' * (seeds != 1)}; ci_low/ci_high: its 95% "
        f"interval. saturated: even {f['max_devices']} devices met it (a lower bound). binds: what "
        "binds the simulated runs at capacity (at the simulated N nearest it from below), with its "
        "headroom (wispsim.analysis.binding). estimate: "
        "the fluid model's first guess and the resource that binds it (wispsim.model.fluid). evaluated: "
        "N values simulated, each with every seed.",
        highlight=False,
    )
    few = _few_responses(o.result)
    if few:  # an interval from a handful of responses is not a confident answer: say so
        console.print(
            f"note: {few}: lengthen workload.duration_s or add --seeds for a firmer answer", highlight=False
        )
    from wispsim.provenance import code_commit

    now = code_commit()
    older = {c: n for c, n in f.get("point_commits", {}).items() if c != now}
    if older:  # points stored in --out by other code are reused, not recomputed: say so
        said = ", ".join(f"{n} by {c}" for c, n in older.items())
        console.print(
            f"note: points reused from --out computed by other code ({said}; this code: {now}); "
            "a new --out recomputes them",
            highlight=False,
        )


FEW_RESPONSES = 30  # fewer measured responses at a capacity than this: the legend says so


def _few_responses(result: Any) -> str:
    """The capacities that rest on fewer than :data:`FEW_RESPONSES` responses at their N."""
    pooled, out = result.pooled, []
    for _, row in result.capacity.iterrows():
        at = pooled[(pooled.policy == row.policy) & (pooled["class"].astype(str) == str(row["class"]))
                    & (pooled.devices == row.capacity)]  # fmt: skip
        n = int(at.responses.sum()) if len(at) else 0
        if n < FEW_RESPONSES:
            many = "s" * (n != 1)
            where = f"{row.policy} at {row['class']} tok/s"
            out.append(f"{where} rests on {n} response{many} at N = {row.capacity}")
    return "; ".join(out)


def _request(scenario: Path | None, sets: list[str] | None, policies: list[str], **kw: Any) -> SweepRequest:
    """The sweep's plain arguments, its option strings parsed."""
    kw["classes"] = parse_classes(kw["classes"])
    kw["grid"] = parse_devices(kw.pop("devices"))
    return SweepRequest(scenario, sets, policies, **kw)


def sweep(
    scenario: ScenarioArg = None,
    policy: Annotated[
        str | None,
        typer.Option(help=f"Policy preset: {', '.join(POLICY_NAMES)} (default: the scenario's, wisp)."),
    ] = None,
    classes: Annotated[
        str | None, typer.Option(help="SLO classes, e.g. 2,4,6,8 (default: the scenario's).")
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(help="Grid of N to evaluate first (LO:HI:STEP or a list), not the estimate."),
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
    stop: StopOpt = "sequential",
    search: SearchOpt = "knee",
    set_: SetOpt = None,
) -> None:
    """Capacity per SLO class for one policy: the largest N with violation rate <= epsilon."""
    pols = parse_policies(policy, "--policy") if policy is not None else []  # []: the scenario's
    req = _request(scenario, set_, pols, classes=classes, devices=devices, seeds=seeds, seed=seed,
                   epsilon=epsilon, jobs=jobs, mix=mix, start=start, max_devices=max_devices,
                   records=records, backend=backend, address=address, stop=stop, search=search)  # fmt: skip
    with reporting(f"sweep {policy or 'the scenario policy'}") as report:
        o = run_sweep(req, "sweep", out, report)
    folder, result = o.folder, o.result
    ran = ",".join(o.servers)
    cols = CAPACITY_COLUMNS if len(o.servers) == 1 else ["policy", *CAPACITY_COLUMNS]
    console.print(table(_shown(result.capacity), f"capacity ({ran}): devices per server", cols))
    _legend(o)
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
    stop: StopOpt = "sequential",
    search: SearchOpt = "knee",
    set_: SetOpt = None,
) -> None:
    """Capacity of several policies side by side, with speedup ratios."""
    pols = parse_policies(policies)
    req = _request(scenario, set_, pols, classes=classes, devices=devices, seeds=seeds, seed=seed,
                   epsilon=epsilon, jobs=jobs, mix=mix, start=start, max_devices=max_devices,
                   records=records, backend=backend, address=address, stop=stop, search=search)  # fmt: skip
    with reporting(f"compare {','.join(pols)}") as report:
        o = run_sweep(req, "compare", out, report)
    folder, wide = o.folder, o.speedups
    console.print(
        table(_shown(o.result.capacity), "capacity: devices per server", ["policy", *CAPACITY_COLUMNS])
    )
    console.print(table(wide, "capacity (devices per server) by policy"))
    _legend(o)
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
