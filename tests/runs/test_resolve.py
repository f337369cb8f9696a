"""The resolver (wispsim.runs.resolve): file, then ``--set``, then the options, checked once; a
failed check is one line naming whoever set the field at fault (the file, ``--set``, an option)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import wispsim.runs.resolve as resolve_mod
from tests.support import write_profile
from wispsim.config import DeviceGroup
from wispsim.config.limits import MAX_REPLICAS, MAX_SEED
from wispsim.errors import ConfigError
from wispsim.runs.resolve import (
    MAX_SERIES_POINTS,
    Options,
    check,
    check_backend,
    check_poisson_rate,
    check_seeds,
    check_series_step,
    check_start,
    load,
    resolve,
)

ScenarioFile = Callable[..., Path]


def refused(call: Callable[[], object], source: str, field: str | None, *words: str) -> ConfigError:
    """``call`` raises one ConfigError, one line, blaming ``source`` and ``field`` (None: any)."""
    with pytest.raises(ConfigError) as info:
        call()
    e = info.value
    assert "\n" not in str(e), str(e)
    assert e.source == source, str(e)
    assert field is None or e.field == field, str(e)
    assert str(e).startswith(f"{source}: "), str(e)
    for w in words:
        assert w in str(e), str(e)
    return e


# ------------------------------------------------------------------------------------------
# what the resolver applies, and in which order
# ------------------------------------------------------------------------------------------


def test_set_overrides_the_file_and_the_options_override_set(scenario_file: ScenarioFile) -> None:
    f = scenario_file()
    plain = resolve(f).scenario
    assert (plain.devices.count, plain.devices.classes, plain.drafting.k) == (2, (1.0,), 2)
    sets = ["devices.count=3", "seed=4", "drafting.k=3"]
    over = resolve(f, sets).scenario
    assert (over.devices.count, over.seed, over.drafting.k) == (3, 4, 3)
    both = resolve(f, ["drafting.k=3"], Options(devices=5, seed=9, classes=(1.0, 2.0))).scenario
    assert (both.devices.count, both.seed, both.devices.classes) == (5, 9, (1.0, 2.0))
    assert both.drafting.k == 3  # an option leaves what it does not set as --set left it
    # an option and a --set of the same field: refused (which wins would be a guess)
    refused(lambda: resolve(f, sets, Options(devices=5)), "--set", "devices.count", "--devices sets it too")
    refused(lambda: resolve(f, sets, Options(seed=9)), "--set", "seed", "--seed sets it too")


def test_policy_option_applies_its_preset_over_the_files_choices(scenario_file: ScenarioFile) -> None:
    sc = resolve(scenario_file(), None, Options(policy="sled")).scenario
    assert sc.policy == "sled"
    assert (sc.drafting.controller, sc.server.mode, sc.server.scheduler) == ("fixed", "speculative", "fcfs")
    assert (sc.server.engine.enable_prefix_caching, sc.server.verifier.kv_policy) == (False, "lru")


def test_set_is_checked_against_the_policy_the_option_chooses(scenario_file: ScenarioFile) -> None:
    f = scenario_file()  # the file's policy: wisp
    refused(
        lambda: resolve(f, ["server.engine.enable_prefix_caching=false"], Options(policy="centralized")),
        "--set",
        "server.engine.enable_prefix_caching",
        "conflicts with policy centralized",
    )
    # what the refusal advises works from the command line too
    sc = resolve(f, ["server.engine.enable_prefix_caching=false"], Options(policy="custom")).scenario
    assert (sc.policy, sc.server.engine.enable_prefix_caching) == ("custom", False)


def test_poisson_option_sets_the_process_and_the_rate(scenario_file: ScenarioFile) -> None:
    sc = resolve(scenario_file(), None, Options(arrivals="poisson:3")).scenario
    assert (sc.arrivals.process, sc.arrivals.rate) == ("poisson", 3.0)


def test_resolved_carries_each_replicas_profile_kv_capacity_and_block_size(
    scenario_file: ScenarioFile, tmp_path: Path
) -> None:
    prof = write_profile(tmp_path / "small.yaml", capacity_tokens=4096)
    r = resolve(scenario_file(), [f"server.profile={prof}"], Options(replicas=2, router="round-robin"))
    assert (r.scenario.server.replicas, r.scenario.server.router) == (2, "round-robin")
    assert [p.name for p in r.profiles] == ["test-tiny", "test-tiny"]
    assert r.capacities == (4096, 4096)
    assert r.block_sizes == (16, 16)


def test_the_scenario_is_checked_once(scenario_file: ScenarioFile, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = resolve_mod.check_consistency

    def counting(sc, source):  # type: ignore[no-untyped-def]
        calls.append(source)
        return real(sc, source)

    monkeypatch.setattr(resolve_mod, "check_consistency", counting)
    f = scenario_file()
    resolve(f, ["drafting.k=3"], Options(policy="sled", devices=4, classes=(1.0, 2.0), seed=1))
    assert calls == [str(f)]


def test_load_leaves_the_consistency_check_to_check(scenario_file: ScenarioFile) -> None:
    sc = load(scenario_file(), ["devices.classes=[500]"])  # unreachable, but not checked yet
    assert sc.devices.classes == (500.0,)
    refused(lambda: check(sc), "scenario", "devices.classes", "faster than any device can reach")
    refused(lambda: check(sc, Options(classes=(500.0,))), "--classes", "devices.classes")


def test_owners_name_only_the_options_given() -> None:
    assert Options().owners() == {}
    assert Options(seed=3).owners() == {}  # a seed never makes a scenario inconsistent
    assert Options(classes=(4.0,), router="affinity").owners() == {
        "devices.classes": "--classes",
        "devices.groups": "--classes",
        "server.router": "--router",
    }


# ------------------------------------------------------------------------------------------
# one line naming whoever set the field at fault
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sets", "field", "words"),
    [
        (["workload.duration_s=-1"], "workload.duration_s", ("must be > 0", "-1")),
        (["devices.count=0"], "devices.count", ("must be in [1, 1,000,000]",)),
        (["nope.field=1"], "nope", ("unknown field", "allowed: acceptance")),
        # caught by the consistency check, after the merge: still blamed on --set
        (["devices.classes=[500]"], "devices.classes", ("500 tokens/s is faster than any device",)),
    ],
)
def test_a_bad_set_value_is_blamed_on_set(
    scenario_file: ScenarioFile, sets: list[str], field: str, words: tuple[str, ...]
) -> None:
    refused(lambda: resolve(scenario_file(), sets), "--set", field, *words)


def test_a_bad_file_value_is_blamed_on_the_file(scenario_file: ScenarioFile) -> None:
    f = scenario_file("bad.yaml", devices={"classes": [500.0]})
    refused(lambda: resolve(f), str(f), "devices.classes", "at most 60 tokens/s")


@pytest.mark.parametrize(
    ("options", "source", "field", "words"),
    [
        (Options(classes=(500.0,)), "--classes", "devices.classes", ("faster than any device",)),
        (
            Options(fleet=(DeviceGroup(count=2, slo=500.0),)),
            "--fleet",
            "devices.groups[0].slo",
            ("faster than any device",),
        ),
        (Options(replicas=0), "--replicas", "", (f"must be in [1, {MAX_REPLICAS}], got 0",)),
        (Options(router="nope"), "--router", "", ("unknown router 'nope'", "affinity")),
        (Options(policy="nope"), "--policy", None, ("unknown policy 'nope'", "wisp")),
        (Options(profile="nope"), "--profile", "server.profile", ("no profile 'nope'",)),
        (Options(arrivals="poisson:0"), "--arrivals", "", ("poisson:RATE", "got '0'")),
        (Options(arrivals="poisson:abc"), "--arrivals", "", ("got 'abc'",)),
        (Options(arrivals="missing.csv"), "--arrivals", "arrivals.trace", ("not found",)),
        (Options(arrivals="bursty", tail=-1.0), "--tail", "", ("must be a finite number >= 0",)),
        (Options(seed=-1), "--seed", "", ("must be in [0, 2**63 - 1], got -1",)),
    ],
)
def test_a_bad_option_is_blamed_on_the_option(
    scenario_file: ScenarioFile, options: Options, source: str, field: str | None, words: tuple[str, ...]
) -> None:
    refused(lambda: resolve(scenario_file(), None, options), source, field, *words)


# ------------------------------------------------------------------------------------------
# the checks commands make of their own options before any work
# ------------------------------------------------------------------------------------------


def test_seeds_are_consecutive_and_within_the_largest_seed() -> None:
    assert check_seeds(5, 3) == [5, 6, 7]
    assert check_seeds(MAX_SEED, 1) == [MAX_SEED]
    refused(lambda: check_seeds(MAX_SEED, 2), "--seed", "", "past the largest seed")
    refused(lambda: check_seeds(MAX_SEED, 2, "--first-seed"), "--first-seed", "")


def test_start_must_not_pass_the_largest_count() -> None:
    check_start(8, 8)
    refused(lambda: check_start(9, 8), "--start", "", "must be <= --max-devices (8), got 9")
    refused(lambda: check_start(3, 2, "--start", "--max-replicas"), "--start", "", "--max-replicas (2)")


def test_backend_and_address() -> None:
    check_backend("local", None)
    check_backend("ray", "head:6379")
    refused(lambda: check_backend("slurm", None), "--backend", "", "got 'slurm'; allowed: local")
    refused(lambda: check_backend("local", "head:6379"), "--address", "", "only with --backend ray")


def test_series_step_gives_at_most_the_largest_number_of_points() -> None:
    check_series_step(2.0, 2.0 * MAX_SERIES_POINTS)  # exactly the most points
    refused(lambda: check_series_step(1.0, 2.0 * MAX_SERIES_POINTS), "--step", "", "use a step >= 2 s")
    refused(lambda: check_series_step(1.0, 2.0 * MAX_SERIES_POINTS, "--window"), "--window", "")


def test_poisson_rate_is_checked_early_only_when_it_is_a_number() -> None:
    for fine in (None, "bursty", "poisson:5", "poisson:abc"):  # the rest is checked where applied
        check_poisson_rate(fine)
    refused(lambda: check_poisson_rate("poisson:inf"), "--arrivals", "", "finite rate")
    refused(lambda: check_poisson_rate("poisson:1e9"), "--arrivals", "", "got '1e9'")


def test_zero_devices_from_python_is_refused_not_ignored() -> None:
    """``Options(devices=0)`` used to keep the file's count (``0 or count``); the CLI refuses 0
    before it gets here, a Python caller is told the same."""
    from wispsim.runs.resolve import apply_options
    from wispsim.sim.scenarios import load_scenario

    with pytest.raises(ConfigError, match=r"^--devices: devices\.count: must be in \[1, "):
        apply_options(load_scenario(), Options(devices=0))
