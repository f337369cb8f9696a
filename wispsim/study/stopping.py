"""Sequential stopping: end a capacity point once its answer is known (SPEC 7).

A capacity search asks one question of each point: is its violation rate, pooled over its seeds'
responses, within epsilon? Far from the knee the answer is plain long before the horizon
(``warmup_s + duration_s`` and the drain); at the knee it takes the whole window. So the seeds
of a point run together, in steps of simulated time (:func:`run_together`, on
:class:`wispsim.sim.simulation.Run`), and after each step the rule looks at the responses that
are already decided:

- **A window with nothing missing.** At time ``t`` each seed's run knows the verdict of every
  measured response that started before its :meth:`~wispsim.sim.simulation.Run.complete_until`
  (finished, or already past the time it could meet its SLO); the point's window is
  ``[warmup_s, t_c)``, ``t_c`` the earliest of those over the seeds. Responses that are still
  running are never guessed at: the slow ones are the ones that violate, and counting only the
  finished would bias the rate down.
- **An interval that clears epsilon.** Per class, the violation rate over that window with a
  Wilson interval at ``z`` (default 3: about 0.3% two-sided per look, so that the dozen or two
  looks of a point keep the chance of stopping on the wrong side small); its sample size is the
  responses over the design effect of their devices (a device's responses are correlated; the
  effect is estimated from the responses as in a cluster-sampled ratio, at least 1). The point is
  *feasible* when every class's upper bound is at most epsilon, *infeasible* when some class's
  lower bound is above it.
- **At the knee, optionally no longer than it pays.** Past ``futility`` of the window (off by
  default; 0.5: half), a
  point whose rates, over the whole window, would still give an interval that holds epsilon --
  the whole window's and its later half's alike -- stops *undecided*: running on to the horizon
  would not place it on either side, only cost the most expensive points of a search (the
  knee's, which also wait out the drain of their slowest responses). The capacity search treats
  it as any knee point, so the capacity lies between two such points. Measured on the
  4-policy compare it saves 13% of the CPU and moves knee capacities by 1-3% (fewer responses
  at the points that place the capacity), so no sweep turns it on yet.
- **A guard against a transient.** The window must span ``min_window`` of ``duration_s``
  (default a quarter), and its later half alone must clear epsilon the same way: a queue that is
  still building up (KV memory filling, a backlog growing) shows in the later half first.

When the rule decides, every seed's run is cut at ``t_c``
(:meth:`~wispsim.sim.simulation.Run.cut`): it then measures exactly the responses, with the same
verdicts, that a run whose window closed at ``t_c`` measures, so the stored point is an ordinary
point with a shorter window. When it never decides, the runs go to their horizon and the point
is the one a plain run gives (the same records, to the bit): the horizon is a cap, not a cost.
Seeds stop together, on one window, so common random numbers keep pairing them across N.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

FEASIBLE, INFEASIBLE, UNDECIDED, UNRULED = "feasible", "infeasible", "undecided", "none"


@dataclass(frozen=True)
class Stopping:
    """The sequential rule (module text): ``epsilon`` the target, ``z`` the interval's width in
    standard errors, ``min_window`` the share of ``duration_s`` a decision needs at least,
    ``check_s`` simulated seconds between looks, ``futility`` the share of it after which a point
    whose interval would still hold epsilon at the horizon stops, at the knee (None: never)."""

    epsilon: float
    z: float = 3.0
    min_window: float = 0.25
    check_s: float = 5.0
    futility: float | None = None

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Stop:
    """How a point ended: ``how`` the rule's verdict (feasible, infeasible; undecided: its
    interval still held epsilon at the horizon, the point is at the knee; none: no rule), its
    window closed at ``window_end``, ``early`` before the horizon."""

    how: str
    window_end: float
    early: bool = False

    @property
    def decided(self) -> bool:
        """The rule told the point's side of epsilon apart from noise."""
        return self.how in (FEASIBLE, INFEASIBLE)


def wilson(rate: float, n: float, z: float) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``rate`` seen in ``n`` (possibly effective,
    fractional) trials."""
    if n <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = (rate + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(max(rate * (1 - rate), 0.0) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def class_interval(
    cluster: np.ndarray, violated: np.ndarray, z: float, scale: float = 1.0
) -> tuple[float, float, int]:
    """(low, high, responses) of one class's violation rate: responses ``violated`` (bool), each
    from the device ``cluster`` (an id per seed and device). The sample size is the responses over
    the design effect of a cluster-sampled ratio (at least 1; 1 where no violation or no success
    is seen, since then it cannot be estimated), times ``scale`` (> 1: the interval the same rate
    would have over a window ``scale`` times longer)."""
    n = len(violated)
    if n == 0:
        return 0.0, 1.0, 0
    v = violated.astype(float)
    rate = float(v.mean())
    _, idx = np.unique(cluster, return_inverse=True)
    per_v = np.bincount(idx, weights=v)
    per_n = np.bincount(idx).astype(float)
    m = len(per_n)
    deff = 1.0
    if 0.0 < rate < 1.0 and m > 1:
        var_cluster = m / (m - 1) * float(np.sum((per_v - rate * per_n) ** 2)) / (n * n)
        deff = max(1.0, var_cluster / (rate * (1 - rate) / n))
    low, high = wilson(rate, scale * n / deff, z)
    return low, high, n


def verdict(rows: np.ndarray, epsilon: float, z: float, scale: float = 1.0) -> str | None:
    """FEASIBLE, INFEASIBLE or None (undecided) for ``rows`` of (cluster, SLO, violated);
    ``scale``: as the same rates would read over a window that many times longer."""
    if len(rows) == 0:
        return None
    cluster, slo, bad = rows[:, 0], rows[:, 1], rows[:, 2].astype(bool)
    highs, lows = [], []
    for s in np.unique(slo):
        sel = slo == s
        low, high, _ = class_interval(cluster[sel], bad[sel], z, scale)
        lows.append(low)
        highs.append(high)
    if max(lows) > epsilon:
        return INFEASIBLE
    if max(highs) <= epsilon:
        return FEASIBLE
    return None


class Stepped(Protocol):
    """A run :func:`run_together` can step (:class:`wispsim.sim.simulation.Run`)."""

    @property
    def ended(self) -> bool: ...

    def advance(self, until: float) -> bool: ...

    def complete_until(self) -> float: ...

    def decided_before(self, t: float) -> list[tuple[float, int, float, bool]]: ...

    def cut(self, t: float) -> None: ...


def decide(runs: Sequence[Stepped], window: tuple[float, float], rule: Stopping) -> tuple[str | None, float]:
    """The rule's verdict on what ``runs`` have decided now (FEASIBLE, INFEASIBLE, UNDECIDED when
    futile, None: look again later), and the window's end it used."""
    w0, w1 = window
    t_c = min(w1 if r.ended else r.complete_until() for r in runs)
    if t_c - w0 < rule.min_window * (w1 - w0):
        return None, t_c
    rows = []
    for i, r in enumerate(runs):
        for t0, device, slo, bad in r.decided_before(t_c):
            rows.append((i * (1 << 32) + device, slo, float(bad), t0))
    if not rows:
        return None, t_c
    arr = np.asarray(rows, dtype=float)
    whole = verdict(arr[:, :3], rule.epsilon, rule.z)
    if whole is None:
        # futile: past ``futility`` of the window, the same rates over the whole window would
        # still not clear epsilon either way (the later half alike): the point is at the knee
        if rule.futility is None or t_c - w0 < rule.futility * (w1 - w0):
            return None, t_c
        scale = (w1 - w0) / (t_c - w0)
        late = arr[arr[:, 3] >= (w0 + t_c) / 2, :3]
        held = verdict(arr[:, :3], rule.epsilon, rule.z, scale) is None
        return (UNDECIDED if held and verdict(late, rule.epsilon, rule.z, scale) is None else None), t_c
    later = verdict(arr[arr[:, 3] >= (w0 + t_c) / 2, :3], rule.epsilon, rule.z)
    return (whole if later == whole else None), t_c


def run_together(runs: Sequence[Stepped], window: tuple[float, float], rule: Stopping | None) -> Stop:
    """Run ``runs`` (one point's seeds) in steps until ``rule`` decides or they reach their
    horizon (module text); None: to the horizon, as plain runs."""
    w0, w1 = window
    if rule is None:
        for r in runs:
            r.advance(math.inf)
        return Stop(UNRULED, w1)
    t = w0 + rule.min_window * (w1 - w0)
    while True:
        if all([r.advance(t) for r in runs]):
            how, _ = decide(runs, window, rule)  # the whole window: at the knee, or not
            return Stop(how or UNDECIDED, w1)
        how, t_c = decide(runs, window, rule)
        if how is not None:  # feasible, infeasible, or (futile) undecided
            for r in runs:
                r.cut(t_c)
            return Stop(how, t_c, early=True)
        t += rule.check_s
