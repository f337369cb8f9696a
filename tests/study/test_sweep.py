"""Sweeps: results are stored per point, resumed without rerunning, and reproducible."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

import wispsim.study.points as sweep_mod
from wispsim.sim.scenarios import load_scenario
from wispsim.study.capacity import capacity_sweep, groups_for
from wispsim.study.points import Point
from wispsim.study.runners import LocalRunner

# a short window, and less KV memory so that even WISP reaches its knee below 64 devices
QUICK = {
    "workload": {"warmup_s": 2, "duration_s": 8},
    "server": {"gpu_memory_utilization": 0.85, "profile": "a100-qwen3-32b-paper"},  # sized for its speeds
}


def _quick_sweep(out: Path, jobs: int = 1):
    sc = load_scenario(overrides=QUICK)
    base = {"wisp": sc.with_policy("wisp"), "sled": sc.with_policy("sled")}
    with LocalRunner(jobs, out) as runner:
        return capacity_sweep(
            base, groups_for([8.0], "separate"), [0, 1], 0.05, runner, start=4, max_devices=64
        )


@pytest.mark.slow
def test_sweep_finds_a_knee_and_keeps_every_point(tmp_path: Path) -> None:
    res = _quick_sweep(tmp_path)
    cap = res.capacity.set_index("policy")
    assert set(cap.index) == {"wisp", "sled"}
    # SLED recomputes every prefix, WISP verifies over a cached prefix: WISP serves more at 8 tok/s
    assert cap.loc["wisp", "capacity"] > cap.loc["sled", "capacity"] >= 1
    for pol, row in cap.iterrows():
        assert not row.saturated
        assert row.ci_low <= row.capacity <= row.ci_high
        curve = res.pooled[res.pooled.policy == pol].set_index("devices").decision_violation
        assert curve[row.capacity] <= 0.05 if row.capacity in curve.index else row.capacity == 0
        assert curve[row.capacity + 1] > 0.05
    points = list((tmp_path / "points").iterdir())
    assert len(points) == len(res.curve) // 2  # one folder per (policy, N), its two seeds inside; one class
    assert all((p / "summary.csv").is_file() and (p / "scenario.yaml").is_file() for p in points)


@pytest.mark.slow
def test_interrupted_sweep_resumes_without_rerunning_finished_points(tmp_path: Path, monkeypatch) -> None:
    first = _quick_sweep(tmp_path / "a")
    # simulate an interruption: half of the finished points are lost, the rest kept
    folders = sorted((tmp_path / "a" / "points").iterdir())
    kept = folders[::2]
    for f in folders[1::2]:
        shutil.rmtree(f)
    calls: list[int] = []
    real = sweep_mod.Run

    def counting(sc, devices, seed):
        calls.append(devices)
        return real(sc, devices, seed)

    monkeypatch.setattr(sweep_mod, "Run", counting)
    again = _quick_sweep(tmp_path / "a")
    assert len(calls) == 2 * (len(folders) - len(kept))  # only the lost points ran again, both seeds
    pd.testing.assert_frame_equal(first.capacity, again.capacity)
    pd.testing.assert_frame_equal(first.curve, again.curve)


def test_point_key_depends_on_config_devices_and_seed() -> None:
    sc = load_scenario(overrides=QUICK)
    k = Point(sc, 10, 0).key
    assert k == Point(load_scenario(overrides=QUICK), 10, 0).key
    assert len({k, Point(sc, 11, 0).key, Point(sc, 10, 1).key, Point(sc.with_policy("sled"), 10, 0).key}) == 4


@pytest.mark.slow
def test_process_pool_gives_the_same_results_as_serial(tmp_path: Path) -> None:
    serial = _quick_sweep(tmp_path / "s", jobs=1)
    pooled = _quick_sweep(tmp_path / "p", jobs=2)
    pd.testing.assert_frame_equal(serial.capacity, pooled.capacity)
    pd.testing.assert_frame_equal(serial.curve.drop(columns="point"), pooled.curve.drop(columns="point"))


class _ScriptedRunner:
    """A runner that simulates nothing: a point's violation rate steps from 0 to 1 past its
    policy's knee, and points come back in the order ``pick`` chooses among those in flight."""

    jobs = 2

    def __init__(self, knees: dict[str, int], pick) -> None:
        self.knees, self.pick = knees, pick
        self.flying: list[tuple[object, Point]] = []
        self.log: list[tuple[str, object]] = []  # ("start" | "back", tag), in order

    def start(self, tag, point: Point) -> None:
        self.flying.append((tag, point))
        self.log.append(("start", tag))

    def spare(self) -> int:
        return 0  # nothing is simulated ahead

    def finished(self):
        from wispsim.study.points import PointResult
        from wispsim.study.stopping import Stop

        tag, _ = self.flying.pop(self.pick(self.flying))
        self.log.append(("back", tag))
        (pol, _), n = tag
        bad = float(n > self.knees[pol])
        counts = pd.DataFrame(
            {"seed": 0, "device": range(20), "slo": 8.0, "violated": bad * 5, "responses": 5}
        )
        summary = pd.DataFrame({"seed": [0], "class": ["8"], "devices": [n], "violation_rate": [bad]})
        return tag, PointResult(
            str(tag), summary, counts, stop=Stop("infeasible" if bad else "feasible", 1.0)
        )


def test_each_search_goes_on_as_soon_as_its_own_points_are_back() -> None:
    sc = load_scenario(overrides=QUICK)
    base = {"wisp": sc.with_policy("wisp"), "sled": sc.with_policy("sled")}
    args = (base, groups_for([8.0], "separate"), [0], 0.05)
    knees = {"wisp": 40, "sled": 9}
    first = _ScriptedRunner(knees, lambda flying: 0)  # back in the order started
    # SLED's points come back only when nothing else is in flight (a slow search)
    late = _ScriptedRunner(
        knees, lambda flying: next((i for i, f in enumerate(flying) if f[0][0][0] != "sled"), 0)
    )
    a = capacity_sweep(*args, first, start=4, max_devices=64)
    b = capacity_sweep(*args, late, start=4, max_devices=64)
    # the same N values per search and the same tables, whatever order points come back in
    for one, two in ((a.capacity, b.capacity), (a.curve, b.curve), (a.pooled, b.pooled)):
        pd.testing.assert_frame_equal(one, two)
    assert list(a.capacity.capacity) == [40, 9]
    # WISP's whole search ran while SLED's first point was still out
    sled_back = late.log.index(next(e for e in late.log if e[0] == "back" and e[1][0][0] == "sled"))
    wisp_starts = [i for i, e in enumerate(late.log) if e[0] == "start" and e[1][0][0] == "wisp"]
    assert len(wisp_starts) > 2 and wisp_starts[-1] < sled_back
