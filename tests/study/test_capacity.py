"""Capacity search logic on synthetic violation curves (no simulation)."""

from __future__ import annotations

import pandas as pd
import pytest

from wispsim.study.capacity_search import CapacitySearch, PointStats, pooled_stats


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
    # 10 is the largest N <= capacity whose upper bound is <= eps; 30 the first whose lower bound > eps
    assert s.interval() == (10, 29)


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
