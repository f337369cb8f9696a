"""Arrival processes, fleets, replicas behind routers, time-resolved metrics and cluster planning."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.support import ROOT, write_profile
from wispsim.analysis.metrics import replica_summary, summarize
from wispsim.analysis.timeseries import burst_table, compliance_series, trace_peaks
from wispsim.cli.main import app
from wispsim.errors import ConfigError
from wispsim.model.fleet import device_specs, fleet_classes, fleet_size
from wispsim.sim.arrivals import ArrivalTrace, bursty_trace, load_arrival_trace
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate


def write_trace(path: Path, rows: list[tuple[float, float]]) -> str:
    pd.DataFrame(rows, columns=["time_s", "value"]).to_csv(path, index=False)
    return str(path)


# ------------------------------------------------------------------------------------------
# fleets
# ------------------------------------------------------------------------------------------


def test_groups_interleave_so_every_prefix_has_the_mix() -> None:
    groups = [{"count": 30, "slo": 2, "link": "5g"}, {"count": 10, "slo": 8, "name": "fast"}]
    sc = load_scenario(overrides={"devices": {"groups": groups}})
    assert fleet_size(sc) == 40 and fleet_classes(sc) == (2.0, 8.0)
    specs = device_specs(sc, 40)
    assert [s.slo for s in specs].count(2.0) == 30
    for k in (4, 8, 20):  # every prefix is 3:1
        assert [s.slo for s in specs[:k]].count(8.0) == k // 4
    assert {s.link for s in specs if s.slo == 2.0} == {"5g"} and {s.group for s in specs} == {
        "group0",
        "fast",
    }
    scaled = device_specs(sc, 10)  # a capacity search at N=10 keeps the proportions
    assert [s.slo for s in scaled].count(2.0) == 8 or [s.slo for s in scaled].count(2.0) == 7


def test_group_with_unknown_link_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"devices\.groups\[0\]\.link.*unknown link type 'lte'"):
        load_scenario(overrides={"devices": {"groups": [{"count": 3, "slo": 2, "link": "lte"}]}})


def test_fleet_groups_run_with_their_own_speeds_and_links(det_scenario) -> None:
    sc = det_scenario(
        devices={
            "groups": [
                {
                    "count": 2,
                    "slo": 1.0,
                    "draft_speed": {"dist": "constant", "value": 10, "min": 10, "max": 10},
                },
                {"count": 1, "slo": 3.0},
            ]
        },
        workload={"duration_s": 2.0},
    )
    res = simulate(resolve_server(sc), devices=fleet_size(sc))
    r = res.rounds
    assert sorted(r.groupby("device").slo.first().tolist()) == [1.0, 1.0, 3.0]
    assert np.allclose(r[r.slo == 1.0].tau_d, 0.1) and np.allclose(r[r.slo == 3.0].tau_d, 0.02)
    assert set(summarize(res)["class"]) == {"1", "3", "all"}


# ------------------------------------------------------------------------------------------
# arrival traces and processes
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "field", "problem"),
    [
        ("t,value\n0,1\n", "time_s", "missing column"),
        ("time_s,value\n0,1\n1,-2\n", "value", "row 2: must be >= 0"),
        ("time_s,value\n0,1\n0,2\n", "time_s", "increase strictly"),
        ("time_s,value\n0,abc\n", "value", "row 1: not a finite number"),
    ],
)
def test_bad_arrival_trace_names_file_and_column(tmp_path: Path, rows: str, field: str, problem: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(rows)
    with pytest.raises(ConfigError) as e:
        load_arrival_trace(str(p))
    assert str(p.resolve()) in str(e.value) and field in str(e.value) and problem in str(e.value)


def test_missing_trace_is_reported_by_the_scenario() -> None:
    with pytest.raises(ConfigError, match=r"arrivals\.trace.*not found"):
        load_scenario(overrides={"arrivals": {"process": "trace", "trace": "no-such-trace"}})


def test_unknown_arrival_process_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="known: closed, poisson, requests, trace"):
        load_scenario(overrides={"arrivals": {"process": "diurnal"}})


def test_concurrency_trace_activates_devices_when_the_trace_says(det_scenario, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "c.csv", [(0, 0), (1.0, 3), (3.0, 1)])
    sc = det_scenario(
        arrivals={"process": "trace", "trace": trace, "kind": "concurrency"},
        workload={"duration_s": 6.0},
    )
    res = simulate(resolve_server(sc))
    resp = res.responses
    assert res.devices == 3  # the pool is the trace's peak
    assert resp.t_start.min() >= 1.0  # nobody starts before the target rises
    # after t=3 only device 0 may *start* a response (others finish the one they are in)
    late = resp[resp.t_start > 3.0 + 1e-9]
    assert not late.empty and set(late.device) == {0}
    early = resp[(resp.t_start >= 1.0) & (resp.t_start < 3.0)]
    assert set(early.device) == {0, 1, 2}


def test_poisson_sessions_arrive_at_the_rate(det_scenario) -> None:
    sc = det_scenario(arrivals={"process": "poisson", "rate": 20.0}, workload={"duration_s": 50.0})
    res = simulate(resolve_server(sc))
    started = res.responses[res.responses.t_start < 50.0]
    # Poisson count over 50 s at 20/s: mean 1000, sd 31.6
    assert abs(len(started) - 1000) < 4 * math.sqrt(1000)
    assert started.groupby("device").size().max() == 1  # one response per session
    gaps = np.diff(np.sort(started.t_start.to_numpy()))
    assert abs(gaps.mean() - 0.05) < 0.005 and abs(gaps.std() / gaps.mean() - 1.0) < 0.1  # exponential


def test_rate_trace_thins_to_the_traced_rate(det_scenario, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "r.csv", [(0, 0), (10.0, 10.0), (20.0, 0.0)])
    sc = det_scenario(
        arrivals={"process": "trace", "trace": trace, "kind": "rate"},
        workload={"duration_s": 30.0},
    )
    t = simulate(resolve_server(sc)).responses.t_start
    assert t.between(10.0, 20.0).all() and abs(len(t) - 100) < 4 * 10


def test_bursty_trace_has_the_spec_shape() -> None:
    df = bursty_trace()
    tr = ArrivalTrace(df.time_s.to_numpy(float), df.value.to_numpy(float), "bursty")
    peaks = trace_peaks(tr)
    assert peaks.peak_value.tolist() == [110, 155, 215] and peaks.peak_t.tolist() == [420, 960, 1440]
    quiet = df[(df.time_s < 350) | ((df.time_s > 600) & (df.time_s < 900)) | (df.time_s > 1650)]
    assert 8 <= quiet.value.min() <= 12 and 50 <= quiet.value.max() <= 60
    shipped = pd.read_csv(ROOT / "traces" / "bursty.csv")
    pd.testing.assert_frame_equal(shipped, df)  # the shipped file is the documented generator's output


# ------------------------------------------------------------------------------------------
# replicas and routers
# ------------------------------------------------------------------------------------------


def _routed(det_scenario, router: str, replicas: int = 2, **server):
    return det_scenario(
        devices={"count": 8},
        server={"replicas": replicas, "router": router, **server},
        workload={"duration_s": 3.0},
    )


def _rounds_with_replica(res) -> pd.DataFrame:
    rep = dict(zip(res.batches.batch, res.batches.replica, strict=True))
    return res.rounds.assign(replica=res.rounds.batch.map(rep))


def test_affinity_keeps_each_response_on_one_replica(det_scenario) -> None:
    res = simulate(resolve_server(_routed(det_scenario, "affinity")))
    r = _rounds_with_replica(res)
    assert r.groupby("response").replica.nunique().max() == 1
    assert set(r.replica) == {0, 1}
    assert r[r["round"] > 0].cold.sum() == 0  # the prefix is always where the response is


def test_round_robin_scatters_rounds_and_loses_the_cache(det_scenario) -> None:
    rr = _rounds_with_replica(simulate(resolve_server(_routed(det_scenario, "round-robin"))))
    aff = _rounds_with_replica(simulate(resolve_server(_routed(det_scenario, "affinity"))))
    assert rr.groupby("response").replica.nunique().max() == 2
    assert rr.cold.mean() > aff.cold.mean() + 0.2


def test_least_work_prefers_the_cached_replica_and_spreads_load(det_scenario) -> None:
    r = _rounds_with_replica(simulate(resolve_server(_routed(det_scenario, "least-work"))))
    assert set(r.replica) == {0, 1}
    assert r[r["round"] > 0].cold.mean() < 0.2


def test_replicas_have_their_own_profiles(det_scenario, tmp_path: Path) -> None:
    slow = str(write_profile(tmp_path / "slow.yaml", c=0.05))
    fast = str(write_profile(tmp_path / "fast.yaml"))
    res = simulate(resolve_server(_routed(det_scenario, "round-robin", replica_profiles=[fast, slow])))
    b = res.batches
    # no noise: each batch takes its replica's formula; the constant c differs by 0.04 s
    assert np.allclose(b[b.replica == 1].latency - b[b.replica == 1].t_hat, 0)
    c_fast = (b[b.replica == 0].latency - 1e-4 * b[b.replica == 0].n_linear).min()
    c_slow = (b[b.replica == 1].latency - 1e-4 * b[b.replica == 1].n_linear).min()
    assert c_slow - c_fast == pytest.approx(0.04, abs=1e-3)
    per = replica_summary(res)
    assert per.replica.tolist() == [0, 1] and (per.rounds > 0).all()


def test_replica_profiles_must_match_the_count(tiny_profile: str) -> None:
    with pytest.raises(ConfigError, match=r"replica_profiles.*2 profiles for 3 replicas"):
        load_scenario(
            overrides={
                "server": {"profile": tiny_profile, "replicas": 3, "replica_profiles": [tiny_profile] * 2}
            }
        )


def test_one_replica_is_unchanged_by_the_router_setting(det_scenario) -> None:
    a = simulate(resolve_server(_routed(det_scenario, "affinity", replicas=1)))
    b = simulate(resolve_server(_routed(det_scenario, "round-robin", replicas=1)))
    pd.testing.assert_frame_equal(a.rounds, b.rounds)


def test_centralized_replicas_place_whole_responses(det_scenario) -> None:
    sc = _routed(det_scenario, "least-work", replicas=3, mode="centralized")
    res = simulate(resolve_server(sc))
    assert set(res.batches.replica) == {0, 1, 2}
    assert summarize(res).gpu_utilization.max() <= 1.0


# ------------------------------------------------------------------------------------------
# time series and bursts
# ------------------------------------------------------------------------------------------


def test_burst_recovery_is_measured_from_the_peak() -> None:
    t = np.arange(10.0, 401.0, 10.0)
    comp = np.where((t > 120) & (t < 200), 0.5, 1.0)
    frame = pd.DataFrame({"t": t, "class": 4.0, "decided": 10, "violated": 0, "compliance": comp})
    peaks = pd.DataFrame({"peak_t": [100.0, 300.0], "peak_value": [50.0, 20.0]})
    out = burst_table(frame, peaks, 0.95, 400.0, window_s=60.0)
    first, second = out.iloc[0], out.iloc[1]
    assert first.recovery_s == 100.0 and first.trough == 0.5 and first.compliance_at_peak == 0.5
    assert second.recovery_s == 0.0 and second.trough == 1.0


def test_compliance_series_counts_decided_responses(det_scenario) -> None:
    res = simulate(resolve_server(det_scenario(devices={"count": 4}, workload={"duration_s": 20.0})))
    comp = compliance_series(res, step_s=5.0, window_s=5.0, min_responses=1)
    allc = comp[comp["class"].isna()]
    assert allc.decided.sum() == res.responses.measured.sum()  # windows tile the time axis
    assert ((allc.compliance >= 0) & (allc.compliance <= 1) | allc.compliance.isna()).all()


# ------------------------------------------------------------------------------------------
# CLI: run with arrivals, arrivals generate/show, plan
# ------------------------------------------------------------------------------------------


def test_cli_run_with_a_bursty_trace_writes_the_time_series(tmp_path: Path) -> None:
    trace = tmp_path / "mini.csv"
    runner = CliRunner()
    gen = ["arrivals", "generate", "--out", str(trace), "--duration", "120", "--low", "2", "--high", "6"]
    gen += ["--period", "120", "--peaks", "40:30", "--hold", "10", "--decay", "30"]
    r = runner.invoke(app, gen)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "mini.csv.meta.json").is_file()
    r = runner.invoke(app, ["arrivals", "show", str(trace)])
    assert r.exit_code == 0 and "40" in r.output
    out = tmp_path / "run"
    r = runner.invoke(app, ["run", "--arrivals", str(trace), "--tail", "30", "--step", "5", "-o", str(out)])
    assert r.exit_code == 0, r.output
    for f in ("timeseries.csv", "server_timeseries.csv", "bursts.csv", "compliance.png", "replicas.csv"):
        assert (out / f).is_file(), f
    ts = pd.read_csv(out / "server_timeseries.csv")
    assert ts.target.max() == 30 and ts.in_flight.max() >= 25
    sc = load_scenario(out / "scenario.yaml")
    assert sc.arrivals.process == "trace" and sc.workload.duration_s == 150.0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["run", "--arrivals", "nope.csv"],
            "--arrivals: arrivals.trace: arrival trace 'nope.csv' not found",
        ),
        (["run", "--arrivals", "poisson:-1"], "poisson:RATE needs a"),
        (["run", "--arrivals", "requests:nope.csv"], "request trace 'nope.csv' not found"),
        (["run", "--router", "random"], "unknown router 'random'"),
        (["plan", "--fleet", "2:x"], "expected CLASS:COUNT pairs"),
        (["arrivals", "generate", "--out", "x.csv", "--peaks", "a:b"], "expected TIME:VALUE pairs"),
    ],
)
def test_cli_bad_workload_options_are_one_line_errors(args: list[str], needle: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", *args], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_plan_finds_the_smallest_feasible_replica_count(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    args = ["plan", "--fleet", "4:60,8:60", "--start", "1", "--price-per-gpu-hour", "2.5", "-o", str(out)]
    args += ["--method", "full", "--set", "workload.warmup_s=5", "--set", "workload.duration_s=20"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    tried = pd.read_csv(out / "plan.csv").set_index("replicas")
    man = json.loads((out / "manifest.json").read_text())
    ans = man["replicas"]
    assert tried.loc[ans, "max_violation"] <= 0.05
    assert ans == 1 or tried.loc[ans - 1, "max_violation"] > 0.05  # the one below was tried and failed
    assert man["cost_per_hour"] == pytest.approx(2.5 * ans)
    assert len(pd.read_csv(out / "replicas.csv")) == ans


class FakeRunner:
    """Answers points without simulating: every device violates while R < need."""

    def __init__(self, need: int, jobs: int = 2) -> None:
        self.need, self.jobs, self.seen = need, jobs, []

    def map(self, points):
        from wispsim.study.points import PointResult

        out = []
        for p in points:
            r = p.scenario.server.replicas
            self.seen.append(r)
            counts = pd.concat(
                pd.DataFrame(
                    {"seed": seed, "device": [0, 1], "slo": [2.0, 8.0], "violated": [int(r < self.need)] * 2}
                )
                for seed in p.seeds
            )
            out.append(PointResult("k", pd.DataFrame({"seed": p.seeds}), counts.assign(responses=1)))
        return out


@pytest.mark.parametrize(
    ("need", "start", "jobs"), [(7, 1, 2), (7, 30, 2), (1, 4, 1), (23, 20, 2), (64, 3, 3)]
)
def test_plan_search_finds_the_threshold(need: int, start: int, jobs: int) -> None:
    from wispsim.study.replicas import plan_replicas

    runner = FakeRunner(need, jobs)
    res = plan_replicas(load_scenario(), runner, [0], 0.05, start=start, max_replicas=512)  # type: ignore[arg-type]
    assert res.replicas == need
    assert len(set(runner.seen)) == len(runner.seen)  # no replica count simulated twice
    assert len(runner.seen) <= 2 * math.ceil(math.log2(512)) + 2


def test_plan_reports_infeasible_up_to_the_limit() -> None:
    from wispsim.study.replicas import plan_replicas

    res = plan_replicas(load_scenario(), FakeRunner(1000), [0], 0.05, start=2, max_replicas=16)  # type: ignore[arg-type]
    assert res.replicas is None and res.tried.replicas.max() == 16
