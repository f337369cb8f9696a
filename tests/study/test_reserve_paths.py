"""``server.engine.activation_reserve_gib`` sizes the KV cache alike on every path: unset, vLLM's
start-up profile at the scenario's engine limits (wispsim/model/startup.py); set, that many GiB per
GPU. run, replay, bench and serve each take the capacity from ``kv_capacity``."""

from __future__ import annotations

from pathlib import Path

import pytest

from wispsim.model.memory import kv_capacity, reserve_gib
from wispsim.model.profiles import load_profile
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate

SHORT = {"workload": {"warmup_s": 1, "duration_s": 4}}


def _scenario(reserve: float | None, profile: str = "a100-qwen3-32b"):
    return load_scenario(
        overrides={**SHORT, "server": {"profile": profile, "activation_reserve_gib": reserve}}
    ).with_devices(20)


@pytest.mark.parametrize("reserve", [None, 3.0])
def test_run_sizes_the_cache_by_the_reserve(reserve: float | None) -> None:
    sc = _scenario(reserve)
    prof = load_profile(sc.server.profile)
    cap = resolve_server(sc).capacities[0]
    assert cap == kv_capacity(sc.server, prof)
    expected = 1.6 if reserve is None else reserve  # Qwen3-32B at 256 seqs, 2,048 tokens: 1.60 GiB
    assert reserve_gib(sc.server, prof) == pytest.approx(expected, abs=0.01)
    assert cap == prof.kv_capacity_tokens(0.9, reserve_gib(sc.server, prof))


def test_run_tells_a_set_reserve_from_the_derived_one() -> None:
    derived, fixed = (resolve_server(_scenario(r)).capacities[0] for r in (None, 3.0))
    assert fixed < derived - 5_000  # 1.4 GiB more reserved: ~5,700 tokens of 256 KiB


@pytest.mark.parametrize("reserve", [None, 3.0])
def test_replay_keeps_the_recorded_reserve(reserve: float | None, tmp_path: Path) -> None:
    from wispsim.study.replay.drive import log_scenario
    from wispsim.study.replay.log import write_log
    from wispsim.study.replay.read import read_log

    resolved = resolve_server(_scenario(reserve))
    path = write_log(simulate(resolved, seed=0), tmp_path / "log.csv")
    _, meta = read_log(path)
    replayed = log_scenario(meta, "meta")
    assert replayed.server.engine.activation_reserve_gib == reserve
    assert resolve_server(replayed).capacities == resolved.capacities


def test_bench_honours_a_reserve_set_in_its_overrides() -> None:
    from dataclasses import replace

    from wispsim.study.bench import BenchRun, bench_scenario

    prof = load_profile("h100-qwen3-32b")
    run = BenchRun(num_prompts=4, input_lens=[100], output_lens=[10], max_num_seqs=256, block_size=16)
    derived = bench_scenario(prof, run).capacities[0]
    fixed = bench_scenario(prof, replace(run, overrides={"server": {"activation_reserve_gib": 3.0}}))
    assert fixed.scenario.server.engine.activation_reserve_gib == 3.0
    assert fixed.capacities[0] == prof.kv_capacity_tokens(0.9, 3.0) // 16 * 16 < derived


@pytest.mark.parametrize("reserve", [None, 3.0])
def test_serve_sizes_its_scheduler_by_the_reserve_where_the_engine_reports_no_cache(
    reserve: float | None,
) -> None:
    """An engine that reports its own cache is taken at its word; one that does not (a backend
    without one) gets the scenario's capacity, reserve and all."""
    pytest.importorskip("fastapi")
    from dataclasses import replace

    from fastapi.testclient import TestClient

    from tests.serve.test_serve import FACTS, FakeBackend, scenario
    from wispsim.serve.app import make_app

    base = scenario()
    engine = replace(base.server.engine, activation_reserve_gib=reserve)
    sc = base.replace(server=replace(base.server, engine=engine))
    app = make_app(sc, FakeBackend(), {**FACTS, "kv_capacity_tokens": None})
    with TestClient(app):
        memory = app.state.verifier().memory
        cap = kv_capacity(sc.server, load_profile(sc.server.profile))
        assert memory.total_blocks == cap // memory.block_size
