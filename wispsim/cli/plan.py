"""``wispsim plan``: the fewest verifier replicas that keep every class of a fleet within epsilon.

The capacity-planning answer in deployment terms: given a fleet (devices per SLO class), a
policy and a latency profile, size the cluster, print the load per replica at the answer and,
when the profile (or ``--price-per-gpu-hour``) has a price, the GPU cost per hour. ``--method``
picks how: ``decomposed`` sizes it from one replica carrying its share of the fleet and confirms
the answer behind the real router (:mod:`wispsim.study.decompose`); ``full`` searches the replica
count with the whole fleet in every simulation (:mod:`wispsim.study.replicas`); ``auto`` (the
default) decomposes where that holds and says why when it falls back.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from wispsim.cli.common import console, reporting, table
from wispsim.cli.options import (
    FRACTION_OPEN,
    NON_NEGATIVE,
    REPLICAS,
    SEEDS,
    AddressOpt,
    BackendOpt,
    FirstSeedOpt,
    JobsOpt,
    OutOpt,
    PolicyOpt,
    RouterOpt,
    ScenarioArg,
    SetOpt,
    parse_fleet,
    whole,
)
from wispsim.config.limits import MAX_DEVICES, MAX_REPLICAS
from wispsim.errors import WispsimError
from wispsim.runs.plan import PlanOutcome
from wispsim.study.decompose import CONFIRM_DEVICES


def plan(
    scenario: ScenarioArg = None,
    fleet: Annotated[
        str | None,
        typer.Option(help="Devices per class, e.g. 2:500,4:500,6:500,8:500 (default: devices.groups)."),
    ] = None,
    policy: PolicyOpt = None,
    profile: Annotated[str | None, typer.Option(help="Latency profile of every replica.")] = None,
    router: RouterOpt = None,
    seeds: Annotated[int, typer.Option(help="Seeds per replica count.", parser=SEEDS)] = 1,
    seed: FirstSeedOpt = None,
    epsilon: Annotated[
        float | None, typer.Option(help="Allowed violation rate per class.", parser=FRACTION_OPEN)
    ] = None,
    start: Annotated[
        int | None, typer.Option(help="First replica count tried (default N/100).", parser=REPLICAS)
    ] = None,
    max_replicas: Annotated[
        int, typer.Option(help="Give up above this many replicas.", parser=REPLICAS)
    ] = MAX_REPLICAS,
    method: Annotated[
        str,
        typer.Option(
            help="auto, decomposed (from one replica's share, then confirmed) or full (the whole "
            "fleet in every simulation); auto decomposes where it holds."
        ),
    ] = "auto",
    confirm_devices: Annotated[
        int,
        typer.Option(
            help="Decomposed: confirm on the full cluster up to this many devices, else on a slice "
            "of replicas this large; 0: no confirmation.",
            parser=whole(0, MAX_DEVICES, "the most devices one run may simulate"),
        ),
    ] = CONFIRM_DEVICES,
    price_per_gpu_hour: Annotated[
        float | None,
        typer.Option(
            help=(
                "GPU price in USD per GPU-hour (default: the profile's hardware.price_per_gpu_hour, "
                "else the public price in wispsim/data/gpu_prices.yaml)."
            ),
            parser=NON_NEGATIVE,
        ),
    ] = None,
    jobs: JobsOpt = 2,
    backend: BackendOpt = "local",
    address: AddressOpt = None,
    out: OutOpt = None,
    set_: SetOpt = None,
) -> None:
    """The fewest verifier replicas that keep every class of a fleet within epsilon."""
    from wispsim.runs.plan import PlanRequest
    from wispsim.runs.plan import plan as run_plan

    req = PlanRequest(
        scenario, set_, parse_fleet(fleet) if fleet is not None else None, policy, profile, router,
        seeds, seed, epsilon, start, max_replicas, method, confirm_devices, price_per_gpu_hour,
        jobs, backend, address,
    )  # fmt: skip
    with reporting("plan") as report:
        o = run_plan(req, out, lambda k, msg: report(k, None, f"plan: {msg}"))
    console.print(o.method_line)
    _print_plan(o)
    if o.failed is not None:
        raise WispsimError(o.failed)
    what = "simulations" if o.plan.method == "decomposed" else "replica counts"
    console.print(f"{o.plan.evaluations} {what} x {seeds} seed(s) in {o.wall_s:.0f} s; results: {o.folder}")


def _print_plan(o: PlanOutcome) -> None:
    """The replica counts tried, the confirmation, the load per replica and the answer."""
    res, sc, n = o.plan, o.scenario, o.devices
    title = f"{sc.policy}, {n} devices, {sc.server.profile}, router {sc.server.router}"
    if res.method == "decomposed":
        title = f"one replica's share of {n} devices: {sc.policy}, {sc.server.profile}"
    console.print(table(_violation_digits(res.tried), title))
    if res.share is not None and res.decomposed is not None:
        console.print(
            f"decomposed: one replica serves {res.share} devices of the mix; "
            f"R = ceil({n} / {res.share}) = {res.decomposed}"
        )
    if res.confirm is not None:
        console.print(table(_violation_digits(res.confirm), f"confirmation: {res.confirmation}"))
        verdicts = ", ".join(
            (
                f"R={r.replicas}"
                if r.simulated_devices == n
                else f"{r.simulated_replicas} x {r.devices_per_replica:g} devices (R={r.replicas})"
            )
            + f" {'passes' if r.ok else 'fails'} ({r.max_violation:.4f})"
            for r in res.confirm.itertuples()
        )
        console.print(f"confirmation on the {res.confirmation}: {verdicts}")
        if res.replicas != res.decomposed:
            console.print(
                f"the confirmation moved the answer from {res.decomposed} to {res.replicas} replicas"
            )
    elif res.method == "decomposed" and res.share is not None:
        console.print(f"confirmation: {res.confirmation}")
    if res.per_replica is not None:
        where = f"at R={res.replicas}"
        if res.method == "decomposed" and res.confirm is None:
            where = f"of one replica carrying {res.share} devices (R={res.replicas})"
        elif res.method == "decomposed" and not res.confirmation.startswith("full cluster"):
            where = f"on the {res.confirmation}, standing for R={res.replicas}"
        console.print(table(res.per_replica, f"per-replica load {where} (seed {o.first_seed})"))
    if o.failed is not None:
        return
    line = f"answer: {res.replicas} replicas ({o.gpus} x {o.gpu}) for {n} devices"
    if o.price is not None:
        line += f"; cost {o.gpus} GPUs x {o.price:g} USD/GPU-hour = {o.gpus * o.price:,.2f} USD per hour"
    else:
        line += (
            "; no price (no public price for this GPU in wispsim/data/gpu_prices.yaml: --price-per-gpu-hour)"
        )
    console.print(line)


def register(app: typer.Typer) -> None:
    """Mount ``plan`` on the root app."""
    app.command("plan")(plan)


def _violation_digits(df: Any) -> Any:
    """The table with ``max_violation`` printed to 4 decimals: 0.0505 fails epsilon 0.05, and
    the 3 decimals of other cells would show it as 0.050 beside ``ok False``."""
    if "max_violation" not in df:
        return df
    return df.assign(max_violation=[f"{v:.4f}" for v in df.max_violation.to_numpy(float)])
