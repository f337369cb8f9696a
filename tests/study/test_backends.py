"""Sweep backends: a killed sweep resumes without losing or redoing finished points, and the Ray
backend gives the local backend's results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from wispsim.sim.scenarios import load_scenario
from wispsim.study.capacity import capacity_sweep, groups_for
from wispsim.study.runners import LocalRunner, RayRunner, make_runner

# a sweep of a dozen or so points, each a fraction of a second
SETS = ["workload.warmup_s=2", "workload.duration_s=8"]


def sweep_cmd(out: Path, jobs: int = 1) -> list[str]:
    args = [sys.executable, "-m", "wispsim.cli", "sweep", "--classes", "4,8", "--seeds", "2"]
    args += ["--devices", "20,40,60,80,100,120", "--jobs", str(jobs), "--out", str(out)]
    for s in SETS:
        args += ["--set", s]
    return args


def complete_points(out: Path) -> dict[str, float]:
    d = out / "points"
    if not d.is_dir():
        return {}
    # (a dot folder is a point being written, renamed into place when whole: a kill can leave one)
    return {
        p.name: (p / "summary.csv").stat().st_mtime
        for p in d.iterdir()
        if not p.name.startswith(".") and (p / "summary.csv").is_file()
    }


@pytest.mark.slow
def test_killed_sweep_resumes_and_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    r = subprocess.run(sweep_cmd(whole), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    total = len(complete_points(whole))
    assert total >= 10

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        sweep_cmd(cut), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while len(complete_points(cut)) < total // 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # no clean-up of any kind
    proc.wait()
    before = complete_points(cut)
    assert 0 < len(before) < total, "the kill must land mid-sweep"
    assert not (cut / "capacity.csv").exists()

    r = subprocess.run(sweep_cmd(cut), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    after = complete_points(cut)
    assert set(after) == set(complete_points(whole))  # the same points, by content hash
    assert all(after[k] == t for k, t in before.items())  # finished points were not redone
    for name in ("capacity.csv", "curve.csv", "curve_pooled.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(cut / name), pd.read_csv(whole / name))
    leftovers = [p for p in (cut / "points").iterdir() if p.name.startswith(".")]
    assert len(leftovers) <= 1  # at most the half-written point the kill interrupted, never used


def _small_sweep(runner) -> tuple[pd.DataFrame, pd.DataFrame]:
    sc = load_scenario(overrides={"workload": {"warmup_s": 2, "duration_s": 6}})
    base = {"wisp": sc.with_devices(20, (8.0,))}
    with runner as r:
        res = capacity_sweep(base, groups_for((8.0,), "separate"), [0, 1], 0.05, r, grid=(10, 30, 50, 70))
    return res.capacity, res.curve


@pytest.mark.slow
def test_ray_backend_equals_local(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    local_cap, local_curve = _small_sweep(LocalRunner(2, tmp_path / "local"))
    ray_cap, ray_curve = _small_sweep(RayRunner(2, tmp_path / "ray"))
    pd.testing.assert_frame_equal(ray_cap, local_cap)
    pd.testing.assert_frame_equal(ray_curve, local_curve)
    # every point the searches asked for is stored by both; the local pool may also hold a point
    # a spare worker simulated ahead that no search then asked for (wispsim.study.lookahead)
    stored = {b: {p.name for p in (tmp_path / b / "points").iterdir()} for b in ("ray", "local")}
    assert set(local_curve.point) == stored["ray"] <= stored["local"]


def test_unknown_backend_and_stray_address_are_config_errors(tmp_path: Path) -> None:
    from wispsim.errors import ConfigError

    with pytest.raises(ConfigError, match="allowed: local, ray"):
        make_runner("spark", 2, tmp_path)
    with pytest.raises(ConfigError, match="only with --backend ray"):
        make_runner("local", 2, tmp_path, address="ray://head:10001")


def _blas_threads() -> list[int]:
    import threadpoolctl

    return [lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"]


def test_pool_workers_run_one_blas_thread_each() -> None:
    """The pool is the parallelism: a worker's BLAS library runs one thread, not one per core
    (OpenBLAS's idle threads spin on the cores the other workers need), whatever its parent ran."""
    import threadpoolctl

    from wispsim.study.runners import worker_pool

    assert _blas_threads(), "no BLAS library found under numpy"  # pandas imports numpy: loaded
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        if set(_blas_threads()) != {2}:
            pytest.skip("this BLAS library does not take a second thread here")
        with worker_pool(2) as pool:  # forked while this process runs two
            threads = pool.submit(_blas_threads).result()
    assert threads and set(threads) == {1}
