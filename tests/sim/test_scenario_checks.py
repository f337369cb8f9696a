"""Scenario validation (issue 13): numbers, bounds, strict YAML, preset conflicts, values that
must fit together. Each bad input is one line naming its source and field; docs/inputs.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from wispsim.config import parse_set
from wispsim.config.limits import MAX_DEVICES, MAX_SIM_SECONDS
from wispsim.errors import ConfigError
from wispsim.runs.resolve import Options, apply_options, check
from wispsim.sim.scenarios import load_scenario


def refuse(sets: list[str], field: str, *words: str, path: Path | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_scenario(path, parse_set(sets))
    e = info.value
    assert "\n" not in str(e)
    assert e.field == field, str(e)
    for w in words:
        assert w in str(e), str(e)
    return e


@pytest.mark.parametrize(
    ("assignment", "field", "word"),
    [
        ("devices.count=.inf", "devices.count", "integer"),
        ("drafting.k=.nan", "drafting.k", "integer"),
        ("workload.duration_s=1" + "0" * 400, "workload.duration_s", "401-digit"),
        ("server.engine.activation_reserve_gib=.inf", "server.engine.activation_reserve_gib", "finite"),
        ("devices.start_spread_s=.inf", "devices.start_spread_s", "finite"),
        ("server.replicas=10000000000000000000", "server.replicas", "whole number"),
        ("devices.count=100000000000000000000", "devices.count", "whole number"),
        ("devices.count=2000000", "devices.count", f"{MAX_DEVICES:,}"),
        ("workload.duration_s=1e308", "workload.duration_s", f"{MAX_SIM_SECONDS:g}"),
        ("arrivals.rate=.inf", "arrivals.rate", "finite"),
        ("epsilon=.nan", "epsilon", "number"),
        ("workload.output_tokens.max=.inf", "workload.output_tokens.max", "finite"),
        ("devices.classes=[.nan]", "devices.classes[0]", "number"),
    ],
)
def test_non_finite_huge_and_unbounded_values_are_refused_on_set(
    assignment: str, field: str, word: str
) -> None:
    e = refuse([assignment], field, word)
    assert e.source == "--set"  # not blamed on the scenario file


def test_scientific_notation_is_a_number() -> None:
    sc = load_scenario(overrides=parse_set(["workload.duration_s=1e3", "devices.count=1e2"]))
    assert sc.workload.duration_s == 1000.0 and sc.devices.count == 100


def test_a_bad_file_value_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("devices: {count: .inf}\n")
    refuse([], "devices.count", str(p), path=p)


@pytest.mark.parametrize(
    ("content", "word"),
    [
        (b"name: caf\xe9\n", "not UTF-8"),
        (b"seed: 1\nseed: 2\n", "duplicate key 'seed'"),
        (b"devices:\n  classes: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested too deeply"),
        (b"server: {delta_ms: [1, 2\n", "malformed YAML"),
    ],
)
def test_malformed_yaml_files_are_one_line(tmp_path: Path, content: bytes, word: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_scenario(p)
    assert word in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith(str(p))


def test_a_section_and_one_of_its_fields_on_set_is_an_error() -> None:
    with pytest.raises(ConfigError, match="server was already set to a value"):
        parse_set(["server=1", "server.verifier.delta_ms=3"])
    refuse(["server=1"], "server", "mapping")


@pytest.mark.parametrize(
    ("assignment", "field"),
    [
        ("server.engine.enable_prefix_caching=false", "server.engine.enable_prefix_caching"),
        ("server.scheduler=bogus", "server.scheduler"),
        ("drafting.controller=fixed", "drafting.controller"),
        ("server.mode=centralized", "server.mode"),
    ],
)
def test_an_explicit_setting_the_preset_would_override_is_an_error(assignment: str, field: str) -> None:
    refuse([assignment], field, "conflicts with policy wisp", "policy: custom")


def test_agreeing_settings_and_custom_policy_are_accepted(tmp_path: Path) -> None:
    assert load_scenario(
        overrides=parse_set(["server.engine.enable_prefix_caching=true"])
    ).server.engine.enable_prefix_caching
    sc = load_scenario(overrides=parse_set(["policy=custom", "server.engine.enable_prefix_caching=false"]))
    assert sc.policy == "custom" and not sc.server.engine.enable_prefix_caching
    # a resolved scenario written by a run loads as it is
    p = tmp_path / "resolved.yaml"
    p.write_text(load_scenario(overrides={"policy": "sled"}).to_yaml())
    assert load_scenario(p).policy == "sled"
    # --set wins over the file: a file's conflicting value corrected on the command line is fine
    q = tmp_path / "f.yaml"
    q.write_text("server: {prefix_cache: false}\n")
    assert load_scenario(
        q, parse_set(["server.engine.enable_prefix_caching=true"])
    ).server.engine.enable_prefix_caching
    refuse([], "server.engine.enable_prefix_caching", str(q), path=q)


def test_kv_block_larger_than_the_cache_is_caught_by_validation() -> None:
    refuse(["server.engine.block_size=40000"], "server.engine.block_size", "more than the whole KV cache")


def test_batch_token_cap_below_one_cold_round_is_an_error() -> None:
    refuse(["server.verifier.max_batch_tokens=1"], "server.verifier.max_batch_tokens", "allowed: >= 3,081")


def test_a_drain_shorter_than_an_on_time_response_is_an_error_and_null_is_exactly_it() -> None:
    refuse(["workload.drain_limit_s=0"], "workload.drain_limit_s", "512 s", "allowed: >= 512")
    sc = load_scenario()
    assert sc.workload.drain_limit_s is None and sc.drain_limit_s() == 1024 / 2


def test_an_unreachable_class_is_an_error_with_the_bound() -> None:
    refuse(["devices.classes=[500]"], "devices.classes", "faster than any device can reach", "at most")
    refuse(
        ["devices.draft_speed={dist: constant, value: 0.001, min: 0.001}"],
        "devices.classes",
        "faster than any",
    )
    e = refuse(["devices.draft_speed={dist: constant, value: 0.001}"], "devices.draft_speed.min")
    assert e.source == "--set"
    refuse(["policy=centralized", "devices.classes=[5000]"], "devices.classes", "decode step")


def test_an_unknown_replica_profile_names_its_entry() -> None:
    refuse(
        ["server.replicas=2", "server.replica_profiles=[a100-qwen3-32b-paper, nope]"],
        "server.replica_profiles[1]",
    )


def test_options_that_change_a_scenario_are_blamed_on_the_option() -> None:
    sc = load_scenario().with_devices(10, (500.0,))
    with pytest.raises(ConfigError) as info:
        check(sc, Options(classes=(500.0,)))
    assert info.value.source == "--classes"
    # below the entrance hall an error names the field; the resolver names the option that set it
    with pytest.raises(ConfigError, match=r"^scenario: devices\.count: must be in"):
        load_scenario().with_devices(MAX_DEVICES + 1)
    with pytest.raises(ConfigError, match=r"^--devices: devices\.count: must be in"):
        apply_options(load_scenario(), Options(devices=MAX_DEVICES + 1))


def test_static_batching_is_centralized_servings_and_refused_for_a_verifier() -> None:
    """``server.engine.batching`` (issue 46) is how centralized serving batches; a speculative
    policy's verifier batches rounds by its scheduler, so accepting it there would be a silent no-op."""
    from wispsim.sim.scenarios import check_consistency

    static = load_scenario(None, parse_set(["policy=centralized", "server.engine.batching=static"]))
    check_consistency(static.with_policy("centralized"))
    check_consistency(static.with_policy("centralized-sd"))
    with pytest.raises(ConfigError, match=r"server\.engine\.batching: static batching is centralized"):
        check_consistency(static.with_policy("wisp"), "--set")
