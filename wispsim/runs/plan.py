"""``plan``: the fewest verifier replicas that keep every class of a fleet within epsilon.

``method`` picks how: ``decomposed`` sizes the cluster from one replica carrying its share of
the fleet and confirms the answer behind the real router (:mod:`wispsim.study.decompose`);
``full`` searches the replica count with the whole fleet in every simulation; ``auto`` decomposes
where that holds and says why when it falls back. Writes plan.csv (every replica count tried),
confirm.csv, replicas.csv (the load per replica at the answer), the answer's scenario and the
manifest, with the GPU cost per hour when a price is known.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wispsim.config import DeviceGroup, Scenario
from wispsim.model.prices import price_table, shipped_price
from wispsim.results import Results
from wispsim.runs.resolve import Options, check_backend, check_seeds, check_start, resolve
from wispsim.study.decompose import CONFIRM_DEVICES


@dataclass(frozen=True)
class PlanRequest:
    scenario: Path | None
    sets: list[str] | None
    fleet: tuple[DeviceGroup, ...] | None = None
    policy: str | None = None
    profile: str | None = None
    router: str | None = None
    seeds: int = 1
    seed: int | None = None
    epsilon: float | None = None
    start: int | None = None
    max_replicas: int = 1024
    method: str = "auto"
    confirm_devices: int = CONFIRM_DEVICES
    price_per_gpu_hour: float | None = None
    jobs: int = 2
    backend: str = "local"
    address: str | None = None


@dataclass
class PlanOutcome:
    folder: Path
    scenario: Scenario
    plan: Any  # study.decompose's ClusterPlan
    devices: int
    method_line: str
    first_seed: int
    gpus: int
    gpu: str
    price: float | None
    wall_s: float
    failed: str | None = None  # why no replica count was found (the folder is written)


def plan(
    req: PlanRequest, out: Path | None = None, report: Callable[[int, str], None] | None = None
) -> PlanOutcome:
    """Size the cluster for ``req`` and write its folder; ``failed`` says why when no replica
    count up to ``req.max_replicas`` keeps every class within epsilon."""
    from wispsim.model.fleet import fleet_size
    from wispsim.model.profiles import load_profile
    from wispsim.study.cluster import choose_method, plan_cluster
    from wispsim.study.replicas import with_replicas
    from wispsim.study.runners import make_runner

    folder = Results.planned(out, "plan")  # checked before any work
    if req.start is not None:
        check_start(req.start, req.max_replicas, "--start", "--max-replicas")
    check_backend(req.backend, req.address)
    opts = Options(policy=req.policy, fleet=req.fleet, profile=req.profile, router=req.router)
    sc = resolve(req.scenario, req.sets, opts).scenario
    used, fallback = choose_method(sc, req.method)  # a one-line error before any work
    eps = sc.epsilon if req.epsilon is None else req.epsilon
    first = sc.seed if req.seed is None else req.seed
    seed_list = check_seeds(first, req.seeds)
    n = fleet_size(sc)
    with folder.writing():  # the folder is incomplete until the manifest
        folder.text("scenario.yaml", sc.to_yaml())
    t0 = time.perf_counter()
    with folder.writing(), make_runner(req.backend, req.jobs, folder.path, "none", req.address) as runner:
        res = plan_cluster(
            sc,
            runner,
            seed_list,
            eps,
            method=used,
            start=req.start,
            max_replicas=req.max_replicas,
            confirm_devices=req.confirm_devices,
            progress=report or (lambda k, msg: None),
        )
    wall = time.perf_counter() - t0
    with folder.writing():
        folder.table("plan.csv", res.tried)
        if res.confirm is not None:
            folder.table("confirm.csv", res.confirm)
    prof = load_profile(sc.server.profile)
    price = req.price_per_gpu_hour if req.price_per_gpu_hour is not None else prof.price_per_gpu_hour
    price_source = "given" if req.price_per_gpu_hour is not None else "profile"
    if price is None and prof.gpu_key in price_table()["prices"]:  # the shipped public price
        shipped = shipped_price(prof.gpu_key)
        price, price_source = shipped.usd_per_gpu_hour, shipped.source
    extra: dict[str, Any] = {
        "devices": n,
        "policy": sc.policy,
        "profile": sc.server.profile,
        "router": sc.server.router,
        "seeds": seed_list,
        "epsilon": eps,
        "method": res.method,
        "fallback": fallback,  # why auto fell back to the full search (the method plan_cluster was given)
        "replicas": res.replicas,
        "devices_per_replica": res.share,
        "decomposed_replicas": res.decomposed,
        "confirmation": res.confirmation or None,
        "evaluations": res.evaluations,
        "wall_s": wall,
    }
    if res.replicas is None:
        with folder.writing():
            folder.finish(extra)
        why = f" ({'; '.join(res.notes)})" if res.notes else ""
        failed = f"plan: no replica count up to {req.max_replicas} keeps every class within {eps:g}{why}"
        return PlanOutcome(
            folder.path, sc, res, n, _method_line(used, fallback), first, 0, prof.gpu, price, wall, failed
        )
    gpus = res.replicas * prof.gpu_count
    if price is not None:
        extra["cost_per_hour"] = gpus * price
        extra["price_per_gpu_hour"] = price
        extra["price_source"] = price_source
    with folder.writing():  # manifest.json last
        folder.text("scenario-answer.yaml", with_replicas(sc, res.replicas).to_yaml())
        if res.per_replica is not None:
            folder.table("replicas.csv", res.per_replica)
        folder.finish(extra)
    return PlanOutcome(
        folder.path, sc, res, n, _method_line(used, fallback), first, gpus, prof.gpu, price, wall
    )


def _method_line(used: str, fallback: str | None) -> str:
    if fallback is not None:
        return f"method: full-cluster search (fell back: {fallback})"
    if used == "full":
        return "method: full-cluster search (--method full)"
    return "method: decomposed (one replica carrying its share of the fleet, then confirmed)"
