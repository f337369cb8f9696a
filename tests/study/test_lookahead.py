"""Simulating ahead: the guess of a waiting search's next point, and the runner that adopts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from wispsim.sim.scenarios import load_scenario
from wispsim.study.capacity import capacity_sweep, groups_for
from wispsim.study.capacity_search import CapacitySearch, PointStats
from wispsim.study.lookahead import guess_next, predicted
from wispsim.study.points import Point
from wispsim.study.runners import LocalRunner


def _search(points: list[tuple[int, float, float, float, str]], estimate: int = 85) -> CapacitySearch:
    s = CapacitySearch(epsilon=0.05, estimate=estimate)
    s._started = True
    for n, v, lo, hi, how in points:
        s.evaluated[n] = PointStats(n, v, lo, hi, {"8": v}, 1200, how)
    return s


# the default sweep's search at 8 tok/s, measured: 85 past the knee, 70 within it, 77 at the knee
STEEP = [(70, 0.0, 0.0, 0.0, "feasible"), (77, 0.038, 0.028, 0.049, "undecided"),
         (85, 0.108, 0.076, 0.140, "infeasible")]  # fmt: skip


def test_a_point_in_flight_is_predicted_on_the_line_through_its_neighbours() -> None:
    s = _search(STEEP)
    p = predicted(s, 80)
    assert p is not None
    assert p.violation == pytest.approx(0.038 + 3 / 8 * (0.108 - 0.038))
    assert p.ci_high - p.ci_low == pytest.approx(0.021)  # as wide as its nearest evaluated point's
    assert p.stop == "infeasible"  # its interval clears epsilon
    assert predicted(s, 78).stop == "undecided"  # 0.047 +- 0.0105 holds epsilon
    # beyond the curve, the line through the nearest two; with one point there is no line
    assert predicted(s, 90).violation == pytest.approx(0.108 + 5 * (0.108 - 0.038) / 8)
    assert predicted(_search(STEEP[:1]), 75) is None


def test_the_guess_is_the_cut_the_search_makes_when_the_point_comes_back_as_predicted() -> None:
    """Waiting on 80, the search would cut at 78 if 80 reads 6.4%; and it does, once 80 reads
    that. Guessing leaves the search itself as it was."""
    s = _search(STEEP)
    before = (dict(s.evaluated), list(s._cuts))
    assert guess_next(s, {80}) == [78]
    assert (dict(s.evaluated), list(s._cuts)) == before
    s.evaluated[80] = predicted(s, 80)
    assert s.next_devices() == [78]


def test_nothing_is_guessed_without_a_point_in_flight_or_a_line() -> None:
    assert guess_next(_search(STEEP), set()) == []
    assert guess_next(_search(STEEP[:1]), {75}) == []


def _point(n: int) -> Point:
    sc = load_scenario(overrides={"workload": {"warmup_s": 2, "duration_s": 8}})
    return Point(sc.with_devices(n, (8.0,)), n, (0,), None)


def test_a_point_simulated_ahead_is_adopted_when_asked_for_and_else_not_waited_for(tmp_path: Path) -> None:
    with LocalRunner(2, tmp_path) as runner:
        assert runner.spare() == 2
        runner.ahead(_point(20))
        runner.ahead(_point(20))  # once only
        assert len(runner._ahead) == 1 and runner.spare() >= 1
        ahead = runner._ahead[_point(20).key]
        runner.start("asked", _point(20))  # adopts the one running ahead: nothing new is started
        assert runner._ahead == {} and list(runner._flying) == [ahead]
        tag, r = runner.finished()
        assert tag == "asked" and r.computed and runner.computed == 1
    assert [d.name for d in (tmp_path / "points").iterdir()] == [_point(20).key]


def test_a_point_simulated_ahead_and_never_asked_for_is_not_waited_for(tmp_path: Path) -> None:
    """The runner's exit stops it (a full-length point of 150 devices: seconds of work) and leaves
    neither its folder nor a half-written one behind."""
    sc = load_scenario()
    unasked = Point(sc.with_devices(150, (4.0,)), 150, (0, 1, 2), None)
    with LocalRunner(2, tmp_path) as runner:
        runner.ahead(unasked)
    assert not (tmp_path / "points").exists() or not list((tmp_path / "points").iterdir())


@pytest.mark.slow
def test_a_sweep_that_simulates_ahead_answers_as_one_that_does_not(tmp_path: Path) -> None:
    """Two workers (idle ones simulate ahead) and one (none to spare): the same capacities,
    intervals and curve."""
    sc = load_scenario(overrides={"workload": {"warmup_s": 5, "duration_s": 30}})
    from wispsim.study.stopping import Stopping

    out, ahead = {}, {}
    for jobs in (1, 2):
        with LocalRunner(jobs, tmp_path / f"j{jobs}") as runner:
            out[jobs] = capacity_sweep(
                {"wisp": sc}, groups_for([8.0], "separate"), [0, 1], 0.05, runner, stopping=Stopping(0.05)
            )
            ahead[jobs] = runner.started_ahead
    # one search, one point a wave: once it brackets the knee, its second worker is spare
    assert ahead == {1: 0, 2: ahead[2]} and ahead[2] >= 1
    cols = ["capacity", "ci_low", "ci_high", "evaluated"]
    assert out[1].capacity[cols].equals(out[2].capacity[cols])
    assert out[1].pooled.equals(out[2].pooled)


def test_a_point_that_failed_ahead_is_simulated_anew_when_asked_for(tmp_path: Path) -> None:
    """A point simulated ahead that failed (a full disk, say) is not handed to the search that
    asks for it: it runs again, and its own failure, if any, is the search's."""
    from concurrent.futures import wait

    from wispsim.errors import ConfigError

    bad = Point(load_scenario(), 0, (0,), None)  # no devices: the run refuses it
    with LocalRunner(2, tmp_path) as runner:
        runner.ahead(bad)
        failed = runner._ahead[bad.key]
        wait([failed])
        assert failed.exception() is not None
        runner.start("asked", bad)
        assert failed not in runner._flying and runner.adopted == 0
        with pytest.raises(ConfigError):
            runner.finished()
