"""``server.planning_profile``: the scheduler plans with one profile, the batches take the time
another one (``server.profile``) gives -- a real server configured with a profile its engine does
not follow (issue 30: the validation's re-priced simulations plan as the real server did)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import B_COMPUTE, B_READ, deterministic_overrides, write_profile
from wispsim.errors import ConfigError
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate

SLOW = {"a": 2e-3, "c": 0.03}  # the engine's true cost (per token 2 ms, per batch 30 ms)
FAST = {"a": 2e-4, "c": 0.005}  # what the server was configured to believe


def _run(tmp_path: Path, planning: str | None) -> tuple[Any, Path, Path]:
    true = write_profile(tmp_path / "slow.yaml", **SLOW)
    fast = write_profile(tmp_path / "fast.yaml", **FAST)
    srv = {"scheduler": "wisp"} | ({"planning_profile": str(fast)} if planning == "fast" else {})
    over = deterministic_overrides(
        str(true),
        devices={"count": 24, "classes": [8.0], "start_spread_s": 0.5},
        server=srv,
        workload={"duration_s": 6.0, "warmup_s": 1.0},
    )
    path = tmp_path / f"sc-{planning}.yaml"
    path.write_text(yaml.safe_dump(over))
    res = simulate(resolve_server(load_scenario(str(path))))
    return res, true, fast


def _estimate(coefs: dict[str, float], b: Any) -> float:
    return coefs["c"] + coefs["a"] * b.n_linear + B_COMPUTE * b.n_interactions + B_READ * b.n_cached


def test_batches_take_the_true_time_and_record_the_planners_estimate(tmp_path: Path) -> None:
    res, _, _ = _run(tmp_path, "fast")
    b = res.batches
    assert len(b) > 20
    for row in b.itertuples():  # noise off: the true time is the slow profile's estimate exactly
        assert row.latency == pytest.approx(_estimate(SLOW, row), rel=1e-9)
        assert row.t_hat == pytest.approx(_estimate(FAST, row), rel=1e-9)
    same, _, _ = _run(tmp_path, None)
    assert (same.batches.t_hat == same.batches.latency).all()  # no planning profile: one estimator


def test_a_cheaper_plan_makes_wisp_form_larger_batches(tmp_path: Path) -> None:
    """WISP fits rounds into a batch while their deadlines allow by its estimate: believing
    batches cheaper than they are, it packs more rounds into each (what the real server did)."""
    fast, _, _ = _run(tmp_path, "fast")
    honest, _, _ = _run(tmp_path, None)
    assert fast.batches["size"].mean() > 1.2 * honest.batches["size"].mean()  # 11.4 against 8.8


def test_an_unknown_planning_profile_is_a_one_line_error(tmp_path: Path) -> None:
    profile = str(write_profile(tmp_path / "p.yaml"))
    over = deterministic_overrides(profile, server={"planning_profile": "nope"})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(over))
    with pytest.raises(ConfigError) as e:
        resolve_server(load_scenario(str(path)))
    assert "server.planning_profile" in str(e.value) and "\n" not in str(e.value)
