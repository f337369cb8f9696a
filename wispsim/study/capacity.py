"""Capacity sweeps: the largest N per (policy, class) within epsilon, for many policies at once.

:func:`capacity_sweep` drives one :class:`~wispsim.study.capacity_search.CapacitySearch` per
(policy, group) in waves: each wave asks every unfinished search for its next N values and runs
all their points (times seeds) on a runner, in parallel. :class:`SweepResult` writes the three
tables every sweep-like command leaves behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pandas as pd

from wispsim.config import Scenario
from wispsim.results import Results
from wispsim.study.capacity_search import CapacitySearch, pooled_stats
from wispsim.study.points import Point
from wispsim.study.runners import Runner


@dataclass(frozen=True)
class Group:
    """What one capacity question puts on the server: one class alone, or a shared mix."""

    label: str
    classes: tuple[float, ...]


def groups_for(classes: Iterable[float], mix: str) -> list[Group]:
    cls = tuple(float(c) for c in classes)
    if mix == "shared":
        return [Group("mix:" + ",".join(f"{c:g}" for c in cls), cls)]
    return [Group(f"{c:g}", (c,)) for c in cls]


@dataclass
class SweepResult:
    """Capacity per (policy, class), every evaluated point, and violation pooled over seeds."""

    capacity: pd.DataFrame
    curve: pd.DataFrame
    pooled: pd.DataFrame

    def write(self, folder: Results) -> None:
        """``capacity.csv``, ``curve.csv`` and ``curve_pooled.csv`` in ``folder``. The caller
        writes the manifest after these, so a folder whose tables failed is not marked complete."""
        for name, df in (
            ("capacity.csv", self.capacity),
            ("curve.csv", self.curve),
            ("curve_pooled.csv", self.pooled),
        ):
            folder.table(name, df)


def capacity_sweep(
    base: dict[str, Scenario],
    groups: list[Group],
    seeds: list[int],
    epsilon: float,
    runner: Runner,
    grid: tuple[int, ...] = (),
    start: int = 8,
    max_devices: int = 4096,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Capacity of every (policy, group); ``base`` maps policy name -> resolved scenario."""
    searches = {
        (pol, g.label): CapacitySearch(epsilon, start=start, max_devices=max_devices, grid=grid)
        for pol in base
        for g in groups
    }
    group_of = {g.label: g for g in groups}
    curve_rows: list[pd.DataFrame] = []
    pooled_rows: list[dict[str, object]] = []
    planned = finished = 0

    def tick() -> None:
        nonlocal finished
        finished += 1
        if progress:
            progress(finished, planned)

    while True:
        wave: list[tuple[tuple[str, str], int]] = []
        for key, s in searches.items():
            wave.extend((key, n) for n in s.next_devices())
        if not wave:
            break
        points: list[Point] = []
        for (pol, label), n in wave:
            sc = base[pol].with_devices(n, group_of[label].classes)
            points.extend(Point(sc, n, seed) for seed in seeds)
        planned += len(points)
        if progress:
            progress(finished, planned)
        results = runner.map(points, tick)
        it = iter(results)
        for (pol, label), n in wave:
            counts = []
            for seed in seeds:
                r = next(it)
                summ = r.summary.rename(columns={"devices": "class_devices"})
                summ.insert(0, "seed", seed)
                summ.insert(0, "devices", n)
                summ.insert(0, "group", label)
                summ.insert(0, "policy", pol)
                summ["point"] = r.key
                curve_rows.append(summ)
                c = r.counts.copy()
                c["seed"] = seed
                counts.append(c)
            allc = pd.concat(counts, ignore_index=True)
            stats = pooled_stats(n, allc)
            searches[(pol, label)].evaluated[n] = stats
            for cls, rate in stats.per_class.items():
                pooled_rows.append(
                    {
                        "policy": pol,
                        "group": label,
                        "class": cls,
                        "devices": n,
                        "seeds": len(seeds),
                        "responses": int(allc[allc.slo == float(cls)].responses.sum()),
                        "violation_rate": rate,
                        "decision_violation": stats.violation,
                        "decision_ci_low": stats.ci_low,
                        "decision_ci_high": stats.ci_high,
                    }
                )
    cap_rows = []
    for (pol, label), s in searches.items():
        lo, hi = s.interval()
        cap_rows.append(
            {
                "policy": pol,
                "class": label,
                "capacity": s.capacity,
                "ci_low": lo,
                "ci_high": hi,
                "saturated": s.saturated,
                "evaluated": len(s.evaluated),
            }
        )
    curve = pd.concat(curve_rows, ignore_index=True) if curve_rows else pd.DataFrame()
    if not curve.empty:
        curve = curve.sort_values(["policy", "group", "class", "devices", "seed"], kind="stable")
    pooled = pd.DataFrame(pooled_rows)
    if not pooled.empty:
        pooled = pooled.sort_values(["policy", "group", "class", "devices"], kind="stable")
    return SweepResult(pd.DataFrame(cap_rows), curve.reset_index(drop=True), pooled.reset_index(drop=True))


def speedups(cap: pd.DataFrame, policies: list[str]) -> pd.DataFrame:
    """Wide table: class, capacity per policy, and ratios of the first policy to the others."""
    wide = cap.pivot(index="class", columns="policy", values="capacity").reindex(columns=policies)
    wide = wide.reset_index()
    first = policies[0]
    for p in policies[1:]:
        wide[f"{first}/{p}"] = wide[first] / wide[p].where(wide[p] > 0)
    return wide
