"""Simulating ahead: the point a capacity search will most likely ask for next, on an idle worker.

Near its end a sweep is one search waiting on one point, and the other workers idle: the searches
are chains (each cut waits for the point before it), and the last chain runs alone. While a
search that has bracketed the knee waits, :func:`guess_next` says where it would cut if each of
its points in flight came back where its evaluated curve puts it: at the violation rate on the
line through its evaluated neighbours (beyond the last one, the line through the nearest two),
with an interval as wide as the nearest evaluated point's, at the knee if that interval holds
epsilon. A runner with a worker to spare simulates that N ahead
(:meth:`wispsim.study.runners.LocalRunner.ahead`); if the search then asks for it, the point is
already running or done. If not, the worker's time is spent -- and a point the search does ask
for meanwhile may wait for a worker, where a wave of two points (an interval's two anchors)
finds only one free.

The search itself only ever sees the points it asked for, each of which is the same whoever
simulated it and when (a point depends on its scenario, N and seeds alone), so simulating ahead
changes no answer, no curve and no interval: only how long they take.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection

from wispsim.study.capacity_search import CapacitySearch, PointStats
from wispsim.study.stopping import FEASIBLE, INFEASIBLE, UNDECIDED


def predicted(search: CapacitySearch, x: int) -> PointStats | None:
    """Where ``search``'s evaluated curve puts N = ``x`` (module text); None with fewer than two
    evaluated points to draw the line through."""
    seen = (p for p in search.evaluated.values() if math.isfinite(p.violation))
    pts = sorted(seen, key=lambda p: p.devices)
    below = [p for p in pts if p.devices < x]
    above = [p for p in pts if p.devices > x]
    if below and above:
        a, b = below[-1], above[0]
    elif len(below) >= 2:
        a, b = below[-2], below[-1]
    elif len(above) >= 2:
        a, b = above[0], above[1]
    else:
        return None
    share = (x - a.devices) / (b.devices - a.devices)
    v = min(max(a.violation + share * (b.violation - a.violation), 0.0), 1.0)
    near = min((a, b), key=lambda p: abs(p.devices - x))
    half = (near.ci_high - near.ci_low) / 2
    eps = search.epsilon
    stop = UNDECIDED if v - half <= eps <= v + half else FEASIBLE if v <= eps else INFEASIBLE
    guess = PointStats(x, v, max(v - half, 0.0), v + half, {}, near.responses)
    guess.stop = stop
    return guess


def guess_next(search: CapacitySearch, flying: Collection[int]) -> list[int]:
    """The N values ``search`` would ask for next if its points in ``flying`` came back as its
    curve predicts (:func:`predicted`), less those evaluated or in flight; [] where it cannot say
    or has not bracketed the knee yet (stepping out, it goes by growing ratios: a guess could be
    far larger than anything it will ask for)."""
    below, edge = search.bounds()
    if not flying or below is None or edge is None:
        return []  # only while it cuts a bracket: stepping out, a guess could land far off
    trial = copy.deepcopy(search)  # its steps and cuts keep state: the search itself is untouched
    for x in flying:
        guess = predicted(search, x)
        if guess is None:
            return []
        trial.evaluated[x] = guess
    return [x for x in trial.next_devices() if x not in search.evaluated and x not in flying]
