"""Capacity search: the largest N whose violation rate is at most epsilon (SPEC 7).

For one (policy, class or class mix) a :class:`CapacitySearch` decides which N to simulate next:
a bracket (a grid given by the user, else doubling from a start value) and then bisection over
integers between the largest N that met the target and the smallest that did not. Every N is run
with the same seeds (common random numbers: device i draws the same streams whatever N is), and
the decision at N uses the violation rate pooled over the seeds' measured responses.

The capacity's 95% interval comes from the evaluated curve: each N's violation rate gets a cluster
bootstrap interval (resampling devices, so that the responses of one device count as one unit),
``ci_low`` is the largest evaluated N at or below the capacity whose upper bound is <= epsilon and
``ci_high`` is one below the smallest evaluated N whose lower bound is > epsilon.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

BOOTSTRAP = 1000


@dataclass
class PointStats:
    """Violation at one N, pooled over seeds; per class for a mix."""

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


@dataclass
class CapacitySearch:
    """Bracket-and-bisect state for one capacity question."""

    epsilon: float
    start: int = 8
    max_devices: int = 4096
    grid: tuple[int, ...] = ()
    evaluated: dict[int, PointStats] = field(default_factory=dict)
    _grid_done: bool = False

    def ok(self, n: int) -> bool:
        v = self.evaluated[n].violation
        return bool(np.isfinite(v) and v <= self.epsilon)

    def bounds(self) -> tuple[int, int | None]:
        """(largest N known to meet epsilon, smallest N known not to), scanning upwards."""
        bad = min((n for n in self.evaluated if not self.ok(n)), default=None)
        ok = max((n for n in self.evaluated if self.ok(n) and (bad is None or n < bad)), default=0)
        return ok, bad

    def next_devices(self) -> list[int]:
        """N values to simulate next ([] when the search is finished)."""
        if self.grid and not self._grid_done:
            self._grid_done = True
            todo = [n for n in self.grid if n not in self.evaluated]
            if todo:
                return todo
        if not self.evaluated:
            return [min(self.start, self.max_devices)]
        ok, bad = self.bounds()
        if bad is None:
            if ok >= self.max_devices:
                return []
            return [min(max(ok * 2, ok + 1), self.max_devices)]
        if bad - ok <= 1:
            return []
        return [(ok + bad) // 2]

    @property
    def capacity(self) -> int:
        return self.bounds()[0]

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
