"""``plan`` (wispsim.runs.plan) on tiny fleets: the tiny profile serves a few 1 token/s devices
on one replica, and no replica count serves a 55 token/s class (its devices top out near 50)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml

from wispsim.config import DeviceGroup
from wispsim.errors import ConfigError
from wispsim.runs.plan import PlanRequest, plan

ScenarioFile = Callable[..., Path]


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_full_search_finds_one_replica_and_prices_it(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    req = PlanRequest(
        scenario_file(),
        None,
        fleet=(DeviceGroup(count=3, slo=1.0),),
        method="full",
        max_replicas=2,
        price_per_gpu_hour=2.5,
        jobs=1,
    )
    o = plan(req, out=tmp_path / "plan")
    assert o.failed is None
    assert (o.plan.replicas, o.devices, o.gpus, o.gpu, o.price) == (1, 3, 1, "test", 2.5)
    assert o.method_line == "method: full-cluster search (--method full)"
    folder = tmp_path / "plan"
    assert {p.name for p in folder.iterdir()} == {
        "scenario.yaml",
        "plan.csv",
        "replicas.csv",
        "scenario-answer.yaml",
        "points",
        "manifest.json",
    }
    assert list(pd.read_csv(folder / "plan.csv").replicas) == [1]
    assert yaml.safe_load((folder / "scenario-answer.yaml").read_text())["server"]["replicas"] == 1
    m = manifest(folder)
    assert (m["replicas"], m["devices"], m["method"], m["fallback"]) == (1, 3, "full", None)
    assert (m["cost_per_hour"], m["seeds"], m["epsilon"]) == (2.5, [0], 0.05)


def test_auto_decomposes_and_confirms_on_the_whole_fleet(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    fleet = (DeviceGroup(count=4, slo=1.0), DeviceGroup(count=2, slo=2.0))
    o = plan(PlanRequest(scenario_file(), None, fleet=fleet, max_replicas=4, jobs=1), out=tmp_path / "plan")
    assert o.failed is None and o.plan.replicas == 1 and o.devices == 6
    assert o.method_line.startswith("method: decomposed")
    assert o.price is None  # the tiny profile has no price and none was given
    folder = tmp_path / "plan"
    assert (folder / "confirm.csv").is_file()
    m = manifest(folder)
    assert (m["method"], m["replicas"], m["confirmation"]) == ("decomposed", 1, "full cluster (6 devices)")
    assert "cost_per_hour" not in m


def _round_robin(scenario_file: ScenarioFile, tmp_path: Path):  # type: ignore[no-untyped-def]
    req = PlanRequest(
        scenario_file(),
        None,
        fleet=(DeviceGroup(count=2, slo=1.0),),
        router="round-robin",
        max_replicas=2,
        jobs=1,
    )
    return plan(req, out=tmp_path / "plan")


def test_auto_falls_back_to_the_full_search_and_says_why(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    o = _round_robin(scenario_file, tmp_path)
    assert o.plan.replicas == 1
    assert o.method_line.startswith("method: full-cluster search (fell back: server.router is 'round-robin'")
    m = manifest(tmp_path / "plan")
    assert (m["method"], m["router"]) == ("full", "round-robin")


def test_the_manifest_says_why_auto_fell_back(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    _round_robin(scenario_file, tmp_path)
    assert "server.router is 'round-robin'" in (manifest(tmp_path / "plan")["fallback"] or "")


def test_no_replica_count_that_serves_the_fleet_is_a_failure_with_its_folder(
    scenario_file: ScenarioFile, tmp_path: Path
) -> None:
    fleet = (DeviceGroup(count=3, slo=55.0),)
    req = PlanRequest(scenario_file(), None, fleet=fleet, method="full", max_replicas=2, jobs=1)
    o = plan(req, out=tmp_path / "plan")
    assert (
        o.failed
        == "plan: no replica count up to 2 keeps every class within 0.05 (infeasible up to 2 replicas)"
    )
    assert (o.plan.replicas, o.gpus) == (None, 0)
    folder = tmp_path / "plan"
    tried = pd.read_csv(folder / "plan.csv")
    assert list(tried.replicas) == [1, 2] and list(tried.max_violation) == [1.0, 1.0]
    assert not (folder / "scenario-answer.yaml").exists()
    assert manifest(folder)["replicas"] is None  # the folder is complete, with no answer


@pytest.mark.parametrize(
    ("change", "source", "words"),
    [
        ({"start": 3, "max_replicas": 2}, "--start", ("must be <= --max-replicas (2), got 3",)),
        ({"method": "fast"}, "--method", ("allowed: auto, decomposed, full",)),
        ({"method": "decomposed", "router": "least-work"}, "--method", ("decomposed does not hold",)),
        ({"backend": "slurm"}, "--backend", ("got 'slurm'",)),
        ({"fleet": (DeviceGroup(count=2, slo=500.0),)}, "--fleet", ("faster than any device",)),
    ],
)
def test_bad_requests_are_refused_before_any_work(
    scenario_file: ScenarioFile, tmp_path: Path, change: dict, source: str, words: tuple[str, ...]
) -> None:
    req = PlanRequest(**{"scenario": scenario_file(), "sets": None, "jobs": 1, **change})
    with pytest.raises(ConfigError) as info:
        plan(req, out=tmp_path / "plan")
    e = info.value
    assert e.source == source and "\n" not in str(e), str(e)
    for w in words:
        assert w in str(e), str(e)
    assert not (tmp_path / "plan").exists()


def test_a_profile_without_a_price_gets_its_gpus_public_price(
    scenario_file: ScenarioFile, tmp_path: Path
) -> None:
    """Issue 46: a planner who gives no price gets the shipped public on-demand price of the
    profile's GPU (wispsim/data/gpu_prices.yaml), and the manifest says where it came from."""
    from wispsim.model.prices import shipped_price

    path = scenario_file(
        server={"profile": "a100-qwen3-32b"}, workload={"output_tokens": {"dist": "constant", "value": 16}}
    )
    req = PlanRequest(
        path, None, fleet=(DeviceGroup(count=2, slo=1.0),), method="full", max_replicas=1, jobs=1
    )
    o = plan(req, out=tmp_path / "plan")
    assert o.failed is None and o.price == shipped_price("a100-80gb").usd_per_gpu_hour
    m = manifest(tmp_path / "plan")
    assert m["price_source"].startswith("specialty") and m["cost_per_hour"] == pytest.approx(o.price)
