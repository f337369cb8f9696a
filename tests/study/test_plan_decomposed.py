"""Decomposed cluster sizing (`wispsim plan --method`): a replica's share, the search for the
most devices one replica serves, the confirmation behind the real router, and the fallbacks."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import ROOT
from wispsim.errors import ConfigError
from wispsim.model.fleet import device_specs, fleet_size
from wispsim.sim.scenarios import load_scenario
from wispsim.study.cluster import choose_method, plan_cluster
from wispsim.study.decompose import share_counts, share_scenario
from wispsim.study.points import PointResult

FLEET_2000 = ROOT / "scenarios" / "fleet-2000.yaml"


# ------------------------------------------------------------------------------------------
# a replica's share
# ------------------------------------------------------------------------------------------


def test_share_of_87_devices_of_fleet_2000_by_largest_remainder() -> None:
    # quotas 13.05, 13.05, 8.7, 8.7, 17.4, 13.05, 13.05: floors sum to 85, the two 0.7s get one more
    assert share_counts([300, 300, 200, 200, 400, 300, 300], 87) == [13, 13, 9, 9, 17, 13, 13]
    assert share_counts([300, 300, 200, 200, 400, 300, 300], 2000) == [300, 300, 200, 200, 400, 300, 300]


def test_a_small_group_keeps_one_device() -> None:
    # quota 0.087: the group still gets one device, the big group gives it back
    assert share_counts([10, 9990], 87) == [1, 86]
    assert share_counts([1, 1, 998], 3) == [1, 1, 1]
    assert share_counts([0, 5, 0, 5], 4) == [0, 2, 0, 2]  # empty groups stay empty
    with pytest.raises(ValueError, match="one of each of 3 groups"):
        share_counts([1, 1, 998], 2)


@given(
    st.lists(st.integers(0, 5000), min_size=1, max_size=9).filter(lambda c: sum(c) > 0),
    st.integers(1, 10_000),
)
def test_share_counts_keep_every_groups_proportion(counts: list[int], n: int) -> None:
    groups = sum(c > 0 for c in counts)
    n = max(n, groups)
    out = share_counts(counts, n)
    total = sum(counts)
    quota = [c * n / total for c in counts]
    assert sum(out) == n
    assert all((o >= 1) == (c > 0) for o, c in zip(out, counts, strict=True))  # every group, no other
    if all(q >= 1 for q, c in zip(quota, counts, strict=True) if c > 0):  # largest remainder
        assert all(math.floor(q) <= o <= math.ceil(q) for o, q in zip(out, quota, strict=True))
    else:  # a group below one device's quota gets one; the others pay for it, none goes above
        assert all(o == 1 for o, q, c in zip(out, quota, counts, strict=True) if 0 < q < 1 and c > 0)
        assert all(o <= max(1, math.ceil(q)) for o, q in zip(out, quota, strict=True))


def test_share_scenario_carries_the_mix_and_a_poisson_share_of_the_rate() -> None:
    sc = load_scenario(FLEET_2000)
    share = share_scenario(sc, 87)
    specs = device_specs(share, 87)
    got = pd.Series([s.group for s in specs]).value_counts().to_dict()
    assert got == {"phone-2": 13, "phone-4": 13, "phone-6": 9, "laptop-2": 9, "laptop-4": 17, "laptop-6": 13,
                   "laptop-8": 13}  # fmt: skip
    assert share.server.replicas == 1 and fleet_size(share) == 87
    open_ = sc.replace(arrivals=sc.arrivals.__class__(process="poisson", rate=40.0))
    assert share_scenario(open_, 100).arrivals.rate == pytest.approx(40.0 * 100 / 2000)
    three = share_scenario(sc, 3 * 87, replicas=3)
    assert three.server.replicas == 3 and fleet_size(three) == 261


# ------------------------------------------------------------------------------------------
# where the decomposition holds
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"server": {"router": "least-work"}}, "server.router is 'least-work'"),
        ({"server": {"router": "round-robin"}}, "server.router is 'round-robin'"),
        ({"arrivals": {"process": "trace", "trace": "bursty"}}, "arrivals.process is 'trace'"),
        (
            {"server": {"replicas": 2, "replica_profiles": ["a100-qwen3-32b-paper", "a100-qwen3-14b-paper"]}},
            "server.replica_profiles",
        ),
    ],
)
def test_auto_falls_back_to_the_full_search_and_says_why(overrides: dict, needle: str) -> None:
    sc = load_scenario(overrides=overrides)
    method, why = choose_method(sc, "auto")
    assert method == "full" and why is not None and needle in why
    assert choose_method(sc, "full") == ("full", None)
    with pytest.raises(ConfigError, match=r"--method: decomposed does not hold: .*use --method full"):
        choose_method(sc, "decomposed")


@pytest.mark.parametrize("process", ["closed", "poisson"])
def test_affinity_with_closed_or_poisson_arrivals_decomposes(process: str) -> None:
    sc = load_scenario(overrides={"arrivals": {"process": process}})
    assert choose_method(sc, "auto") == ("decomposed", None)
    assert choose_method(sc, "decomposed") == ("decomposed", None)
    with pytest.raises(ConfigError, match="--method: got 'fast'; allowed: auto, decomposed, full"):
        choose_method(sc, "fast")


def test_cli_decomposed_with_least_work_is_a_one_line_error(tmp_path: Path) -> None:
    args = ["plan", "--fleet", "4:6", "--router", "least-work", "--method", "decomposed", "-o", "out"]
    r = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", *args], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--method: decomposed does not hold: server.router is 'least-work'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("router", ["round-robin", "least-work"])
def test_cli_auto_prints_why_it_fell_back(router: str, tmp_path: Path) -> None:
    args = ["plan", "--fleet", "4:4", "--router", router, "--max-replicas", "1", "-j", "1", "-o", "out"]
    args += ["--set", "workload.warmup_s=1", "--set", "workload.duration_s=4"]
    r = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", *args], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [s for s in r.stdout.splitlines() if "fell back" in s]
    assert len(lines) == 1 and f"server.router is '{router}'" in lines[0]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["method"] == "full"


# ------------------------------------------------------------------------------------------
# the search and the confirmation, on a runner that answers without simulating
# ------------------------------------------------------------------------------------------


class LoadRunner:
    """Every device violates when its replica carries more than ``alone`` devices (one replica)
    or ``routed`` devices (several behind the router): the router can be worse or better."""

    def __init__(self, alone: float, routed: float, jobs: int = 2) -> None:
        self.alone, self.routed, self.jobs = alone, routed, jobs
        self.seen: list[tuple[int, int]] = []  # (replicas, devices)

    def map(self, points):
        out = []
        for p in points:
            r = p.scenario.server.replicas
            self.seen.append((r, p.devices))
            cap = self.alone if r == 1 else self.routed
            bad = int(p.devices / r > cap)
            counts = pd.concat(
                pd.DataFrame(
                    {
                        "seed": seed,
                        "device": [0, 1],
                        "slo": [2.0, 8.0],
                        "violated": [bad, bad],
                        "responses": 1,
                    }
                )
                for seed in p.seeds
            )
            out.append(PointResult("k", pd.DataFrame({"seed": p.seeds}), counts))
        return out


@pytest.mark.parametrize(
    ("n", "alone", "routed", "decomposed", "answer"),
    [
        (2000, 87, 87, 23, 23),  # the router matches one replica: confirmed as it is
        (2000, 92, 87, 22, 23),  # the router piles sessions up: the full cluster searches up
        (2000, 87, 91, 23, 22),  # the router pools: the full cluster searches down
        (100, 10, 10, 10, 10),
        (7, 50, 50, 1, 1),  # one replica holds the whole fleet
    ],
)
def test_decomposed_search_and_full_confirmation(
    n: int, alone: int, routed: int, decomposed: int, answer: int
) -> None:
    sc = load_scenario(
        overrides={"devices": {"groups": [{"count": n - n // 2, "slo": 2}, {"count": n // 2, "slo": 8}]}}
    )
    runner = LoadRunner(alone, routed)
    res = plan_cluster(sc, runner, [0], 0.05, max_replicas=4096, confirm_devices=n)  # type: ignore[arg-type]
    assert res.method == "decomposed" and res.share == min(alone, n)
    assert (res.decomposed, res.replicas) == (decomposed, answer)
    assert res.confirmation == f"full cluster ({n} devices)"
    # nothing simulated twice (but the whole fleet on one replica: the search's point is stored)
    dups = len(runner.seen) - len(set(runner.seen))
    assert dups == 0 or (dups == 1 and runner.seen.count((1, n)) == 2)
    singles = [d for r, d in runner.seen if r == 1 and d < n]
    assert len(singles) <= 2 * math.ceil(math.log2(n)) + 2


def test_a_large_fleet_is_confirmed_on_a_slice() -> None:
    n = 100_000
    sc = load_scenario(
        overrides={"devices": {"groups": [{"count": n // 2, "slo": 2}, {"count": n // 2, "slo": 8}]}}
    )
    runner = LoadRunner(92, 90)
    res = plan_cluster(sc, runner, [0], 0.05, max_replicas=4096, confirm_devices=2000)  # type: ignore[arg-type]
    assert (res.share, res.decomposed) == (92, math.ceil(n / 92))
    assert res.confirmation.startswith("slice of 21 replicas")  # 2000 // 93
    assert res.replicas == math.ceil(n / 90)  # the slice serves 90 devices per replica
    assert res.confirm is not None
    assert set(res.confirm.simulated_replicas) == {21} and res.confirm.simulated_devices.max() < 2000
    assert all(d <= 2000 or r == 1 for r, d in runner.seen)  # no simulation holds the fleet


def test_infeasible_below_one_device_of_each_kind() -> None:
    sc = load_scenario(overrides={"devices": {"groups": [{"count": 50, "slo": 2}, {"count": 50, "slo": 8}]}})
    res = plan_cluster(sc, LoadRunner(1, 1), [0], 0.05, max_replicas=512)  # type: ignore[arg-type]
    assert res.replicas is None and "cannot serve 2 devices (one of each kind" in res.notes[0]


# ------------------------------------------------------------------------------------------
# end to end: both methods on a small fleet
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_decomposed_and_full_agree_within_one_replica(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from wispsim.cli.main import app

    common = ["plan", "--fleet", "4:60,8:60", "--start", "1", "-j", "2"]
    common += ["--set", "workload.warmup_s=5", "--set", "workload.duration_s=20"]
    got = {}
    for method in ("decomposed", "full"):
        out = tmp_path / method
        r = CliRunner().invoke(app, [*common, "--method", method, "-o", str(out)])
        assert r.exit_code == 0, r.output
        got[method] = json.loads((out / "manifest.json").read_text())
    dec, full = got["decomposed"], got["full"]
    assert dec["method"] == "decomposed" and full["method"] == "full"
    assert dec["confirmation"] == "full cluster (120 devices)"
    assert abs(dec["decomposed_replicas"] - full["replicas"]) <= 1
    assert dec["replicas"] == full["replicas"]  # the full-cluster confirmation settles it
