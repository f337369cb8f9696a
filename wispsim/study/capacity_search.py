"""Capacity search: where the violation rate pooled over seeds crosses epsilon (SPEC 7).

Every sizing question in wispsim is one search over an integer x: the largest N one server carries
(``wispsim sweep``), the fewest replicas R a fleet needs (``wispsim plan``), the most devices one
replica serves and the replica count that confirms it (``plan --method decomposed``). At each x the
caller simulates one point per seed, with the same seeds at every x (common random numbers: device
i draws the same streams whatever x is). x is *feasible* when the violation rate pooled over the
seeds' responses is at most epsilon for every class. Feasibility is assumed to turn once as x
grows: more devices never help, more replicas never hurt.

:class:`EdgeSearch` finds where it turns, in waves of x values that run at once: a first wave the
caller picks, then steps out from it until the turn is bracketed (:class:`Doubling` from zero,
:class:`Gallop` from a guess), then cuts the bracket (:func:`k_section`, or :func:`midpoint` for
plain bisection) until no x lies between the last x before the turn and the first x after it.
:func:`run_search` drives one search on a runner; :class:`CapacitySearch` is the sweep's search,
many of which :func:`wispsim.study.capacity.capacity_sweep` drives at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from wispsim.study.points import Point, PointResult

if TYPE_CHECKING:
    from wispsim.config import Scenario
    from wispsim.study.runners import Runner

BOOTSTRAP = 1000


@dataclass
class PointStats:
    """Violation at one x, pooled over seeds; per class for a mix."""

    devices: int
    violation: float  # the decision statistic: max over classes of the pooled rate
    ci_low: float
    ci_high: float
    per_class: dict[str, float]
    responses: int


def pooled_stats(devices: int, counts: pd.DataFrame, seed: int = 0) -> PointStats:
    """Pooled violation with a device-cluster bootstrap interval.

    ``counts`` has one row per (seed, device): columns slo, violated, responses.
    """
    if counts.empty or counts.responses.sum() == 0:
        return PointStats(devices, float("nan"), float("nan"), float("nan"), {}, 0)
    rng = np.random.default_rng(seed)
    per_class: dict[str, float] = {}
    boot_max = np.full(BOOTSTRAP, -np.inf)
    point = -np.inf
    for slo, g in counts.groupby("slo", sort=True):
        v = g.violated.to_numpy(float)
        n = g.responses.to_numpy(float)
        rate = v.sum() / n.sum() if n.sum() else float("nan")
        per_class[f"{slo:g}"] = float(rate)
        point = max(point, rate)
        idx = rng.integers(0, len(g), size=(BOOTSTRAP, len(g)))
        with np.errstate(invalid="ignore", divide="ignore"):
            boot = v[idx].sum(axis=1) / n[idx].sum(axis=1)
        boot_max = np.maximum(boot_max, np.nan_to_num(boot, nan=0.0))
    lo, hi = np.quantile(boot_max, [0.025, 0.975])
    return PointStats(devices, float(point), float(lo), float(hi), per_class, int(counts.responses.sum()))


def pooled_over_seeds(devices: int, results: list[PointResult], seeds: list[int]) -> PointStats:
    """Violation statistics of one configuration pooled over its seeds' points."""
    counts = pd.concat(
        [r.counts.assign(seed=s) for r, s in zip(results, seeds, strict=True)], ignore_index=True
    )
    return pooled_stats(devices, counts)


def feasible(violation: float, epsilon: float) -> bool:
    """Within the target: a measured violation rate (not NaN: no responses) at most epsilon."""
    return not math.isnan(violation) and violation <= epsilon


class Steps(Protocol):
    """How a search steps out from what it has seen until the turn is bracketed."""

    def up(self, below: int, width: int) -> list[int]:
        """``width`` x values above ``below``: the largest x seen, while none is past the turn."""
        ...

    def down(self, edge: int, width: int) -> list[int]:
        """``width`` x values below ``edge``: the smallest x seen, while all are past the turn."""
        ...


@dataclass(frozen=True)
class Doubling:
    """Out from zero: up to 2, 4, 8, ... times the largest x seen, down to 1/2, 1/4, ... of the
    smallest (rounded down)."""

    def up(self, below: int, width: int) -> list[int]:
        return [max(below << k, below + 1) for k in range(1, width + 1)]

    def down(self, edge: int, width: int) -> list[int]:
        return [edge >> k for k in range(1, width + 1)]


@dataclass(frozen=True)
class Gallop:
    """Out from a guess ``x0`` (a first wave of x0 - 1 and x0): steps of 1, 2, 4, ... times the
    distance covered so far, so a good guess costs few simulations and a bad one few more."""

    x0: int

    def up(self, below: int, width: int) -> list[int]:
        step = max(1, below - self.x0 + 1)
        return [below + step * 2**i for i in range(width)]

    def down(self, edge: int, width: int) -> list[int]:
        step = max(1, self.x0 - edge + 1)
        return [edge - step * 2**i for i in range(width)]


Split = Callable[[int, int, int], list[int]]


def k_section(below: int, edge: int, width: int) -> list[int]:
    """``width`` x values (fewer in a narrow bracket) cutting (below, edge) into equal parts,
    rounded half to even."""
    k = min(width, edge - below - 1)
    return [below + round((edge - below) * (i + 1) / (k + 1)) for i in range(k)]


def midpoint(below: int, edge: int, width: int) -> list[int]:
    """Plain bisection: the middle of (below, edge), rounded down, whatever the width."""
    return [(below + edge) // 2]


DOUBLING = Doubling()


@dataclass
class EdgeSearch:
    """Where feasibility turns on the integers [low, high], one wave of x values at a time.

    ``more_helps`` says which way it turns: True when a larger x is easier (replicas), so the
    answer is the smallest feasible x; False when it is harder (devices), so the answer is the
    largest. ``first`` is the first wave, run as given. Later waves step out with ``steps``
    (held inside [low, high]) and cut the bracket with ``split``, ``width`` x values a wave. The
    caller fills ``evaluated`` with each x's pooled statistics before asking for the next wave.
    """

    epsilon: float
    more_helps: bool
    low: int
    high: int
    first: Sequence[int]
    width: int = 1
    steps: Steps = DOUBLING
    split: Split = k_section
    evaluated: dict[int, PointStats] = field(default_factory=dict)
    _started: bool = field(default=False, init=False, repr=False)

    def turned(self, x: int) -> bool:
        """Whether ``x`` lies past the turn: feasible where more helps, infeasible where it hurts."""
        return feasible(self.evaluated[x].violation, self.epsilon) == self.more_helps

    def bounds(self) -> tuple[int | None, int | None]:
        """(the largest x seen below the edge, the edge: the smallest x seen past the turn),
        scanning upwards; None where none is known."""
        edge = min((x for x in self.evaluated if self.turned(x)), default=None)
        below = max(
            (x for x in self.evaluated if not self.turned(x) and (edge is None or x < edge)), default=None
        )
        return below, edge

    @property
    def answer(self) -> int | None:
        """The feasible x next to the turn (None: none seen on that side)."""
        below, edge = self.bounds()
        return edge if self.more_helps else below

    def next(self) -> list[int]:
        """The x values to simulate next, in order ([] when the search is finished). Steps and cuts
        land strictly inside the open bracket, so never on an x already evaluated."""
        if not self._started:
            self._started = True
            todo = [x for x in self.first if x not in self.evaluated]
            if todo:
                return todo
        below, edge = self.bounds()
        if edge is None:
            if below is None or below >= self.high:
                return []
            xs = [min(x, self.high) for x in self.steps.up(below, self.width)]
        elif below is None:
            if edge <= self.low:
                return []
            xs = [max(x, self.low) for x in self.steps.down(edge, self.width)]
        elif edge - below <= 1:
            return []
        else:
            xs = self.split(below, edge, self.width)
        return sorted(set(xs))


def per_wave(runner: Runner, seeds: list[int]) -> int:
    """x values per wave: as many as the runner's slots hold with every seed, at least one."""
    return max(1, runner.jobs // len(seeds))


def run_search(
    search: EdgeSearch,
    runner: Runner,
    seeds: list[int],
    point: Callable[[int], tuple[Scenario, int]],
    seen: Callable[[int, PointStats, PointResult], None],
) -> int | None:
    """Run ``search`` to its answer. Each wave's x values become points (``point``: x -> the
    scenario and its devices) times ``seeds``, all mapped on ``runner`` at once; ``seen`` hears
    each x's pooled statistics and its first seed's result, in the wave's order."""
    while xs := search.next():
        cases = [point(x) for x in xs]
        results = runner.map([Point(sc, m, s) for sc, m in cases for s in seeds])
        for i, (x, (_, m)) in enumerate(zip(xs, cases, strict=True)):
            mine = results[i * len(seeds) : (i + 1) * len(seeds)]
            search.evaluated[x] = stats = pooled_over_seeds(m, mine, seeds)
            seen(x, stats, mine[0])
    return search.answer


class CapacitySearch(EdgeSearch):
    """The sweep's search: the largest N within epsilon for one (policy, class or class mix), one
    N a wave. The user's grid runs first, else ``start``; then doubling and bisection.

    The capacity's 95% interval comes from the evaluated curve: each N's violation rate gets a
    cluster bootstrap interval (resampling devices, so that the responses of one device count as
    one unit), ``ci_low`` is the largest evaluated N at or below the capacity whose upper bound
    is <= epsilon and ``ci_high`` is one below the smallest evaluated N whose lower bound is
    > epsilon.
    """

    def __init__(
        self, epsilon: float, start: int = 8, max_devices: int = 4096, grid: tuple[int, ...] = ()
    ) -> None:
        first = grid or (min(start, max_devices),)
        super().__init__(epsilon, more_helps=False, low=1, high=max_devices, first=first, split=midpoint)

    def next_devices(self) -> list[int]:
        """N values to simulate next ([] when the search is finished)."""
        return self.next()

    @property
    def capacity(self) -> int:
        return self.answer or 0

    @property
    def saturated(self) -> bool:
        """True when even max_devices met the target (capacity is a lower bound)."""
        return self.bounds()[1] is None

    def interval(self) -> tuple[int, int]:
        cap = self.capacity
        pts = sorted(self.evaluated.values(), key=lambda p: p.devices)
        lows = [p.devices for p in pts if p.devices <= cap and p.ci_high <= self.epsilon]
        ci_low = max(lows, default=0)
        highs = [p.devices for p in pts if p.devices > cap and p.ci_low > self.epsilon]
        ci_high = min(highs) - 1 if highs else max(p.devices for p in pts)
        return ci_low, max(ci_high, cap)
