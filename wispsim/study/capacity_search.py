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

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from wispsim.study.points import Point, PointResult
from wispsim.study.stopping import Stopping

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
    stop: str = "none"  # the sequential rule's verdict on the point (wispsim.study.stopping.Stop.how)

    @property
    def at_knee(self) -> bool:
        """The rule could not tell this point's side of epsilon from noise in its whole window."""
        return self.stop == "undecided"


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


def per_wave(runner: Runner) -> int:
    """x values per wave: one per runner slot (a point runs all its seeds), at least one."""
    return max(1, runner.jobs)


def run_search(
    search: EdgeSearch,
    runner: Runner,
    seeds: list[int],
    point: Callable[[int], tuple[Scenario, int]],
    seen: Callable[[int, PointStats, PointResult], None],
    stopping: bool = True,
) -> int | None:
    """Run ``search`` to its answer. Each wave's x values become points (``point``: x -> the
    scenario and its devices) with every seed, stopped once their answer is known
    (:mod:`wispsim.study.stopping`; ``stopping`` False: at their horizon), all mapped on
    ``runner`` at once; ``seen`` hears each x's pooled statistics and its first seed's result,
    in the wave's order."""
    rule = Stopping(search.epsilon) if stopping else None
    while xs := search.next():
        cases = [point(x) for x in xs]
        results = runner.map([Point(sc, m, tuple(seeds), rule) for sc, m in cases])
        for x, (_, m), res in zip(xs, cases, results, strict=True):
            search.evaluated[x] = stats = pooled_stats(m, res.counts)
            stats.stop = res.stop.how
            seen(x, stats, res.seed(seeds[0]))
    return search.answer


@dataclass
class Geometric:
    """Out from a first estimate by a growing ratio: the first wave steps ``ratio``, ``ratio^2``,
    ... times the largest x seen (down: divides the smallest), and each further wave squares the
    wave's ratio (1.2, 1.44, 2.07, 4.3, ...: an estimate that is near costs a step or two, one
    that is far off only a few more), at least one step of 1."""

    ratio: float = 1.2
    waves: int = 0

    def _ratios(self, width: int) -> list[float]:
        base = self.ratio ** (2**self.waves)
        self.waves += 1
        return [base**k for k in range(1, width + 1)]

    def up(self, below: int, width: int) -> list[int]:
        return [max(math.ceil(below * r), below + k) for k, r in enumerate(self._ratios(width), 1)]

    def down(self, edge: int, width: int) -> list[int]:
        return [min(math.floor(edge / r), edge - k) for k, r in enumerate(self._ratios(width), 1)]


def crossing(below: PointStats, edge: PointStats, epsilon: float, extend: bool = False) -> float:
    """Where the violation rate crosses ``epsilon`` on the line through two evaluated N: between
    them, or (``extend``) wherever the line crosses it; NaN where the line does not rise."""
    lo, hi = below.violation, edge.violation
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return math.nan
    share = (epsilon - lo) / (hi - lo)
    if not extend:
        share = min(max(share, 0.0), 1.0)
    return below.devices + share * (edge.devices - below.devices)


class CapacitySearch(EdgeSearch):
    """The sweep's search: the largest N within epsilon for one (policy, class or class mix).

    It starts from the user's grid (then doubling out), else from ``estimate`` (the fluid
    model's, :mod:`wispsim.model.fluid`: then out by :class:`Geometric` steps), else from
    ``start`` (doubling). Inside the bracket it cuts where the violation rate crosses epsilon
    (regula falsi, held an eighth of the bracket inside each end, and a bisection whenever its
    last two cuts fell on the same side; with one end at the knee, the secant through that end
    and its nearest neighbour, just past the crossing and no farther than the bracket's middle),
    and it ends when the bracket is one apart or -- unless ``exact`` -- when it ends at the knee
    (:attr:`PointStats.at_knee`: a point whose violation rate the sequential rule could not tell
    from epsilon in its whole window; :meth:`resolved`) and is no wider than the capacity's 95%
    interval. Cutting further there would place the capacity by noise; the capacity is then
    where the rate crosses epsilon between the bracket's ends, rounded down.
    ``exact`` (``--search exact``) bisects to the integer, as earlier versions did.

    The capacity's 95% interval comes from the evaluated curve: each N's violation rate gets a
    cluster bootstrap interval (resampling devices, so that the responses of one device count as
    one unit), ``ci_low`` is the largest N at or below the capacity whose upper bound is <=
    epsilon and ``ci_high`` is one below the smallest N whose lower bound is
    > epsilon, each bound read off the line between the evaluated N on either side of where it
    crosses epsilon (the bounds move smoothly with N under common random numbers; a search that
    evaluated every N reads them at the evaluated points, as before).
    """

    def __init__(
        self, epsilon: float, start: int = 8, max_devices: int = 4096, grid: tuple[int, ...] = (),
        estimate: int | None = None, exact: bool = False,
    ) -> None:  # fmt: skip
        steps: Steps = DOUBLING
        if grid:
            first: tuple[int, ...] = grid
        elif estimate is not None and estimate >= 1:
            first, steps = (min(estimate, max_devices),), Geometric()
        else:
            first = (min(start, max_devices),)
        self.exact = exact
        self._cuts: list[int] = []
        super().__init__(
            epsilon, more_helps=False, low=1, high=max_devices, first=first, steps=steps,
            split=midpoint if exact else self._cut,
        )  # fmt: skip

    def _cut(self, below: int, edge: int, width: int) -> list[int]:
        cut = self._cut_at(below, edge)
        self._cuts.append(cut)
        return [cut]

    def _landed_alike(self) -> bool:
        """The last two cuts fell on the same side of the knee (regula falsi is creeping)."""
        if len(self._cuts) < 2 or not all(c in self.evaluated for c in self._cuts[-2:]):
            return False
        a, b = self._cuts[-2:]
        return self.turned(a) == self.turned(b)

    def _cut_at(self, below: int, edge: int) -> int:
        if self._landed_alike():  # bisect once: the interpolation keeps landing on one side
            return (below + edge) // 2
        lo, hi = self.evaluated[below], self.evaluated[edge]
        knee = lo if lo.at_knee else hi if hi.at_knee else None
        if knee is not None and not (lo.at_knee and hi.at_knee):
            # one end at the knee: the curve is steeper there than the chord to a far end says,
            # so cross by the secant through the knee point and its nearest neighbour, just past
            # it, to land on the other side of epsilon
            near = min((p for x, p in self.evaluated.items() if x != knee.devices),
                       key=lambda p: abs(p.devices - knee.devices))  # fmt: skip
            a, b = sorted((knee, near), key=lambda p: p.devices)
            x = crossing(a, b, self.epsilon, extend=True)
            if math.isfinite(x):
                # past the bracket's middle the knee's local slope is too flat to go by (the
                # curve steepens past a knee): no farther than a bisection would
                mid = (below + edge) // 2
                x = min(math.floor(x) + 1, mid) if knee is lo else max(math.ceil(x) - 1, mid)
                return min(max(x, below + 1), edge - 1)
        x = crossing(lo, hi, self.epsilon)
        if not math.isfinite(x):
            x = (below + edge) / 2
        guard = (edge - below) / 8
        x = min(max(x, below + guard), edge - guard)
        return min(max(round(x), below + 1), edge - 1)

    def resolved(self) -> bool:
        """The bracket is no wider than the capacity's 95% interval, so cutting further is noise,
        and it ends at the knee (class text): both its ends are at the knee, or one is and its
        bootstrap interval holds epsilon. (A point the rule cannot decide for want of responses
        -- a few devices, a short window -- is undecided far from epsilon too, with an interval
        clear of it: 0 violations in 21 responses. Such ends are cut on until the capacity's
        interval spans the bracket, and one of them alone ends nothing.)"""
        below, edge = self.bounds()
        if self.exact or below is None or edge is None:
            return False
        ends, eps = (self.evaluated[below], self.evaluated[edge]), self.epsilon
        knees = [p for p in ends if p.at_knee]
        if len(knees) < 2 and not any(p.ci_low <= eps <= p.ci_high for p in knees):
            return False
        low, high = self.interval(self._crossed(below, edge))
        return edge - below <= high - low + 1

    def _crossed(self, below: int, edge: int) -> int:
        """Where the violation rate crosses epsilon between the bracket's ends, rounded down."""
        x = crossing(self.evaluated[below], self.evaluated[edge], self.epsilon)
        if not math.isfinite(x):
            return below
        return min(max(math.floor(x), below), edge - 1)

    def next(self) -> list[int]:
        xs = [] if self._started and self.resolved() else super().next()
        return xs or self._anchors()

    def _anchors(self) -> list[int]:
        """Once the capacity is found: the N its 95% interval needs and the search did not
        evaluate -- a point below it whose upper bound is clear of epsilon, and one above whose
        lower bound is (a search that ends at the knee may have evaluated only points at the
        knee on one side); each a step of :class:`Geometric`'s ratio past the farthest point on
        its side, so that the bound is read off a decided point, not left at 0 or the ceiling."""
        cap, eps, ratio = self.capacity, self.epsilon, Geometric.ratio
        seen = [p for p in self.evaluated.values() if math.isfinite(p.violation)]
        xs = []
        lows = [p.devices for p in seen if p.devices <= cap]
        if cap >= 1 and lows and not any(p.devices <= cap and p.ci_high <= eps for p in seen):
            x = max(1, min(math.floor(min(lows) / ratio), min(lows) - 1))
            if x not in self.evaluated and x < min(lows):
                xs.append(x)
        highs = [p.devices for p in self.evaluated.values() if p.devices > cap]
        if not self.saturated and highs and not any(p.devices > cap and p.ci_low > eps for p in seen):
            x = min(self.high, max(math.ceil(max(highs) * ratio), max(highs) + 1))
            if x not in self.evaluated and x > max(highs):
                xs.append(x)
        return xs

    def next_devices(self) -> list[int]:
        """N values to simulate next ([] when the search is finished)."""
        return self.next()

    @property
    def capacity(self) -> int:
        below, edge = self.bounds()
        if below is None:
            return 0
        if edge is None or edge - below <= 1 or not self.resolved():
            return below
        return self._crossed(below, edge)

    @property
    def saturated(self) -> bool:
        """True when even max_devices met the target (capacity is a lower bound)."""
        return self.bounds()[1] is None

    def interval(self, cap: int | None = None) -> tuple[int, int]:
        """(ci_low, ci_high) of the capacity (class text; ``cap``: of that capacity): where the
        bootstrap bounds of the evaluated curve cross epsilon, on the line between the evaluated N
        on either side."""
        cap = self.capacity if cap is None else cap
        eps = self.epsilon
        pts = sorted(
            (p for p in self.evaluated.values() if math.isfinite(p.violation)), key=lambda p: p.devices
        )
        if not pts:
            return cap, cap
        ci_low = 0
        for a, b in zip([None, *pts], pts, strict=False):
            if b.devices > cap or b.ci_high > eps:
                if a is not None and a.ci_high <= eps and b.ci_high > eps:
                    x = a.devices + (eps - a.ci_high) / (b.ci_high - a.ci_high) * (b.devices - a.devices)
                    ci_low = max(ci_low, math.floor(x))
                break
            ci_low = b.devices
        ci_high = pts[-1].devices
        for a, b in itertools.pairwise(pts):
            if b.devices > cap and b.ci_low > eps:
                ci_high = b.devices - 1
                if a.ci_low <= eps:
                    x = a.devices + (eps - a.ci_low) / (b.ci_low - a.ci_low) * (b.devices - a.devices)
                    ci_high = min(ci_high, max(math.ceil(x) - 1, a.devices))
                break
        return min(ci_low, cap), max(ci_high, cap)
