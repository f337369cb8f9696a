"""Capacity search logic on synthetic violation curves (no simulation)."""

from __future__ import annotations

import pandas as pd
import pytest

from wispsim.study.capacity_search import (
    CapacitySearch,
    EdgeSearch,
    Gallop,
    PointStats,
    midpoint,
    per_wave,
    pooled_stats,
    run_search,
)
from wispsim.study.points import PointResult


def _run(search: CapacitySearch, curve) -> list[int]:
    """Drive a search against a deterministic curve N -> violation; return the N it evaluated."""
    order = []
    while True:
        todo = search.next_devices()
        if not todo:
            return order
        for n in todo:
            v = curve(n)
            search.evaluated[n] = PointStats(n, v, max(0.0, v - 0.01), min(1.0, v + 0.01), {"8": v}, 1000)
            order.append(n)


@pytest.mark.parametrize("knee", [1, 5, 8, 9, 37, 64, 100, 1000])
def test_bisection_finds_the_last_n_within_epsilon(knee: int) -> None:
    s = CapacitySearch(epsilon=0.05, start=8, max_devices=4096)
    order = _run(s, lambda n: 0.0 if n <= knee else 0.5)
    assert s.capacity == knee
    assert not s.saturated
    assert knee in s.evaluated and knee + 1 in s.evaluated
    # doubling bracket then bisection: O(log N) evaluations
    assert len(order) <= 2 * (knee.bit_length() + 4)


def test_zero_capacity_when_one_device_already_violates() -> None:
    s = CapacitySearch(epsilon=0.05)
    _run(s, lambda n: 0.2)
    assert s.capacity == 0
    assert s.evaluated.keys() >= {1}


def test_saturated_when_max_devices_meets_the_target() -> None:
    s = CapacitySearch(epsilon=0.05, start=8, max_devices=50)
    _run(s, lambda n: 0.0)
    assert s.capacity == 50 and s.saturated


def test_grid_is_evaluated_first_then_refined() -> None:
    s = CapacitySearch(epsilon=0.05, grid=(10, 20, 30, 40))
    order = _run(s, lambda n: 0.0 if n <= 23 else 1.0)
    assert order[:4] == [10, 20, 30, 40]
    assert s.capacity == 23


def test_interval_reads_the_bootstrap_bounds_off_the_curve() -> None:
    s = CapacitySearch(epsilon=0.05)
    pts = {10: (0.0, 0.0, 0.01), 20: (0.03, 0.01, 0.07), 21: (0.06, 0.04, 0.09), 30: (0.3, 0.2, 0.4)}
    for n, (v, lo, hi) in pts.items():
        s.evaluated[n] = PointStats(n, v, lo, hi, {}, 100)
    assert s.capacity == 20
    # the upper bound crosses 0.05 between 10 (0.01) and 20 (0.07): at 16.7; the lower bound
    # between 21 (0.04) and 30 (0.2): at 21.6, so 22 is the first N whose lower bound is > eps
    assert s.interval() == (16, 21)
    # evaluated at every N, the bounds are read at the evaluated points
    dense = CapacitySearch(epsilon=0.05)
    for n in range(1, 41):
        v = 0.0 if n <= 20 else 0.5
        dense.evaluated[n] = PointStats(n, v, max(0.0, v - 0.02), v + 0.01 if n <= 18 else v + 0.2, {}, 100)
    assert dense.capacity == 20 and dense.interval() == (18, 20)


def test_pooled_stats_pool_responses_and_bootstrap_devices() -> None:
    counts = pd.DataFrame(
        {
            "device": [0, 1, 2, 3],
            "slo": [8.0] * 4,
            "violated": [0, 0, 1, 3],
            "responses": [10, 10, 10, 10],
            "seed": [0, 0, 1, 1],
        }
    )
    st = pooled_stats(4, counts)
    assert st.violation == pytest.approx(4 / 40)
    assert 0.0 <= st.ci_low <= st.violation <= st.ci_high <= 0.3
    mix = pd.concat([counts, counts.assign(slo=2.0, violated=0)])
    st2 = pooled_stats(4, mix)
    assert st2.per_class == {"2": 0.0, "8": pytest.approx(0.1)}
    assert st2.violation == pytest.approx(0.1)  # the decision uses the worst class


# ------------------------------------------------------------------------------------------
# the one search every sizing command drives (EdgeSearch), on a known knee
# ------------------------------------------------------------------------------------------


def _waves(search: EdgeSearch, ok) -> list[list[int]]:
    """Drive ``search`` against a verdict x -> feasible; return its waves in order."""
    waves = []
    while todo := search.next():
        waves.append(todo)
        for x in todo:
            v = 0.0 if ok(x) else 0.5
            search.evaluated[x] = PointStats(x, v, v, v, {"8": v}, 100)
    return waves


def test_replica_search_doubles_then_cuts_in_thirds_two_a_wave() -> None:
    s = EdgeSearch(0.05, more_helps=True, low=1, high=512, first=[10, 20], width=2)
    waves = _waves(s, lambda r: r >= 23)
    # up 2x and 4x from 20, then (20, 40) in thirds (rounded), (20, 27), (22, 25)
    assert waves == [[10, 20], [40, 80], [27, 33], [22, 25], [23, 24]]
    assert s.answer == 23 and s.bounds() == (22, 23)


def test_device_search_doubles_then_bisects_down_to_the_knee() -> None:
    s = EdgeSearch(0.05, more_helps=False, low=1, high=4096, first=[8], split=midpoint)
    waves = _waves(s, lambda n: n <= 37)
    assert [w[0] for w in waves] == [8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert all(len(w) == 1 for w in waves)
    assert s.answer == 37 and s.bounds() == (37, 38)


@pytest.mark.parametrize(
    ("x0", "waves"),
    [
        (10, [[9, 10], [11], [13], [17], [25], [21], [23], [22]]),  # up: 1, 2, 4, 8 past x0
        (30, [[29, 30], [27], [23], [15], [19], [21], [22]]),  # down: 2, 4, 8 below x0 - 1
    ],
)
def test_gallop_walks_away_from_a_guess_then_narrows(x0: int, waves: list[list[int]]) -> None:
    s = EdgeSearch(0.05, more_helps=True, low=1, high=512, first=[x0 - 1, x0], steps=Gallop(x0))
    assert _waves(s, lambda r: r >= 23) == waves
    assert s.answer == 23


def test_steps_stay_inside_the_range_and_say_when_nothing_passes() -> None:
    s = EdgeSearch(0.05, more_helps=True, low=1, high=50, first=[8], width=3)
    assert _waves(s, lambda r: False) == [[8], [16, 32, 50]]  # 64 held to 50, then it stops
    assert s.answer is None and max(s.evaluated) == 50
    d = EdgeSearch(0.05, more_helps=False, low=4, high=100, first=[64], width=2)
    assert _waves(d, lambda n: False) == [[64], [16, 32], [4, 8]]
    assert d.answer is None and d.bounds() == (None, 4)  # not even ``low`` passes


def test_no_responses_is_not_feasible() -> None:
    s = EdgeSearch(0.05, more_helps=True, low=1, high=4, first=[2])
    s.next()
    s.evaluated[2] = PointStats(2, float("nan"), float("nan"), float("nan"), {}, 0)
    assert not s.turned(2) and s.next() == [4]


class _SeedRunner:
    """Answers each point at once: violated when its replica count is below 5; logs (R, seed)."""

    jobs = 4

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def map(self, points):
        out = []
        for p in points:
            r = p.scenario.server.replicas
            rows = []
            for seed in p.seeds:
                self.seen.append((r, seed))
                bad = int(r < 5) * (1 + seed)  # the seeds disagree: pooled 3 of 20
                rows.append({"seed": seed, "device": 0, "slo": 8.0, "violated": bad, "responses": 10})
            out.append(PointResult("k", pd.DataFrame({"seed": p.seeds}), pd.DataFrame(rows)))
        return out


def test_run_search_runs_each_x_with_every_seed_and_pools_them() -> None:
    from wispsim.sim.scenarios import load_scenario
    from wispsim.study.replicas import with_replicas

    sc = load_scenario()
    runner = _SeedRunner()
    seeds = [0, 1]
    s = EdgeSearch(0.05, more_helps=True, low=1, high=64, first=[2, 4], width=per_wave(runner))  # type: ignore[arg-type]
    heard = []
    got = run_search(
        s, runner, seeds, lambda r: (with_replicas(sc, r), 10), lambda r, st, res: heard.append(r)
    )  # type: ignore[arg-type]
    assert got == 5
    assert runner.seen[:4] == [(2, 0), (2, 1), (4, 0), (4, 1)]  # x-major, seed-minor
    assert heard == [2, 4, 8, 16, 32, 64, 5, 6, 7]  # a wave is one x per runner slot (4)
    assert s.evaluated[4].violation == pytest.approx(3 / 20)


# -- the sweep's search from an estimate, with the sequential rule's verdicts (issue 44) ---------


def _ruled(search: CapacitySearch, curve, knee_band: float = 0.01) -> list[int]:
    """As :func:`_run`, the rule's verdict on each point: undecided within ``knee_band`` of epsilon."""
    order = []
    while todo := search.next_devices():
        for n in todo:
            v = curve(n)
            how = (
                "undecided"
                if abs(v - search.epsilon) <= knee_band
                else ("feasible" if v < search.epsilon else "infeasible")
            )
            search.evaluated[n] = PointStats(
                n, v, max(0.0, v - 0.01), min(1.0, v + 0.01), {"8": v}, 1000, how
            )
            order.append(n)
    return order


def _ramp(n: int) -> float:
    """A violation curve that rises through epsilon (0.05) at N = 130: 0.002 per device."""
    return min(1.0, max(0.0, 0.05 + 0.002 * (n - 130)))


def test_the_search_starts_at_the_estimate_and_steps_out_by_a_growing_ratio() -> None:
    s = CapacitySearch(epsilon=0.05, estimate=100)
    order = _ruled(s, _ramp)
    assert order[:3] == [100, 120, 173]  # out by 1.2x, then 1.44x, until one fails
    # the rule's knee band is +-5 devices; a bracket end inside it, the bracket within the
    # capacity's interval, ends the search
    assert s.resolved() and abs(s.capacity - 130) <= 5 and len(order) <= 7
    b, e = s.bounds()
    assert s.evaluated[b].at_knee or s.evaluated[e].at_knee


def test_an_estimate_above_the_knee_steps_down() -> None:
    s = CapacitySearch(epsilon=0.05, estimate=400)
    order = _ruled(s, _ramp)
    assert order[:2] == [400, 333]
    assert abs(s.capacity - 130) <= 5


def test_exact_search_bisects_to_the_integer_through_the_knee() -> None:
    ruled = CapacitySearch(epsilon=0.05, estimate=100)
    exact = CapacitySearch(epsilon=0.05, estimate=100, exact=True)
    n_ruled, n_exact = len(_ruled(ruled, _ramp)), len(_ruled(exact, _ramp))
    assert exact.capacity == 130 and not exact.resolved()
    assert n_exact > n_ruled


@pytest.mark.parametrize("knee", [3, 40, 131, 700])
def test_regula_falsi_on_a_steep_knee_still_brackets_to_one_device(knee: int) -> None:
    """A step curve (no point at the knee): the cut bisects whenever interpolation creeps."""
    s = CapacitySearch(epsilon=0.05, estimate=100)
    order = _ruled(s, lambda n: 0.0 if n <= knee else 0.9, knee_band=0.0)
    assert s.capacity == knee and len(order) <= 2 * (knee.bit_length() + 6)


def test_a_point_without_responses_counts_as_past_the_knee() -> None:
    s = CapacitySearch(epsilon=0.05, estimate=10)
    _ruled(s, lambda n: float("nan") if n > 20 else 0.0)
    assert s.capacity == 20


def test_a_search_that_ends_at_the_knee_evaluates_the_points_its_interval_needs() -> None:
    """Every point near 130 is at the knee and its bounds straddle epsilon: the search adds a
    point below whose upper bound clears epsilon and one above whose lower bound does, so the
    interval is read off decided points (not 0 or the search ceiling)."""
    s = CapacitySearch(epsilon=0.05, estimate=128)
    order = _ruled(s, _ramp, knee_band=0.02)
    lo, hi = s.interval()
    assert 0 < lo <= s.capacity <= hi < 4096
    assert any(p.devices <= s.capacity and p.ci_high <= 0.05 for p in s.evaluated.values())
    assert any(p.devices > s.capacity and p.ci_low > 0.05 for p in s.evaluated.values())
    assert len(order) <= 8


def test_a_bracket_of_points_undecided_for_want_of_responses_is_cut_on() -> None:
    """A few devices give too few responses for the rule to decide anything: 0% at 15 devices and
    21% at 19 are both undecided, but 21% is far past epsilon and the capacity's interval is much
    narrower than the bracket (15, 19), so the search cuts on instead of interpolating across it
    (SLED on Qwen3-32B on an H100 at 4 tok/s ended at 15 that way where 17 is within epsilon)."""
    # violation rate and its device-bootstrap interval (no violation seen: [0, 0])
    curve = {15: (0.0, 0.0, 0.0), 16: (0.0, 0.0, 0.0), 17: (0.0127, 0.0, 0.03), 18: (0.12, 0.05, 0.2),
             19: (0.213, 0.1, 0.33)}  # fmt: skip
    s = CapacitySearch(epsilon=0.05, estimate=19)
    while todo := s.next_devices():
        for n in todo:
            v, lo, hi = curve.get(n, (0.0, 0.0, 0.0) if n < 15 else (0.5, 0.4, 0.6))
            s.evaluated[n] = PointStats(n, v, lo, hi, {"4": v}, 76, "undecided")
    assert 17 in s.evaluated and s.capacity == 17


def test_a_bracket_within_the_capacity_interval_ends_the_search() -> None:
    """An end at the knee and the bracket no wider than the interval: cutting on is noise."""
    s = CapacitySearch(epsilon=0.05, estimate=124)
    s._started = True
    for n, v, lo, hi in [(110, 0.02, 0.01, 0.035), (124, 0.047, 0.03, 0.065), (126, 0.055, 0.035, 0.075),
                         (133, 0.09, 0.07, 0.11)]:  # fmt: skip
        s.evaluated[n] = PointStats(n, v, lo, hi, {"4": v}, 1200, "undecided" if lo <= 0.05 <= hi else "x")
    assert s.bounds() == (124, 126) and s.resolved() and s.next_devices() == []


def test_one_knee_end_and_a_decided_one_within_the_interval_end_the_search() -> None:
    """The knee point 124 (undecided) and 127, clearly past epsilon, three apart, with the
    capacity's interval [121, 126]: cutting on would place the capacity by noise."""
    s = CapacitySearch(epsilon=0.05, estimate=124)
    s._started = True
    for n, v, lo, hi, how in [(110, 0.02, 0.01, 0.035, "feasible"), (124, 0.047, 0.03, 0.065, "undecided"),
                              (127, 0.08, 0.06, 0.1, "infeasible")]:  # fmt: skip
        s.evaluated[n] = PointStats(n, v, lo, hi, {"4": v}, 1200, how)
    assert s.bounds() == (124, 127) and s.resolved() and s.next_devices() == []
    assert s.capacity == 124 and s.interval()[0] <= 124 <= s.interval()[1]
    # the same bracket with neither end at the knee is cut on
    s.evaluated[124] = PointStats(124, 0.047, 0.03, 0.065, {"4": 0.047}, 1200, "feasible")
    assert not s.resolved() and s.next_devices() in ([125], [126])


def test_a_cut_from_a_knee_point_goes_no_farther_than_the_bracket_middle() -> None:
    """The default sweep at 8 tok/s: 70 devices feasible (0.2%), 76 at the knee (2.3%), 85 past
    it (12.1%). The secant through 76 and its neighbour 70 would cross epsilon at 84, but the
    curve steepens past a knee (83 and 84 both read ~10%): the cut stops at the middle, 80."""
    s = CapacitySearch(epsilon=0.05, estimate=85)
    s._started = True
    for n, v, lo, hi, how in [(70, 0.002, 0.0, 0.006, "feasible"), (76, 0.0229, 0.015, 0.032, "undecided"),
                              (85, 0.121, 0.088, 0.157, "infeasible")]:  # fmt: skip
        s.evaluated[n] = PointStats(n, v, lo, hi, {"8": v}, 3000, how)
    assert s.next_devices() == [80]


def test_an_end_undecided_for_want_of_responses_alone_ends_nothing() -> None:
    """SLED at 2 tok/s on Qwen3-32B: 9 devices saw 0 violations in 21 responses (undecided: too
    few to tell), 11 saw 2 in 4. The capacity's interval spans the bracket, but 9's own interval
    is clear of epsilon, so it is no knee: 10 is evaluated."""
    s = CapacitySearch(epsilon=0.05, estimate=11)
    s._started = True
    s.evaluated[9] = PointStats(9, 0.0, 0.0, 0.0, {"2": 0.0}, 21, "undecided")
    s.evaluated[11] = PointStats(11, 0.5, 0.0, 1.0, {"2": 0.5}, 4, "infeasible")
    assert not s.resolved() and s.next_devices() == [10]
