"""What ``sweep`` and ``compare`` take from a scenario: its own policy when ``--policy`` is not
given, ``--set`` checked against every policy's preset (as ``run`` checks it), and a fleet of
device groups refused by name (a point at N devices would drop the groups' devices and links)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import run_wispsim as wispsim


@pytest.mark.slow  # subprocess simulations; the refusals beside it stay quick
def test_sweep_sizes_the_scenarios_own_policy(tmp_path: Path) -> None:
    f = tmp_path / "sled.yaml"
    f.write_text("policy: sled\n")
    out = tmp_path / "s"
    r = wispsim("sweep", str(f), "--classes", "8", "--seeds", "1", "--jobs", "1",
                "--set", "workload.duration_s=30", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-600:]
    assert "capacity (sled)" in r.stdout
    assert json.loads((out / "manifest.json").read_text())["policies"] == ["sled"]
    assert "policy: sled" in (out / "scenario.yaml").read_text()


def test_a_set_the_policy_would_override_is_refused_as_run_refuses_it(tmp_path: Path) -> None:
    for args in (
        ("sweep", "--policy", "sled", "--set", "server.engine.enable_prefix_caching=true"),
        ("compare", "--policies", "wisp,sled", "--set", "server.scheduler=wisp"),
        ("run", "--policy", "sled", "--set", "server.engine.enable_prefix_caching=true"),
    ):
        r = wispsim(*args, "--out", str(tmp_path / args[0]))
        assert r.returncode == 2, r.stderr[-600:]
        assert r.stderr.startswith("error: --set: server.") and "conflicts with policy sled" in r.stderr
        assert r.stderr.count("\n") == 1


def test_a_fleet_of_groups_is_refused_by_sweep_and_compare(tmp_path: Path) -> None:
    for cmd in ("sweep", "compare"):
        r = wispsim(cmd, "fleet-2000", "--out", str(tmp_path / cmd))
        assert r.returncode == 2 and "devices.groups" in r.stderr and "wispsim plan" in r.stderr
        assert not (tmp_path / cmd / "manifest.json").exists()


@pytest.mark.slow  # subprocess simulations; the refusals beside it stay quick
def test_a_damaged_stored_point_is_simulated_again_and_the_manifest_names_the_code(tmp_path: Path) -> None:
    f = tmp_path / "sled.yaml"
    f.write_text("policy: sled\n")
    out = tmp_path / "s"
    args = (
        "sweep",
        str(f),
        "--classes",
        "8",
        "--seeds",
        "1",
        "--jobs",
        "1",
        "--set",
        "workload.duration_s=30",
    )
    assert wispsim(*args, "--out", str(out)).returncode == 0
    curve = (out / "curve.csv").read_text()
    points = sorted((out / "points").iterdir())
    (points[0] / "summary.csv").write_text("a,b\n1,2\n")  # parses, but is not a point's table
    (points[1] / "devices.csv").write_bytes(b"\xff\xfe\x00garbage")  # not text
    r = wispsim(*args, "--out", str(out))
    assert r.returncode == 0, r.stderr[-600:]
    assert (out / "curve.csv").read_text() == curve  # the damaged points were simulated again
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["commit"] and sum(manifest["point_commits"].values()) >= len(points)


def test_a_folder_of_another_commands_results_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    run = ("run", "--devices", "5", "--set", "workload.duration_s=5", "--out", str(out))
    assert wispsim(*run).returncode == 0
    assert json.loads((out / "manifest.json").read_text())["results_of"] == "run"
    r = wispsim("sweep", "--classes", "8", "--seeds", "1", "--out", str(out))
    assert r.returncode == 2 and "holds the results of `wispsim run`" in r.stderr
    assert wispsim(*run).returncode == 0  # the same command replaces its own results


@pytest.mark.slow  # subprocess simulations; the refusals beside it stay quick
def test_a_capacity_on_a_handful_of_responses_says_so(tmp_path: Path) -> None:
    f = tmp_path / "sled.yaml"
    f.write_text("policy: sled\n")
    r = wispsim("sweep", str(f), "--classes", "8", "--seeds", "1", "--jobs", "1",
                "--set", "workload.duration_s=30", "--out", str(tmp_path / "s"))  # fmt: skip
    assert r.returncode == 0 and "note: sled at 8 tok/s rests on" in r.stdout
