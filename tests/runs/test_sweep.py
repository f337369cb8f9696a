"""``sweep``, ``compare``, ``ablate predictor`` and ``estimator compare`` (wispsim.runs.sweep) on
a tiny grid: the deterministic scenario meets a 1 token/s class at every N and never a 55 token/s
one (its devices top out near 50), so every capacity is known before the run."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

import wispsim.study.points as points_mod
from wispsim.config.limits import MAX_SEED
from wispsim.errors import ConfigError
from wispsim.runs.sweep import SweepRequest, ablate_predictor, estimator_compare, sweep

ScenarioFile = Callable[..., Path]


def request(f: Path, policies: list[str], **kw: object) -> SweepRequest:
    """Two seeds on the grid 1..3, nothing searched past it, points run in this process."""
    base: dict[str, object] = {"grid": (1, 2, 3), "seeds": 2, "jobs": 1, "start": 1, "max_devices": 3}
    return SweepRequest(f, None, policies, **{**base, **kw})  # type: ignore[arg-type]


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_sweep_over_a_grid_returns_every_point_in_order(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    f = scenario_file(devices={"classes": [1.0, 55.0]})
    progress: list[tuple[int, int | None, str]] = []
    o = sweep(request(f, ["custom"]), "sweep", out=tmp_path / "sweep", report=lambda *a: progress.append(a))
    assert o.speedups is None
    cap = o.result.capacity
    assert list(cap["class"].astype(str)) == ["1", "55"]
    assert list(cap.capacity) == [3, 0] and list(cap.saturated) == [True, False]
    curve = o.result.curve
    got = list(zip(curve.group.astype(str), curve.devices, curve.seed, strict=True))
    assert got == [(g, n, s) for g in ("1", "55") for n in (1, 2, 3) for s in (0, 1)]
    assert list(curve.violation_rate) == [0.0] * 6 + [1.0] * 6
    # the grid's 6 points (one per class and N, both seeds together) counted up; both searches
    # answered once the grid is back (it brackets neither class's capacity further)
    assert [p[:2] for p in progress] == [(i, 6) for i in range(7)]
    assert progress[0][2] == "sweep custom, 0/2 capacities found, N values simulated"
    assert progress[-1][2] == "sweep custom, 2/2 capacities found, N values simulated"
    folder = tmp_path / "sweep"
    assert {p.name for p in folder.iterdir()} == {
        "scenario.yaml",
        "capacity.csv",
        "curve.csv",
        "curve_pooled.csv",
        "points",
        "manifest.json",
    }
    assert len(list((folder / "points").iterdir())) == 6
    m = manifest(folder)
    assert (m["policies"], m["mix"], m["classes"], m["seeds"]) == (
        ["custom"],
        "separate",
        [1.0, 55.0],
        [0, 1],
    )
    assert (m["grid"], m["start"], m["max_devices"], m["epsilon"]) == ([1, 2, 3], 1, 3, 0.05)
    pd.testing.assert_frame_equal(pd.read_csv(folder / "capacity.csv", dtype={"class": str}), cap)


def test_a_shared_mix_is_one_group_of_every_class(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    f = scenario_file(devices={"classes": [1.0, 2.0]})
    o = sweep(request(f, ["custom"], mix="shared", seeds=1), "sweep", out=tmp_path / "sweep")
    assert list(o.result.capacity["class"]) == ["mix:1,2"]
    assert sorted(o.result.curve["class"].astype(str).unique()) == ["1", "2", "all"]
    assert manifest(tmp_path / "sweep")["mix"] == "shared"


def test_a_rerun_into_the_same_folder_simulates_nothing_again(
    scenario_file: ScenarioFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = scenario_file(devices={"classes": [1.0, 55.0]})
    first = sweep(request(f, ["custom"], seeds=1), "sweep", out=tmp_path / "sweep")

    def never(*args, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("a stored point was simulated again")

    monkeypatch.setattr(points_mod, "Run", never)
    again = sweep(request(f, ["custom"], seeds=1), "sweep", out=tmp_path / "sweep")
    pd.testing.assert_frame_equal(again.result.capacity, first.result.capacity)
    pd.testing.assert_frame_equal(again.result.curve, first.result.curve)


def test_compare_writes_each_policys_scenario_and_the_speedups(
    scenario_file: ScenarioFile, tmp_path: Path
) -> None:
    req = request(scenario_file(), ["wisp", "fcfs"], classes=(1.0,), grid=(1, 2), max_devices=2, seeds=1)
    o = sweep(req, "compare", out=tmp_path / "compare")
    assert o.speedups is not None
    assert list(o.speedups.columns) == ["class", "wisp", "fcfs", "wisp/fcfs"]
    assert o.speedups[["wisp", "fcfs", "wisp/fcfs"]].to_numpy().tolist() == [[2, 2, 1.0]]
    folder = tmp_path / "compare"
    for p in ("wisp", "fcfs"):
        assert f"policy: {p}" in (folder / f"scenario-{p}.yaml").read_text()
    assert not (folder / "scenario.yaml").exists()
    assert (folder / "compare.csv").is_file()
    assert manifest(folder)["policies"] == ["wisp", "fcfs"]


@pytest.mark.parametrize(
    ("change", "source", "words"),
    [
        ({"mix": "both"}, "--mix", ("allowed: separate, shared",)),
        ({"records": "some"}, "--records", ("allowed: none, responses, all",)),
        ({"start": 4, "max_devices": 3}, "--start", ("must be <= --max-devices (3)",)),
        ({"backend": "slurm"}, "--backend", ("got 'slurm'",)),
        ({"address": "head:6379"}, "--address", ("only with --backend ray",)),
        ({"seed": MAX_SEED}, "--seed", ("past the largest seed",)),
        ({"classes": (500.0,)}, "--classes", ("500 tokens/s is faster than any device",)),
        ({"policies": ["nope"]}, "--policy", ("unknown policy 'nope'",)),
    ],
)
def test_bad_requests_are_refused_before_any_work(
    scenario_file: ScenarioFile, tmp_path: Path, change: dict, source: str, words: tuple[str, ...]
) -> None:
    req = request(scenario_file(), change.pop("policies", ["custom"]), **change)
    with pytest.raises(ConfigError) as info:
        sweep(req, "sweep", out=tmp_path / "sweep")
    e = info.value
    assert e.source == source and "\n" not in str(e), str(e)
    for w in words:
        assert w in str(e), str(e)
    assert not (tmp_path / "sweep").exists()


def test_ablation_runs_both_arms_at_each_n(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    o = ablate_predictor(
        scenario_file(), None, (1.0,), [1, 2], 1, None, 1, "local", None, out=tmp_path / "abl"
    )
    folder = tmp_path / "abl"
    assert {p.name for p in folder.iterdir()} == {
        "scenario.yaml",
        "ablation_per_seed.csv",
        "ablation.csv",
        "points",
        "manifest.json",
    }
    per_seed = pd.read_csv(folder / "ablation_per_seed.csv")
    assert list(zip(per_seed.predictor, per_seed.devices, strict=True)) == [
        ("on", 1),
        ("on", 2),
        ("off", 1),
        ("off", 2),
    ]
    t = o.result
    assert list(t.devices) == [1, 2]
    # every drafted token is accepted: nothing wasted, the same goodput with or without it
    assert list(t.acceptance_ratio_on) == [1.0, 1.0] and list(t.acceptance_ratio_off) == [1.0, 1.0]
    assert list(t.wasted_tokens_on) == [0.0, 0.0] and list(t.goodput_gain) == [1.0, 1.0]
    assert (t.mean_k_on > t.mean_k_off).all()  # the predictor drafts further when all is accepted
    m = manifest(folder)
    assert (m["devices"], m["seeds"], m["first_seed"], m["acceptance"]) == ([1, 2], 1, 0, "test-all")


def test_ablation_refuses_a_bad_backend_before_any_work(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--backend: got 'slurm'"):
        ablate_predictor(scenario_file(), None, None, [1], 1, None, 1, "slurm", None, out=tmp_path / "abl")
    assert not (tmp_path / "abl").exists()


def test_estimator_compare_fits_and_replays_a_measured_profile(
    scenario_file: ScenarioFile, tmp_path: Path
) -> None:
    f = scenario_file()
    req = SweepRequest(f, None, ["custom"], grid=(1, 2), seeds=1, jobs=1, start=1, max_devices=2)
    o = estimator_compare(req, "cpu-vllm-mini-inproc", "measured", out=tmp_path / "est")
    assert o.profile == "cpu-vllm-mini-inproc"
    cap = o.capacity
    assert list(zip(cap.latency_model, cap.capacity, strict=True)) == [("linear", 2), ("measured", 2)]
    assert list(o.compare["measured/linear"]) == [1.0]
    folder = tmp_path / "est"
    assert (folder / "scenario-linear.yaml").is_file() and (folder / "scenario-measured.yaml").is_file()
    m = manifest(folder)
    assert (m["profile"], m["policy"], m["measured"]) == ("cpu-vllm-mini-inproc", "custom", "measured")


def test_estimator_compare_refusals(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    req = SweepRequest(scenario_file(), None, ["custom"], grid=(1,), seeds=1, jobs=1, start=1, max_devices=1)
    with pytest.raises(ConfigError) as info:
        estimator_compare(req, None, "exact", out=tmp_path / "est")
    assert str(info.value) == "--measured: got 'exact'; allowed: measured, measured-nearest"
    with pytest.raises(ConfigError) as info:  # the file's tiny profile is derived, not measured
        estimator_compare(req, None, "measured", out=tmp_path / "est")
    e = info.value
    assert (e.source, e.field) == ("profile 'test-tiny'", "provenance.kind")
    assert "is derived; compare needs a measured one" in str(e)
    assert not (tmp_path / "est").exists()
