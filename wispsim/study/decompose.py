"""Decomposed cluster sizing: size a fleet from simulations of one replica carrying its share.

Behind the ``affinity`` router a response stays on the replica that took its first round, and each
replica has its own queue, KV memory and prefix cache. With closed-loop devices or Poisson sessions
the replicas are then separate queues, each carrying about N/R of the fleet. So the fleet can be
sized from simulations of *one* replica. Find the largest number of devices n* that one replica
serves with every class's pooled violation rate (over the seeds) at most epsilon, with the capacity
search (:class:`~wispsim.study.capacity_search.EdgeSearch`). The answer is then R = ceil(N / n*).
Each simulation is one replica and n* devices, instead of the whole fleet against R replicas, so
the cost does not grow with N.

**A replica's share.** The n devices of a share are a proportional sample of the fleet's groups
(class x device type x link), apportioned by :func:`share_counts`. Every group with devices gets at
least one, since a class absent from the share would never be checked. The rest go by largest
remainder. With a Poisson fleet the share's arrival rate is ``arrivals.rate`` x n / N.

**What the router really does.** ``affinity`` places each *response*, not each device, on the
replica with the least outstanding work when its first round arrives (:mod:`wispsim.sim.router`).
So no device belongs to a replica, and no replica holds exactly its share. R = ceil(N / n*) makes
N/R <= n*, and n* is a whole number, so an even split (at most ceil(N/R) devices per replica)
would stay within what one replica was shown to serve. The router does not split evenly. Its
"outstanding work" is the replica's running batch and queue. It does not count responses
between rounds (drafting, on the network), nor, under KV admission control (``wisp``), responses
waiting for admission. So the number of responses on each replica drifts apart. Measured on
fleet-2000 under ``wisp``: 5 replicas at 80 devices each held 67-125 responses apiece over time,
and one of them violated 15% of its class-8 responses. One replica alone at 80 devices violated
none. The one-replica answer is therefore a lower bound on R with this router, and the
confirmation decides. Without admission control (``wisp-lru``) the two agreed on fleet-2000: one
replica serves 89 devices, and the full cluster passes at ceil(2000 / 89) = 23 and fails at 22.

**Confirmation.** The decomposed answer is then simulated behind the real router, starting at R
and R - 1 and searching from there (the same search, galloping away from R, then bisecting) to
the edge between failing and passing. This runs on the whole cluster if the fleet has at most
``confirm_devices`` devices, and the full cluster's smallest passing R is the answer. Larger
fleets are confirmed on a *slice*: k replicas carrying k shares, as many as fit in
``confirm_devices``. The slice search finds the most devices per replica, x, that k routed
replicas serve, and the answer is ceil(N / x). A slice measures the router's imbalance among k
replicas, not among all R.

The decomposition holds only where replicas are separate queues
(:func:`wispsim.study.cluster.decomposition_blocker` says why it does not hold otherwise: a
router that moves rounds between replicas, a time-varying load, replicas with their own
profiles); there :func:`wispsim.study.cluster.plan_cluster` runs the full-cluster search
(:func:`wispsim.study.replicas.plan_replicas`) instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import pandas as pd

from wispsim.config import Scenario
from wispsim.model.fleet import fleet_size
from wispsim.study.capacity_search import EdgeSearch, Gallop, PointStats, feasible, per_wave, run_search
from wispsim.study.points import PointResult
from wispsim.study.replicas import PlanResult, stats_row, with_replicas
from wispsim.study.runners import Runner

CONFIRM_DEVICES = 1000  # default: the largest confirmation simulation, in devices

Progress = Callable[[int, str], None]


def share_counts(counts: Sequence[int], n: int) -> list[int]:
    """``n`` devices apportioned over groups of ``counts`` devices in proportion.

    Every group with devices gets at least one (``n`` must be at least their number). The rest go
    by largest remainder (Hamilton's method), ties to the earlier group. Where every group's quota
    c * n / N is at least 1, each count is its quota rounded down or up. A group whose quota is
    below 1 gets 1, and the groups with the smallest remainders give the extra devices back.
    Exact integer arithmetic, so the result is deterministic.
    """
    total = sum(counts)
    groups = [i for i, c in enumerate(counts) if c > 0]
    if not groups or not len(groups) <= n:
        raise ValueError(f"{n} devices cannot hold one of each of {len(groups)} groups")
    out = [max(1, c * n // total) if c > 0 else 0 for c in counts]

    def over(i: int) -> int:  # (count - quota) x total, exactly
        return out[i] * total - counts[i] * n

    while sum(out) < n:  # the largest remainder (the furthest below its quota) first
        out[min(groups, key=lambda i: (over(i), i))] += 1
    while sum(out) > n:  # forced ones pushed the total over: the furthest above its quota gives one
        out[max((i for i in groups if out[i] > 1), key=lambda i: (over(i), -i))] -= 1
    return out


def _groups_of(scenario: Scenario) -> int:
    """How many kinds of device the fleet has: non-empty groups, else classes."""
    dev = scenario.devices
    return sum(1 for g in dev.groups if g.count > 0) if dev.groups else len(dev.classes)


def share_scenario(scenario: Scenario, devices: int, replicas: int = 1) -> Scenario:
    """``replicas`` replicas carrying ``devices`` devices: a proportional sample of the fleet
    (:func:`share_counts`), and with Poisson sessions the same share of the arrival rate."""
    n = fleet_size(scenario)
    dev = scenario.devices
    if dev.groups:
        counts = share_counts([g.count for g in dev.groups], devices)
        groups = tuple(dataclasses.replace(g, count=c) for g, c in zip(dev.groups, counts, strict=True))
        dev = dataclasses.replace(dev, groups=groups)
    else:
        dev = dataclasses.replace(dev, count=devices)
    sc = with_replicas(scenario.replace(devices=dev), replicas)
    if sc.arrivals.process == "poisson":
        sc = sc.replace(arrivals=dataclasses.replace(sc.arrivals, rate=sc.arrivals.rate * devices / n))
    return sc


def largest_share(
    scenario: Scenario,
    runner: Runner,
    seeds: list[int],
    epsilon: float,
    start: int,
    least: int,
    progress: Progress | None = None,
) -> tuple[int | None, pd.DataFrame, dict[int, PointResult]]:
    """The largest share n in [least, N] one replica serves within epsilon (None: not even
    ``least``), the table of shares tried, and each share's first-seed result.

    Brackets from ``start`` (halving down while infeasible, doubling up while feasible) and then
    narrows with ``runner.jobs // len(seeds)`` shares per wave, assuming more devices never help.
    """
    n_all = fleet_size(scenario)
    rows: dict[int, dict[str, object]] = {}
    first: dict[int, PointResult] = {}
    width = per_wave(runner)
    n0 = min(max(start, least), n_all)
    wave = sorted({min(max(c, least), n_all) for c in [n0, *[n0 >> k for k in range(1, width)]]})
    search = EdgeSearch(epsilon, more_helps=False, low=least, high=n_all, first=wave, width=width)

    def seen(n: int, st: PointStats, res: PointResult) -> None:
        rows[n] = stats_row(st, devices_per_replica=n, implied_replicas=math.ceil(n_all / n))
        first[n] = res
        if progress:
            progress(len(rows), f"one replica, {n} devices: worst class {st.violation:.3f}")

    share = run_search(search, runner, seeds, lambda n: (share_scenario(scenario, n), n), seen)
    return share, pd.DataFrame([rows[n] for n in sorted(rows)]), first


def confirm(
    scenario: Scenario,
    runner: Runner,
    seeds: list[int],
    epsilon: float,
    share: int,
    least: int,
    slice_replicas: int | None,
    max_replicas: int,
    progress: Progress | None = None,
    done: int = 0,
) -> tuple[int | None, pd.DataFrame, PointResult | None]:
    """The decomposed answer simulated behind the real router (see the module docstring): the
    replica count it confirms (None: none up to ``max_replicas``), one row per simulation, and
    the first seed's result at that count.

    The whole cluster (``slice_replicas`` None) at R = ceil(N / ``share``) and R - 1, then the
    smallest passing R next to them (galloping away, then narrowing). A slice: ``slice_replicas``
    replicas carrying ``share`` and ``share`` + 1 devices each, then the most devices per replica
    that pass next to them, walked as x = -devices per replica; the answer is ceil(N / that).
    """
    n = fleet_size(scenario)
    rows: dict[int, dict[str, object]] = {}
    first: dict[int, PointResult] = {}

    def case(x: int) -> tuple[Scenario, int, int]:
        """(scenario, devices, replicas of the cluster it stands for) at walk position ``x``."""
        if slice_replicas is None:
            return with_replicas(scenario, x), n, x
        per = -x  # a slice walks over devices per replica, downwards
        return (
            share_scenario(scenario, slice_replicas * per, slice_replicas),
            slice_replicas * per,
            math.ceil(n / per),
        )

    def seen(x: int, st: PointStats, res: PointResult) -> None:
        sc, m, r = case(x)
        k = sc.server.replicas
        rows[x] = stats_row(
            st, replicas=r, simulated_replicas=k, simulated_devices=m, devices_per_replica=round(m / k, 2)
        )
        rows[x]["ok"] = feasible(st.violation, epsilon)
        first[x] = res
        if progress:
            what = f"R={r}" if slice_replicas is None else f"{k} replicas x {m // k} devices"
            progress(done + len(rows), f"confirm {what}: worst class {st.violation:.3f}")

    if slice_replicas is None:
        x0, lo, hi = math.ceil(n / share), 1, max_replicas
    else:
        x0, lo, hi = -share, -n, -max(least, math.ceil(n / max_replicas))
    search = EdgeSearch(
        epsilon,
        more_helps=True,
        low=lo,
        high=hi,
        first=[x for x in (x0 - 1, x0) if lo <= x <= hi],
        width=per_wave(runner),
        steps=Gallop(x0),
    )
    x = run_search(search, runner, seeds, lambda x: case(x)[:2], seen)
    table = pd.DataFrame([rows[y] for y in sorted(rows, key=lambda y: case(y)[1:])])
    if x is None:
        return None, table, None
    return case(x)[2], table, first[x]


def plan_decomposed(
    scenario: Scenario,
    runner: Runner,
    seeds: list[int],
    epsilon: float,
    start: int | None = None,
    max_replicas: int = 512,
    confirm_devices: int = CONFIRM_DEVICES,
    progress: Progress | None = None,
) -> PlanResult:
    """Size the cluster from one replica's share, then confirm (see the module docstring)."""
    n = fleet_size(scenario)
    kinds = _groups_of(scenario)
    least = max(kinds, math.ceil(n / max_replicas))
    r0 = max(1, start if start is not None else math.ceil(n / 100))
    share, tried, first = largest_share(scenario, runner, seeds, epsilon, math.ceil(n / r0), least, progress)
    res = PlanResult(None, n, tried, None, len(tried), method="decomposed", share=share)
    if share is None:
        what = "one of each kind of device" if least == kinds else "N / --max-replicas"
        res.notes.append(f"one replica cannot serve {least} devices ({what})")
        if scenario.arrivals.process == "poisson":  # a share is n / N of the rate: N sets the grain
            res.notes.append(f"a share is n / {n} of arrivals.rate: more devices, or --method full")
        return res
    res.replicas = res.decomposed = math.ceil(n / share)
    res.per_replica = first[share].replicas
    if confirm_devices <= 0:
        res.confirmation = "none (--confirm-devices 0)"
        return res
    slice_replicas = None
    res.confirmation = f"full cluster ({n} devices)"
    if n > confirm_devices:
        slice_replicas = max(2, confirm_devices // (share + 1))
        res.confirmation = f"slice of {slice_replicas} replicas behind the {scenario.server.router} router"
    answer, res.confirm, at = confirm(
        scenario, runner, seeds, epsilon, share, least, slice_replicas, max_replicas, progress, len(tried)
    )
    res.evaluations += len(res.confirm)
    res.replicas = answer
    if at is not None:
        res.per_replica = at.replicas
    return res
