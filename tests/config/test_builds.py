"""The verifier's build (issue 46, item 1): ``server.build`` names how a speculative server is built
(stock-vllm, vllm-sessions, wisp-grpc) as a preset of verifier.kind, engine.prefix_reuse and
host.transport; conflicts are one-line errors naming where the field was given."""

from __future__ import annotations

from pathlib import Path

import pytest

from wispsim.config.builds import BUILDS, build_name, effective_build
from wispsim.errors import ConfigError
from wispsim.sim.scenarios import load_scenario


def fields(policy: str = "wisp", **server: object) -> tuple[str, str, str, str]:
    s = load_scenario(overrides={"policy": policy, **({"server": server} if server else {})}).server
    return s.build, s.verifier.kind, s.engine.prefix_reuse, s.host.transport


def test_auto_is_the_policys_own_build_and_follows_it_through_with_policy() -> None:
    """The default scenario (``auto``): WISP runs on the paper's verifier, the LRU policies on a
    stock vLLM server (an evictable prefix cannot stay resident); a comparison's policies each
    get their own."""
    assert fields() == ("auto", *BUILDS["wisp-grpc"])
    for policy in ("fcfs", "wisp-fixed"):
        assert fields(policy)[1:] == BUILDS["wisp-grpc"]
    for policy in ("wisp-lru", "sled"):
        assert fields(policy)[1:] == BUILDS["stock-vllm"]
    sled = load_scenario().with_policy("sled").server
    assert (sled.verifier.kind, sled.engine.prefix_reuse, sled.host.transport) == BUILDS["stock-vllm"]
    assert effective_build(load_scenario().server, "wisp") == "wisp-grpc"


@pytest.mark.parametrize("build", list(BUILDS))
def test_a_named_build_sets_its_three_fields(build: str) -> None:
    assert fields(build=build) == (build, *BUILDS[build])


def test_fields_given_without_a_build_fill_the_rest_from_a_stock_server_and_name_the_build() -> None:
    assert fields(verifier={"kind": "resident"}) == ("vllm-sessions", "resident", "token", "http")
    assert fields(verifier={"kind": "resident"}, host={"transport": "grpc"})[0] == "wisp-grpc"
    assert fields(engine={"prefix_reuse": "block"}) == ("stock-vllm", "resubmit", "block", "http")
    # the pre-issue-46 default (token-granular reuse of re-submitted rounds) is no named build
    assert fields(engine={"prefix_reuse": "token"}) == ("custom", "resubmit", "token", "http")
    assert fields(build="custom") == ("custom", "resubmit", "token", "http")
    # named, it no longer follows the policy
    assert load_scenario(overrides={"server": {"build": "stock-vllm"}}).with_policy("fcfs").server.build == (
        "stock-vllm"
    )


def test_a_field_that_disagrees_with_a_named_build_is_an_error_naming_both() -> None:
    with pytest.raises(ConfigError) as e:
        fields(build="wisp-grpc", verifier={"kind": "resubmit"})
    said = str(e.value)
    assert said.startswith("--set: server.verifier.kind: resubmit conflicts with server.build wisp-grpc")
    assert "server.build: custom" in said and "\n" not in said
    # a resident session reuses token by token whatever prefix_reuse says: no conflict there
    assert fields(build="wisp-grpc", engine={"prefix_reuse": "block"})[2] == "token"


def test_a_resident_build_needs_a_policy_that_pins_kv() -> None:
    with pytest.raises(
        ConfigError, match=r"^--set: server.build: wisp-grpc keeps each session resident.*sled"
    ):
        load_scenario(overrides={"policy": "sled", "server": {"build": "wisp-grpc"}})
    assert fields("sled")[1:] == BUILDS["stock-vllm"]


def test_a_resubmitted_round_over_grpc_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"^--set: server.host.transport: grpc is measured for resident"):
        fields(build="custom", host={"transport": "grpc"})


def test_an_unknown_build_lists_the_builds() -> None:
    with pytest.raises(ConfigError, match=r"auto.*stock-vllm.*vllm-sessions.*wisp-grpc.*custom"):
        fields(build="sessions")


def test_the_resolved_scenario_reloads_to_the_same_build(tmp_path: Path) -> None:
    for server in ({}, {"verifier": {"kind": "resident"}}, {"build": "stock-vllm"}, {"build": "custom"}):
        sc = load_scenario(overrides={"server": server})
        path = tmp_path / "sc.yaml"
        path.write_text(sc.to_yaml())
        again = load_scenario(path)
        assert again.server == sc.server


def test_build_names() -> None:
    assert build_name("resident", "block", "grpc") == "wisp-grpc"  # block reuse is a re-submitted round's
    assert build_name("resubmit", "token", "grpc") == "custom"


def test_with_policy_gives_what_loading_the_policy_gives() -> None:
    """A comparison switches policies on one loaded scenario: under ``auto`` each gets exactly the
    server it would get loaded with that policy (centralized serving the fields' own defaults)."""
    for policy in ("sled", "wisp-lru", "fcfs", "centralized", "centralized-sd", "wisp"):
        for base in ("wisp", "sled", "centralized"):
            switched = load_scenario(overrides={"policy": base}).with_policy(policy)
            assert switched.server == load_scenario(overrides={"policy": policy}).server, (base, policy)
