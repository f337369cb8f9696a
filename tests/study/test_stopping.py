"""Sequential stopping (issue 44): the interval, the rule's guards, and what a cut run measures."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from wispsim.config import Scenario
from wispsim.sim.scenarios import check, load_scenario
from wispsim.sim.simulation import Run, simulate
from wispsim.study.points import Point, compute_point
from wispsim.study.stopping import (
    FEASIBLE,
    INFEASIBLE,
    UNDECIDED,
    UNRULED,
    Stopping,
    class_interval,
    decide,
    run_together,
    verdict,
    wilson,
)


def test_wilson_holds_the_rate_and_narrows_with_trials() -> None:
    assert wilson(0.1, 0, 3.0) == (0.0, 1.0)
    lo, hi = wilson(0.1, 100, 3.0)
    lo2, hi2 = wilson(0.1, 10_000, 3.0)
    assert lo < 0.1 < hi and lo < lo2 < 0.1 < hi2 < hi
    assert wilson(0.0, 100, 3.0)[0] == 0.0 and 0.0 < wilson(0.0, 100, 3.0)[1] < 0.1


def test_violations_that_cluster_on_devices_widen_the_interval() -> None:
    """100 devices x 20 responses, 10% violated: spread evenly the sample is 2,000 responses; all
    on 10 devices, it is about 100 devices' worth (design effect ~20)."""
    devices = np.repeat(np.arange(100), 20)
    spread = np.zeros(2000, bool)
    spread[::10] = True
    clustered = devices < 10
    lo_s, hi_s, n = class_interval(devices, spread, 3.0)
    lo_c, hi_c, _ = class_interval(devices, clustered, 3.0)
    assert n == 2000
    assert hi_c - lo_c > 3 * (hi_s - lo_s)
    assert lo_c < 0.1 < hi_c


def _rows(n: int, bad: int, slo: float = 8.0, devices: int = 50) -> np.ndarray:
    v = np.zeros(n)
    v[:bad] = 1
    rng = np.random.default_rng(0)
    rng.shuffle(v)
    return np.column_stack([np.arange(n) % devices, np.full(n, slo), v])


def test_verdict_needs_every_class_under_epsilon_and_any_class_over_it() -> None:
    assert verdict(_rows(4000, 0), 0.05, 3.0) == FEASIBLE
    assert verdict(_rows(4000, 2000), 0.05, 3.0) == INFEASIBLE
    assert verdict(_rows(4000, 200), 0.05, 3.0) is None  # 5%: at the knee
    mix = np.vstack([_rows(4000, 0, 8.0), _rows(4000, 2000, 4.0)])
    assert verdict(mix, 0.05, 3.0) == INFEASIBLE  # one class over is enough
    assert verdict(np.empty((0, 3)), 0.05, 3.0) is None


class _Fake:
    """A stepped run: responses (start, device, SLO, violated) decided ``lag`` s after they start."""

    def __init__(self, rows: list[tuple[float, int, float, bool]], horizon: float, lag: float = 1.0) -> None:
        self.rows, self.horizon, self.lag = rows, horizon, lag
        self.now, self.cut_at = 0.0, None

    @property
    def ended(self) -> bool:
        return self.cut_at is not None or self.now >= self.horizon

    def advance(self, until: float) -> bool:
        self.now = min(until, self.horizon)
        return self.ended

    def complete_until(self) -> float:
        return self.now - self.lag

    def decided_before(self, t: float) -> list[tuple[float, int, float, bool]]:
        return [r for r in self.rows if r[0] < t]

    def cut(self, t: float) -> None:
        self.cut_at = t


def _responses(rate_of, t0: float = 10.0, t1: float = 110.0, per_s: int = 40) -> list[Any]:
    rng = np.random.default_rng(1)
    out = []
    for i, t in enumerate(np.linspace(t0, t1, int((t1 - t0) * per_s), endpoint=False)):
        out.append((float(t), i % 60, 8.0, bool(rng.random() < rate_of(t))))
    return out


def test_a_clear_point_stops_early_and_cuts_every_seed_at_one_window_end() -> None:
    runs = [_Fake(_responses(lambda t: 0.0), 130.0), _Fake(_responses(lambda t: 0.0), 130.0)]
    stop = run_together(runs, (10.0, 110.0), Stopping(0.05))
    assert stop.how == FEASIBLE and stop.early
    # not before the minimum window (a quarter of 100 s), one cut for all seeds
    assert 35.0 <= stop.window_end < 110.0
    assert [r.cut_at for r in runs] == [stop.window_end, stop.window_end]


def test_a_point_at_the_knee_runs_to_its_horizon_unless_futility_stops_it() -> None:
    """Violation at epsilon: by default the point runs to its horizon, undecided. With the
    futility rule (off by default: measured on the 4-policy compare it saved 13% of the CPU and
    moved knee capacities by 1-3%), past half the window its interval would still hold epsilon
    over the whole window, so it stops there."""
    runs = [_Fake(_responses(lambda t: 0.05), 130.0)]
    stop = run_together(runs, (10.0, 110.0), Stopping(0.05))
    assert stop.how == UNDECIDED and not stop.early and stop.window_end == 110.0
    assert runs[0].cut_at is None and runs[0].now == 130.0
    runs = [_Fake(_responses(lambda t: 0.05), 130.0)]
    stop = run_together(runs, (10.0, 110.0), Stopping(0.05, futility=0.5))
    assert stop.how == UNDECIDED and stop.early and 60.0 <= stop.window_end < 70.0
    assert runs[0].cut_at == stop.window_end


def test_a_point_near_the_knee_that_the_horizon_would_decide_runs_on() -> None:
    """7.5% violated, 20 responses a second: undecided at half the window, but its interval over
    the whole window would clear epsilon, so it is not futile and runs until it does."""
    runs = [_Fake(_responses(lambda t: 0.075, per_s=20), 130.0)]
    stop = run_together(runs, (10.0, 110.0), Stopping(0.05, futility=0.5))
    assert stop.how == INFEASIBLE and stop.window_end > 61.0


def test_a_queue_that_starts_building_does_not_stop_on_the_quiet_window_before_it() -> None:
    """No violation for 50 s, then 30% of them: at 65 s the whole window [10, 65) still reads
    feasible, but its later half does not agree, so the rule waits; by 75 s both say infeasible."""
    rows = _responses(lambda t: 0.0 if t < 60 else 0.3)
    runs = [_Fake(rows, 130.0)]
    assert decide(runs, (10.0, 110.0), Stopping(0.05))[0] is None  # nothing decided: window too short
    runs[0].advance(66.0)
    whole = np.array([(d, s, float(b)) for t, d, s, b in rows if t < 65.0])
    assert verdict(whole, 0.05, 3.0) == FEASIBLE
    assert decide(runs, (10.0, 110.0), Stopping(0.05)) == (None, 65.0)
    runs[0].advance(76.0)
    assert decide(runs, (10.0, 110.0), Stopping(0.05)) == (INFEASIBLE, 75.0)


def test_without_a_rule_the_runs_go_to_their_horizon() -> None:
    runs = [_Fake(_responses(lambda t: 0.0), 130.0)]
    stop = run_together(runs, (10.0, 110.0), None)
    assert stop.how == UNRULED and runs[0].now == 130.0 and not stop.early


# -- on real simulations --------------------------------------------------------------------------

QUICK = {"workload": {"warmup_s": 2.0, "duration_s": 20.0}}


def _scenario(devices: int, slo: float = 4.0, **more: Any) -> Scenario:
    return load_scenario(
        overrides={"policy": "wisp", "devices": {"count": devices, "classes": [slo]}, **QUICK, **more}
    )


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    """The measured responses and their verdicts (a run cut later may also hold the end time of a
    violating response that the shorter run stopped waiting for: same verdict, censored there)."""
    cols = ["device", "response", "t_start", "output_len", "violated"]
    return df[df["measured"]][cols].sort_values(["device", "t_start"]).reset_index(drop=True)


def test_a_run_advanced_in_steps_gives_the_records_of_one_run() -> None:
    resolved = check(_scenario(30))
    whole = simulate(resolved, seed=3)
    run = Run(resolved, seed=3)
    t = 0.0
    while not run.advance(t):
        t += 1.7
    stepped = run.result()
    pd.testing.assert_frame_equal(stepped.responses, whole.responses)
    assert stepped.sim_end == whole.sim_end


def test_a_cut_run_measures_what_a_run_with_that_window_measures() -> None:
    """Cut at ``t_c``: the same measured responses, with the same verdicts, as the run whose
    measurement window ends at ``t_c`` (warm-up 5 s, so ``duration_s = t_c - 5``); 150 devices
    of 4 tok/s are past the knee, so some responses violate."""
    window = {"warmup_s": 5.0, "duration_s": 120.0}
    for devices, seed in [(30, 5), (150, 1), (150, 3)]:
        run = Run(check(_scenario(devices, workload=window)), seed=seed)
        run.advance(90.0)
        t_c = run.complete_until()
        assert 5.0 < t_c < 90.0
        run.cut(t_c)
        assert run.ended
        short = simulate(
            check(_scenario(devices, workload={"warmup_s": 5.0, "duration_s": t_c - 5.0})), seed=seed
        )
        cut = _measured(run.result().responses)
        assert len(cut) >= 10
        pd.testing.assert_frame_equal(cut, _measured(short.responses))


@pytest.mark.parametrize("devices, how", [(40, FEASIBLE), (400, INFEASIBLE)])
def test_points_far_from_the_knee_stop_early_on_the_right_side(devices: int, how: str) -> None:
    sc = _scenario(devices, workload={"warmup_s": 5.0, "duration_s": 120.0})
    ruled = compute_point(Point(sc, devices, (0, 1), stopping=Stopping(0.05)))
    assert ruled.stop.how == how and ruled.stop.early
    assert ruled.meta["window_end_s"] < 125.0 and ruled.meta["stopped_early"]
    plain = compute_point(Point(sc, devices, (0, 1)))
    assert plain.stop.how == UNRULED and plain.meta["window_end_s"] == 125.0
    # the same side of epsilon either way, and every seed's table is there
    rate = lambda out: out.counts["violated"].sum() / out.counts["responses"].sum()  # noqa: E731
    assert (rate(ruled) > 0.05) == (rate(plain) > 0.05) == (how == INFEASIBLE)
    assert sorted(ruled.counts["seed"].unique()) == [0, 1]
    assert max(ruled.meta["sim_end_s"]) < min(plain.meta["sim_end_s"])
    assert math.isfinite(ruled.meta["wall_s"])
