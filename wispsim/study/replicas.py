"""The full-cluster replica search: the whole fleet against R replicas at every R tried.

``wispsim plan`` takes a fleet (``devices.groups``: devices per class, optionally per device type
and link type; or ``--fleet 2:500,4:500``), a policy and a profile, and searches the replica count
R with simulations: the whole fleet runs against R replicas behind the scenario's router, and R
is *feasible* when every class's pooled violation rate (over the seeds) is at most epsilon. The
search (:class:`~wispsim.study.capacity_search.EdgeSearch`) brackets from a starting guess
(doubling up while infeasible, halving down while feasible) and then bisects, assuming more
replicas never hurt. Every simulation is a stored point (:mod:`wispsim.study.points`), so an
interrupted plan resumes where it stopped.

At the answer it reports each replica's load (rounds per second, utilization, batch size, queue
and verify p95, cold-round share) and, when the profile has ``hardware.price_per_gpu_hour`` (or
``--price-per-gpu-hour`` is given), the cost per hour: replicas x GPUs per replica x price.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from wispsim.config import Scenario
from wispsim.model.fleet import fleet_size
from wispsim.study.capacity_search import EdgeSearch, PointStats, per_wave, run_search
from wispsim.study.points import PointResult
from wispsim.study.runners import Runner


@dataclass
class PlanResult:
    replicas: int | None  # None: not feasible up to max_replicas
    devices: int
    tried: pd.DataFrame  # one row per R evaluated
    per_replica: pd.DataFrame | None
    evaluations: int = 0
    notes: list[str] = field(default_factory=list)
    method: str = "full"  # "full": this search; "decomposed": wispsim.study.decompose
    fallback: str | None = None  # why a plan that could have decomposed ran the full search
    share: int | None = None  # decomposed: the most devices one replica serves (n*)
    decomposed: int | None = None  # decomposed: ceil(N / n*), before the confirmation
    confirmation: str = ""  # decomposed: what confirmed it (the full cluster, a slice, none)
    confirm: pd.DataFrame | None = None  # decomposed: one row per replica count confirmed


def with_replicas(scenario: Scenario, replicas: int) -> Scenario:
    srv = dataclasses.replace(scenario.server, replicas=replicas, replica_profiles=())
    return scenario.replace(server=srv)


def stats_row(stats: PointStats, **first: object) -> dict[str, object]:
    """A table row: ``first`` columns, then the worst class's rate, its CI and each class's rate."""
    return {
        **first,
        "max_violation": stats.violation,
        "ci_low": stats.ci_low,
        "ci_high": stats.ci_high,
        "responses": stats.responses,
        **{f"violation_{k}": v for k, v in stats.per_class.items()},
    }


def plan_replicas(
    scenario: Scenario,
    runner: Runner,
    seeds: list[int],
    epsilon: float,
    start: int | None = None,
    max_replicas: int = 512,
    progress: Callable[[int, str], None] | None = None,
) -> PlanResult:
    """Smallest R with every class's violation rate <= epsilon (see the module docstring).

    With ``runner.jobs`` parallel slots each wave evaluates several replica counts at once (a
    k-section search instead of bisection), so the cores are used even with one seed.
    """
    n = fleet_size(scenario)
    rows: dict[int, dict[str, object]] = {}
    replica_load: dict[int, pd.DataFrame] = {}
    width = per_wave(runner)
    r0 = min(max(1, start if start is not None else math.ceil(n / 100)), max_replicas)
    first = sorted({r0, *[max(1, r0 >> k) for k in range(1, width)]})
    search = EdgeSearch(epsilon, more_helps=True, low=1, high=max_replicas, first=first, width=width)

    def seen(r: int, st: PointStats, res: PointResult) -> None:
        rows[r] = stats_row(st, replicas=r)
        if res.replicas is not None:
            replica_load[r] = res.replicas
        if progress:
            progress(len(rows), f"R={r}: worst-class violation {st.violation:.3f}; replica counts simulated")

    best = run_search(search, runner, seeds, lambda r: (with_replicas(scenario, r), n), seen)
    table = pd.DataFrame([rows[r] for r in sorted(rows)])
    if best is None:
        return PlanResult(None, n, table, None, len(rows), [f"infeasible up to {max_replicas} replicas"])
    return PlanResult(best, n, table, replica_load.get(best), len(rows))
