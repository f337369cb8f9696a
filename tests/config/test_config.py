"""Scenario loading: YAML -> typed config, presets, and one-line errors naming file and field."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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
    assert sc.server.delta_ms == 3.0
    assert sc.workload.duration_s == 60.0
    assert sc.server.block_size is None  # untouched default (the profile's engine's, 16 here)
    assert sc.workload.prompt_tokens == Dist("lognormal", mean=256.0, cv=0.5, min=16.0, max=2048.0)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policy_presets(policy: str) -> None:
    sc = load_scenario(overrides={"policy": policy})
    p = POLICIES[policy]
    assert sc.drafting.controller == p["controller"]
    assert sc.server.mode == p["mode"]
    assert sc.server.scheduler == p["scheduler"]
    assert sc.server.prefix_cache == p["cache"]


def test_sled_preset_is_fixed_fcfs_without_cache() -> None:
    sc = load_scenario(overrides={"policy": "sled"})
    assert (sc.drafting.controller, sc.server.scheduler, sc.server.prefix_cache) == ("fixed", "fcfs", False)


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
    assert parse_set(["server.delta_ms=3", "devices.classes=[2, 4]", "name=x"]) == {
        "server": {"delta_ms": 3},
        "devices": {"classes": [2, 4]},
        "name": "x",
    }
    with pytest.raises(ConfigError):
        parse_set(["server.delta_ms"])


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
    p = write(tmp_path, "server:\n  delta: 3\n")
    msg = assert_one_line_naming(load_error(p), p, "server.delta")
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
        ("server: {delta_ms: -1}\n", "server.delta_ms"),
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
