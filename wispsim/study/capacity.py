"""Capacity sweeps: the largest N per (policy, class) within epsilon, for many policies at once.

:func:`capacity_sweep` drives one :class:`~wispsim.study.capacity_search.CapacitySearch` per
(policy, group) on a runner, in parallel: each search asks for its next N values as soon as all
of its last ones are back, so no search waits for another's slow points (the same N values, in
the same order per search, as waves that wait for every search would give).
:class:`SweepResult` writes the three tables every sweep-like command leaves behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import pandas as pd

from wispsim.config import Scenario
from wispsim.model.fluid import FluidEstimate, fluid_capacity
from wispsim.results import Results
from wispsim.sim.scenarios import resolve_server
from wispsim.study.capacity_search import CapacitySearch, pooled_stats
from wispsim.study.lookahead import guess_next
from wispsim.study.points import Point
from wispsim.study.runners import Runner
from wispsim.study.stopping import Stopping


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
    commits: dict[str, int] = field(default_factory=dict)  # the code that computed its points

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
    progress: Callable[[int, int, str], None] | None = None,
    stopping: Stopping | None = None,
    exact: bool = False,
    also: tuple[int, ...] = (),
) -> SweepResult:
    """Capacity of every (policy, group); ``base`` maps policy name -> resolved scenario. Each N
    is one point with every seed (:class:`~wispsim.study.points.Point`), stopped by
    ``stopping`` (None: every seed to its horizon). Without a ``grid`` each search starts from
    the fluid estimate (:func:`estimate_group`); ``exact``: bisect to the integer
    (:class:`~wispsim.study.capacity_search.CapacitySearch`). ``also``: N values every search
    evaluates first besides its own (a study's light-load points), on the curve
    and in the search's bracket like any other."""
    estimates = {(pol, g.label): estimate_group(base[pol], g, epsilon) for pol in base for g in groups}
    searches = {
        key: CapacitySearch(
            epsilon,
            start=start,
            max_devices=max_devices,
            grid=grid,
            estimate=None if grid else est.devices,
            exact=exact,
        )
        for key, est in estimates.items()
    }
    group_of = {g.label: g for g in groups}
    curve_rows: list[pd.DataFrame] = []
    pooled_rows: list[dict[str, object]] = []
    flying: dict[tuple[str, str], set[int]] = {key: set() for key in searches}  # N not yet back
    answered: set[tuple[str, str]] = set()  # searches that asked for nothing more
    started = finished = 0

    def report() -> None:
        if progress:
            progress(finished, started, f"{len(answered)}/{len(searches)} capacities found")

    def ask(key: tuple[str, str], first: bool = False) -> None:
        # the search's next N values, once all of its last ones are back: each search goes on
        # as soon as its own points are (one slow search does not hold the others' next points)
        nonlocal started
        xs = searches[key].next_devices()
        if first and xs:
            xs = xs + [n for n in also if n not in xs and 1 <= n <= max_devices]
        for n in xs:
            runner.start((key, n), point(key, n))
        flying[key] = set(xs)
        started += len(xs)
        if not xs:
            answered.add(key)

    def point(key: tuple[str, str], n: int) -> Point:
        pol, label = key
        return Point(base[pol].with_devices(n, group_of[label].classes), n, tuple(seeds), stopping)

    spare = getattr(runner, "spare", None)  # a runner that cannot simulate ahead has no spare()

    def look_ahead() -> None:
        # a worker with nothing to do simulates the point a waiting search will most likely ask
        # for next (wispsim.study.lookahead: the same answers, sooner)
        for key in searches:
            if spare is None or spare() <= 0:
                return
            if key not in answered:
                try:
                    guess = guess_next(searches[key], flying[key])
                except Exception:  # a guess is only ever a head start: never a sweep's failure
                    guess = []
                for n in guess[: spare()]:
                    runner.ahead(point(key, n))

    for key in searches:
        ask(key, first=True)
    report()
    while started > finished:
        tag, r = runner.finished()
        (pol, label), n = cast(tuple[tuple[str, str], int], tag)
        finished += 1
        summ = r.summary.rename(columns={"devices": "class_devices"})
        summ.insert(0, "devices", n)
        summ.insert(0, "group", label)
        summ.insert(0, "policy", pol)
        summ["point"] = r.key
        summ["stop"] = r.stop.how
        summ["window_end_s"] = r.stop.window_end
        curve_rows.append(summ)
        allc = r.counts
        stats = pooled_stats(n, allc)
        stats.stop = r.stop.how
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
                    "stop": r.stop.how,
                    "window_end_s": r.stop.window_end,
                }
            )
        flying[(pol, label)].discard(n)
        if not flying[(pol, label)]:
            ask((pol, label))
        look_ahead()
        report()
    curve = pd.concat(curve_rows, ignore_index=True) if curve_rows else pd.DataFrame()
    cap_rows = []
    for (pol, label), s in searches.items():
        lo, hi = s.interval()
        est = estimates[(pol, label)]
        binds, headroom = binding_at(curve, pol, label, s.capacity)
        cap_rows.append(
            {
                "policy": pol,
                "profile": base[pol].server.profile,
                "class": label,
                "capacity": s.capacity,
                "ci_low": lo,
                "ci_high": hi,
                "saturated": s.saturated,
                "evaluated": len(s.evaluated),
                "estimate": est.devices,
                "estimate_binds": est.binds,
                "binds": binds,
                "headroom": headroom,
            }
        )
    if not curve.empty:
        curve = curve.sort_values(["policy", "group", "class", "devices", "seed"], kind="stable")
    pooled = pd.DataFrame(pooled_rows)
    if not pooled.empty:
        pooled = pooled.sort_values(["policy", "group", "class", "devices"], kind="stable")
    return SweepResult(pd.DataFrame(cap_rows), curve.reset_index(drop=True), pooled.reset_index(drop=True))


def binding_at(curve: pd.DataFrame, policy: str, group: str, devices: int) -> tuple[str, float]:
    """What binds the simulated runs at ``devices`` (a capacity) and its headroom
    (:mod:`wispsim.analysis.binding`), read at the simulated N nearest it from below (the search
    need not simulate the capacity itself; from above where none is below): the resource most of
    the seeds name (their ``all`` row where the group has several classes), and its mean headroom
    over them; ("", NaN) where nothing was simulated."""
    if curve.empty or "binds" not in curve:
        return "", float("nan")
    mine = curve[(curve.policy == policy) & (curve.group == group)]
    ns = sorted(set(mine.devices))
    if not ns:
        return "", float("nan")
    below = [n for n in ns if n <= devices]
    at = mine[mine.devices == (below[-1] if below else ns[0])]
    if "all" in set(at["class"].astype(str)):
        at = at[at["class"].astype(str) == "all"]
    if at.empty:
        return "", float("nan")
    binds = str(at.binds.mode().iloc[0])
    return binds, float(at[at.binds == binds].headroom.mean())


def server_text(scenario: Scenario) -> str:
    """What one capacity is per, in words: its server's replicas, GPUs and model (the profile's),
    e.g. ``one NVIDIA A100 80GB SXM verifying Qwen/Qwen3-32B (bf16, profile a100-qwen3-32b)``."""
    from wispsim.model.profiles import load_profile

    srv = scenario.server
    role = "verifying" if srv.mode == "speculative" else "generating"
    parts = []
    for name in dict.fromkeys(srv.replica_profiles or (srv.profile,)):
        p = load_profile(name)
        gpus = f"{p.gpu_count} x {p.gpu}" if p.gpu_count > 1 else p.gpu
        parts.append(f"{gpus} {role} {p.model.name} ({p.precision}, profile {p.name})")
    count = len(srv.replica_profiles) or srv.replicas
    text = ("one replica: " if count == 1 else f"{count} replicas: ") + "; ".join(parts)
    if srv.mode == "speculative":
        from wispsim.config.builds import effective_build

        text += f"; verifier build {effective_build(srv, scenario.policy)} (server.build)"
    if srv.engine.attention_backend:
        text += f"; attention backend {srv.engine.attention_backend}"
    return text


def estimate_group(scenario: Scenario, group: Group, epsilon: float) -> FluidEstimate:
    """The fluid model's capacity (:mod:`wispsim.model.fluid`) of one replica of ``scenario``'s
    first profile for ``group``: one class's, or a mix's -- the smallest of its classes' own. The
    classes of a mix share one server: a closed-loop device loads it about alike whatever its
    class, and a response waits in one queue for a slot or KV, so the tightest class's tail
    binds at about the devices it binds alone (the shipped mixes: 80 against 78 for WISP on
    Qwen3-32B on an A100; the harmonic mean of the classes' estimates, which splits the server
    between them, read 121)."""
    resolved = resolve_server(scenario)
    per = [
        fluid_capacity(scenario, slo, resolved.profiles[0], resolved.capacities[0], epsilon)
        for slo in group.classes
    ]
    return min(per, key=lambda e: e.devices)


def speedups(cap: pd.DataFrame, policies: list[str]) -> pd.DataFrame:
    """Wide table: class, capacity per policy, and ratios of the first policy to the others."""
    wide = cap.pivot(index="class", columns="policy", values="capacity").reindex(columns=policies)
    wide = wide.reset_index()
    first = policies[0]
    for p in policies[1:]:
        wide[f"{first}/{p}"] = wide[first] / wide[p].where(wide[p] > 0)
    return wide
