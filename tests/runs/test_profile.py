"""``profile fit`` of a deployment (wispsim.runs.profile): a swarm or validate folder's batch
logs written as the measurement CSV beside the new profile, with the served profile's facts."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.support import ROOT
from wispsim.errors import ConfigError, WispsimError
from wispsim.runs.profile import deployment_recording

SERVED = "cpu-vllm-mini-inproc"  # a shipped measured profile with its recording's sidecar


def deployment(root: Path, profile: str | None = SERVED) -> Path:
    """A folder as ``wispsim swarm`` leaves it: one server's batch logs (two verification
    batches of two and one members, and a batch of another kind) and the scenario it served."""
    point = root / "server-0"
    point.mkdir(parents=True)
    batches = pd.DataFrame(
        {"batch": [0, 1, 2], "kind": ["verify", "prefill", "verify"], "latency": [0.1, 0.5, 0.2]}
    )
    members = pd.DataFrame(
        {
            "batch": [0, 0, 2],
            "round": [0, 0, 1],
            "l_new": [3, 5, 4],
            "l_cached": [0, 10, 20],
            "l_new_plan": [3, 5, 4],
            "l_cached_plan": [0, 10, 20],
        }
    )
    batches.to_parquet(point / "server_batches.parquet")
    members.to_parquet(point / "server_members.parquet")
    if profile is not None:
        (point / "scenario.yaml").write_text(yaml.safe_dump({"server": {"profile": profile}}))
    return root


def test_the_batch_logs_become_a_recording_beside_the_new_profile(tmp_path: Path) -> None:
    root = deployment(tmp_path / "swarm")
    out = tmp_path / "profiles" / "deployed.yaml"
    csv, logs, served = deployment_recording(root, out, seed=0, kind="verify")
    assert (csv, logs, served) == (tmp_path / "profiles" / "data" / "deployed.csv", 1, SERVED)
    rows = pd.read_csv(csv)
    assert list(rows.config_id) == ["0-0", "0-2"]  # the verification batches with members
    assert list(rows.batch_size) == [2, 1]
    assert list(rows.n_linear) == [8, 4] and list(rows.n_cached) == [10, 20]
    assert list(rows.n_interactions) == [3 * 3 + 15 * 5, 24 * 4]  # (new + cached) x new, summed
    assert list(rows.latency_s) == [0.1, 0.2] and set(rows.category) == {"deployment"}
    meta = json.loads(Path(f"{csv}.meta.json").read_text())
    assert meta["deployment"]["batches"] == 2 and meta["deployment"]["kind"] == "verify"
    assert meta["deployment"]["batch_logs"] == [str(root / "server-0")]
    served_meta = json.loads((ROOT / "profiles" / "data" / f"{SERVED}.csv.meta.json").read_text())
    assert meta["model_facts"] == served_meta["model_facts"]  # taken from the served profile


def test_a_log_without_the_served_scenario_is_refused(tmp_path: Path) -> None:
    root = deployment(tmp_path / "swarm", profile=None)
    with pytest.raises(ConfigError) as info:
        deployment_recording(root, tmp_path / "p.yaml", 0, "verify")
    e = info.value
    assert (e.source, e.field) == (str(root / "server-0"), "scenario.yaml")
    assert "missing" in str(e) and "\n" not in str(e)


def test_a_served_profile_without_a_recording_sidecar_is_refused(tmp_path: Path, tiny_profile: str) -> None:
    root = deployment(tmp_path / "swarm", profile=tiny_profile)
    with pytest.raises(ConfigError) as info:
        deployment_recording(root, tmp_path / "p.yaml", 0, "verify")
    e = info.value
    assert (e.source, e.field) == (str(root / "server-0" / "scenario.yaml"), "server.profile")
    assert "profile test-tiny has no recording sidecar" in str(e)
    assert not (tmp_path / "data").exists()


def test_a_folder_without_batch_logs_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(WispsimError, match="no verification batch log"):
        deployment_recording(tmp_path / "empty", tmp_path / "p.yaml", 0, "verify")
    with pytest.raises(WispsimError, match="no centralized step log"):  # members mark verification
        deployment_recording(deployment(tmp_path / "swarm"), tmp_path / "p.yaml", 0, "step")
