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
    applying,
    check_backend,
    check_seeds,
    check_start,
    parse_fleet,
    whole,
)
from wispsim.config.limits import MAX_DEVICES, MAX_REPLICAS
from wispsim.errors import WispsimError
from wispsim.provenance import write_manifest
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
            help="GPU price (default: the profile's hardware.price_per_gpu_hour).", parser=NON_NEGATIVE
        ),
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
    from wispsim.sim.router import ROUTERS
    from wispsim.study.decompose import choose_method, plan_cluster
    from wispsim.study.replicas import with_replicas
    from wispsim.study.runners import make_runner

    folder = out_path(out, "plan")  # checked before any work
    groups = parse_fleet(fleet) if fleet is not None else None
    if start is not None:
        check_start(start, max_replicas, "--start", "--max-replicas")
    check_backend(backend, address)
    sc = resolve_scenario(scenario, set_)
    if policy is not None:
        sc = sc.with_policy(policy)
    if groups is not None:
        with applying("--fleet"):
            sc = sc.replace(devices=dataclasses.replace(sc.devices, groups=groups))
    srv = sc.server
    if profile is not None:
        load_profile(profile)
        with applying("--profile"):
            srv = dataclasses.replace(srv, profile=profile, replica_profiles=())
    if router is not None:
        with applying("--router"):
            ROUTERS.get(router, "--router")
            srv = dataclasses.replace(srv, router=router)
    sc = checked(sc.replace(server=srv), policy=policy, fleet=fleet, profile=profile, router=router)
    used, fallback = choose_method(sc, method)  # a one-line error before any work
    eps = sc.epsilon if epsilon is None else epsilon
    first = sc.seed if seed is None else seed
    seed_list = check_seeds(first, seeds)
    n = fleet_size(sc)
    folder = out_dir(folder, "plan")
    with output(folder) as o:  # removes an old manifest.json: the folder is incomplete until the end
        (o / "scenario.yaml").write_text(sc.to_yaml())
    if fallback is not None:
        console.print(f"method: full-cluster search (fell back: {fallback})")
    elif used == "full":
        console.print("method: full-cluster search (--method full)")
    else:
        console.print("method: decomposed (one replica carrying its share of the fleet, then confirmed)")
    t0 = time.perf_counter()
    with (
        output(folder),
        make_runner(backend, jobs, folder, "none", address) as runner,
        progress() as prog,
    ):
        task = prog.add_task(f"plan {sc.policy}, {n} devices", total=None)
        res = plan_cluster(
            sc,
            runner,
            seed_list,
            eps,
            method=used,
            start=start,
            max_replicas=max_replicas,
            confirm_devices=confirm_devices,
            progress=lambda k, msg: prog.update(task, completed=k, description=f"plan {sc.policy}: {msg}"),
        )
    wall = time.perf_counter() - t0
    with output(folder) as o:
        res.tried.to_csv(o / "plan.csv", index=False)
        if res.confirm is not None:
            res.confirm.to_csv(o / "confirm.csv", index=False)
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
    prof = load_profile(sc.server.profile)
    price = price_per_gpu_hour if price_per_gpu_hour is not None else prof.price_per_gpu_hour
    extra: dict[str, Any] = {
        "devices": n,
        "policy": sc.policy,
        "profile": sc.server.profile,
        "router": sc.server.router,
        "seeds": seed_list,
        "epsilon": eps,
        "method": res.method,
        "fallback": res.fallback,
        "replicas": res.replicas,
        "devices_per_replica": res.share,
        "decomposed_replicas": res.decomposed,
        "confirmation": res.confirmation or None,
        "evaluations": res.evaluations,
        "wall_s": wall,
    }
    if res.replicas is None:
        with output(folder) as o:
            write_manifest(o.path, extra)
        why = f" ({'; '.join(res.notes)})" if res.notes else ""
        raise WispsimError(
            f"plan: no replica count up to {max_replicas} keeps every class within {eps:g}{why}"
        )
    with output(folder) as o:
        (o / "scenario-answer.yaml").write_text(with_replicas(sc, res.replicas).to_yaml())
        if res.per_replica is not None:
            res.per_replica.to_csv(o / "replicas.csv", index=False)
    if res.per_replica is not None:
        where = f"at R={res.replicas}"
        if res.method == "decomposed" and res.confirm is None:
            where = f"of one replica carrying {res.share} devices (R={res.replicas})"
        elif res.method == "decomposed" and not res.confirmation.startswith("full cluster"):
            where = f"on the {res.confirmation}, standing for R={res.replicas}"
        console.print(table(res.per_replica, f"per-replica load {where} (seed {first})"))
    gpus = res.replicas * prof.gpu_count
    line = f"answer: {res.replicas} replicas ({gpus} x {prof.gpu}) for {n} devices"
    if price is not None:
        extra["cost_per_hour"] = gpus * price
        line += f"; cost {gpus} GPUs x {price:g}/GPU-hour = {gpus * price:,.2f} per hour"
    else:
        line += "; no price (set hardware.price_per_gpu_hour in the profile or --price-per-gpu-hour)"
    with output(folder) as o:  # manifest.json last
        write_manifest(o.path, extra)
    console.print(line)
    what = "simulations" if res.method == "decomposed" else "replica counts"
    console.print(f"{res.evaluations} {what} x {seeds} seed(s) in {wall:.0f} s; results: {folder}")


def register(app: typer.Typer) -> None:
    """Mount ``plan`` on the root app."""
    app.command("plan")(plan)


def _violation_digits(df: Any) -> Any:
    """The table with ``max_violation`` printed to 4 decimals: 0.0505 fails epsilon 0.05, and
    the 3 decimals of other cells would show it as 0.050 beside ``ok False``."""
    if "max_violation" not in df:
        return df
    return df.assign(max_violation=[f"{v:.4f}" for v in df.max_violation.to_numpy(float)])
