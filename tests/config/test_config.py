"""Scenario loading: YAML -> typed config, presets, and one-line errors naming file and field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from wispsim.config import POLICIES, Dist, Scenario, parse_set
from wispsim.errors import ConfigError, WispsimError
from wispsim.sim.scenarios import load_scenario


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def load_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        load_scenario(path)
    return e.value


def assert_one_line_naming(err: ConfigError, path: Path, field: str) -> str:
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")
    if field:
        assert err.field == field
        assert f": {field}: " in msg
    return msg


def test_default_scenario_loads() -> None:
    sc = load_scenario()
    assert isinstance(sc, Scenario)
    assert sc.policy == "wisp"
    assert sc.server.profile == "a100-qwen3-32b"


def test_file_is_merged_over_defaults(tmp_path: Path) -> None:
    p = write(tmp_path, "server: {delta_ms: 3}\nworkload: {duration_s: 60}\n")
    sc = load_scenario(p)
    assert sc.server.verifier.delta_ms == 3.0
    assert sc.workload.duration_s == 60.0
    assert sc.server.engine.block_size is None  # untouched default (the profile's engine's, 16 here)
    assert sc.workload.prompt_tokens == Dist("lognormal", mean=256.0, cv=0.5, min=16.0, max=2048.0)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_presets(policy: str) -> None:
    sc = load_scenario(overrides={"policy": policy})
    p = POLICIES[policy]
    assert sc.drafting.controller == p["controller"]
    assert sc.server.mode == p["mode"]
    assert sc.server.scheduler == p["scheduler"]
    assert sc.server.engine.enable_prefix_caching == p["cache"]


def test_sled_preset_is_fixed_fcfs_without_cache() -> None:
    sc = load_scenario(overrides={"policy": "sled"})
    assert (sc.drafting.controller, sc.server.scheduler, sc.server.engine.enable_prefix_caching) == (
        "fixed",
        "fcfs",
        False,
    )


def test_custom_policy_keeps_explicit_fields() -> None:
    sc = load_scenario(overrides={"policy": "custom", "server": {"scheduler": "fcfs"}})
    assert sc.server.scheduler == "fcfs"
    assert sc.drafting.controller == "predictor"


@pytest.mark.parametrize("policy", ["wisp", "sled", "centralized"])
def test_resolved_yaml_round_trips(tmp_path: Path, policy: str) -> None:
    sc = load_scenario(overrides={"policy": policy, "server": {"delta_ms": 2.5}})
    again = load_scenario(write(tmp_path, sc.to_yaml()))
    assert again == sc


def test_parse_set() -> None:
    assert parse_set(["server.verifier.delta_ms=3", "devices.classes=[2, 4]", "name=x"]) == {
        "server": {"verifier": {"delta_ms": 3}},
        "devices": {"classes": [2, 4]},
        "name": "x",
    }
    with pytest.raises(ConfigError):
        parse_set(["server.verifier.delta_ms"])


# ---------------------------------------------------------------------------------------------
# Errors: one line, naming the file and the field
# ---------------------------------------------------------------------------------------------


def test_malformed_yaml(tmp_path: Path) -> None:
    p = write(tmp_path, "policy: wisp\nserver: {delta_ms: 3\n")
    err = load_error(p)
    msg = assert_one_line_naming(err, p, "")
    assert "malformed YAML" in msg and "line" in msg


def test_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    p = write(tmp_path, "- wisp\n- sled\n")
    msg = assert_one_line_naming(load_error(p), p, "")
    assert "mapping" in msg


def test_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "nope.yaml"
    msg = assert_one_line_naming(load_error(p), p, "")
    assert "not found" in msg


def test_unknown_top_level_field(tmp_path: Path) -> None:
    p = write(tmp_path, "sedd: 3\n")
    msg = assert_one_line_naming(load_error(p), p, "sedd")
    assert "unknown field" in msg and "seed" in msg  # lists what is allowed


def test_unknown_nested_field(tmp_path: Path) -> None:
    p = write(tmp_path, "server:\n  verifier:\n    delta: 3\n")
    msg = assert_one_line_naming(load_error(p), p, "server.verifier.delta")
    assert "delta_ms" in msg


def test_unknown_policy(tmp_path: Path) -> None:
    p = write(tmp_path, "policy: turbo\n")
    msg = assert_one_line_naming(load_error(p), p, "policy")
    assert "'turbo'" in msg
    for name in ("wisp", "sled", "centralized", "custom"):
        assert name in msg


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("acceptance: {mean: -0.2}\n", "acceptance.mean"),
        ("devices: {classes: [4, -2]}\n", "devices.classes"),
        ("devices: {draft_speed: {dist: constant, value: -50}}\n", "devices.draft_speed.value"),
        ("network: {link_types: {wifi: {up_mbps: -5}}}\n", "network.link_types.wifi.up_mbps"),
        ("workload: {duration_s: -3}\n", "workload.duration_s"),
        ("server: {delta_ms: -1}\n", "server.verifier.delta_ms"),
    ],
    ids=["acceptance-rate", "slo-rate", "draft-rate", "uplink-rate", "duration", "delta"],
)
def test_negative_values(tmp_path: Path, text: str, field: str) -> None:
    p = write(tmp_path, text)
    msg = assert_one_line_naming(load_error(p), p, field)
    assert "must be" in msg


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("server: {noise: 'yes'}\n", "server.noise", "true or false"),
        ("devices: {count: 2.5}\n", "devices.count", "integer"),
        ("network: {payload: everything}\n", "network.payload", "ids"),
        ("network: {links: {satellite: 1}}\n", "network.links.satellite", "wifi"),
        ("server: [1, 2]\n", "server", "mapping"),
    ],
)
def test_wrong_types_and_choices(tmp_path: Path, text: str, field: str, words: str) -> None:
    p = write(tmp_path, text)
    msg = assert_one_line_naming(load_error(p), p, field)
    assert words in msg


def test_config_error_is_a_user_error_with_exit_code_2(tmp_path: Path) -> None:
    err = load_error(write(tmp_path, "policy: turbo\n"))
    assert isinstance(err, WispsimError)
    assert err.exit_code == 2


@pytest.mark.parametrize(
    ("section", "field"),
    [("server", "scheduler"), ("drafting", "controller"), ("acceptance", "model")],
)
def test_unknown_plugin_name_names_the_file(tmp_path: Path, section: str, field: str) -> None:
    p = write(tmp_path, f"policy: custom\n{section}: {{{field}: nope}}\n")
    msg = assert_one_line_naming(load_error(p), p, f"{section}.{field}")
    assert "'nope'" in msg and "known:" in msg


def test_unknown_profile_names_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, "server: {profile: h100-nope}\n")
    msg = assert_one_line_naming(load_error(p), p, "server.profile")
    assert "a100-qwen3-32b-paper" in msg


@pytest.mark.parametrize(("section", "value"), [("prompt_tokens", 8), ("output_tokens", 5000)])
def test_constant_distribution_is_not_silently_clipped(tmp_path: Path, section: str, value: int) -> None:
    p = write(tmp_path, f"workload: {{{section}: {{dist: constant, value: {value}}}}}\n")
    try:
        sc = load_scenario(p)
    except ConfigError as e:  # refusing it, naming the field, would be fine too
        assert_one_line_naming(e, p, f"workload.{section}.value")
        return
    dist = getattr(sc.workload, section)
    assert dist.sample(np.random.default_rng(0)) == value


def test_the_earlier_flat_server_names_still_load(tmp_path: Path) -> None:
    """Issue 43 grouped the server section by concern (engine, verifier, host) with vLLM's names;
    a scenario written with the earlier flat names loads to the same scenario, ``--set`` takes
    either name, and a name given both ways is refused in one line."""
    from wispsim.config.server import FLAT_NAMES

    old = {
        "max_batch_requests": 64, "prefill_chunk_tokens": 1024, "async_scheduling": True,
        "block_size": 32, "kv_capacity_tokens": 4096, "gpu_memory_utilization": 0.8,
        "activation_reserve_gib": 2.0, "prefix_reuse": "block", "eviction": "block",
        "max_batch_tokens": 8192, "delta_ms": 3.0, "kv_headroom": 0.1, "kv_growth": "max",
        "kv_admission_order": "deadline", "host_cpu": "on", "host_cpu_speed": 2.0,
        "api_server_count": 2, "frontend": True, "verifier": "resident",
    }  # fmt: skip
    assert set(old) - {"verifier"} == set(FLAT_NAMES) - {"prefix_cache", "kv_policy"}
    p = write(tmp_path, yaml.safe_dump({"server": old}))
    flat = load_scenario(p)
    new: dict[str, dict[str, object]] = {"verifier": {"kind": "resident"}}
    for name, value in old.items():
        if name != "verifier":
            group, field = FLAT_NAMES[name]
            new.setdefault(group, {})[field] = value
    q = tmp_path / "new.yaml"
    q.write_text(yaml.safe_dump({"server": new}))
    assert load_scenario(q) == flat
    assert load_scenario(overrides=parse_set(["server.max_batch_requests=7"])).server.engine.max_num_seqs == 7
    both = {"server": {"max_batch_requests": 7, "engine": {"max_num_seqs": 8}}}
    with pytest.raises(
        ConfigError, match=r"server\.max_batch_requests: is server\.engine\.max_num_seqs, also given"
    ):
        load_scenario(overrides=both)


def test_every_stored_scenario_of_a_shipped_result_loads() -> None:
    """Results written before the server section was grouped keep loading (a sample of them)."""
    from tests.support import ROOT

    stored = sorted((ROOT / "experiments" / "data").rglob("scenario.yaml"))[:40]
    assert stored
    for path in stored:
        load_scenario(path, consistency=False)


def test_a_quantile_at_the_ends_is_the_support() -> None:
    """Epsilon 0 asks for the shortest output every response may have (the fluid estimate's
    quantile at 0): the support's ends, never an error."""
    d = Dist(dist="lognormal", mean=200.0, cv=1.0, min=4.0, max=1024.0)
    assert d.quantile(0.0) == 4.0 and d.quantile(1.0) == 1024.0
    assert 4.0 < d.quantile(0.05) < d.quantile(0.5) < 1024.0
    u = Dist(dist="uniform", low=10.0, high=20.0)
    assert (u.quantile(0.0), u.quantile(1.0)) == (10.0, 20.0)
