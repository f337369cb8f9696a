"""``run`` and ``replay`` (wispsim.runs.run): one simulation of the resolved scenario into a
results folder with its manifest last; the same seed gives the same records; the outputs are
checked before any work; a run's log replays to the same times."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

import wispsim.runs.resolve as resolve_mod
import wispsim.runs.run as run_mod
from tests.support import is_png
from wispsim.errors import ConfigError
from wispsim.runs.resolve import Options, resolve
from wispsim.runs.run import describe_load, host_notes, replay, run
from wispsim.sim.scenarios import Resolved
from wispsim.sim.simulation import simulate

ScenarioFile = Callable[..., Path]

RUN_FILES = {
    "scenario.yaml",
    "rounds.parquet",
    "batches.parquet",
    "responses.parquet",
    "summary.csv",
    "replicas.csv",
    "timeseries.csv",
    "server_timeseries.csv",
    "manifest.json",
}
# the default scenario (a real profile, drawn draft speeds, lengths and acceptance), kept short
QUICK = ["workload.warmup_s=1", "workload.duration_s=5"]


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_run_writes_its_folder_with_the_manifest_last(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    out = tmp_path / "run"
    o = run(scenario_file(), ["devices.count=3"], Options(seed=5), out=out)
    assert o.folder == out
    assert {p.name for p in out.iterdir()} == RUN_FILES  # closed arrivals: no compliance figure
    m = manifest(out)
    assert (m["seed"], m["devices"], m["policy"]) == (5, 3, "custom")
    assert m["sim_end_s"] == o.result.sim_end
    last = (out / "manifest.json").stat().st_mtime_ns
    assert all(p.stat().st_mtime_ns <= last for p in out.iterdir())
    # the records are the file's scenario: fixed k=2 at 50 tokens/s, every drafted token
    # accepted, 7 output tokens: rounds commit 3, 3, then the last token (k=1)
    rounds = pd.read_parquet(out / "rounds.parquet")
    assert sorted(rounds.device.unique()) == [0, 1, 2]
    full, last = rounds[rounds["round"] < 2], rounds[rounds["round"] == 2]
    assert set(rounds["round"]) == {0, 1, 2}
    assert (full.k == 2).all() and (full.accepted == 2).all() and (full.committed == 3).all()
    assert (last.k == 1).all() and (last.committed == 1).all()
    assert full.draft_time.to_numpy() == pytest.approx(0.04)
    assert last.draft_time.to_numpy() == pytest.approx(0.02)
    first = rounds[(rounds.response < 3) & (rounds["round"] == 0)]
    assert (first.t_start == 0).all() and first.t_end.nunique() == 1  # the three verified together
    assert list(o.summary["class"].astype(str)) == ["1"]
    assert list(pd.read_csv(out / "summary.csv")["violation_rate"]) == [0.0]


def test_run_writes_the_records_of_the_resolved_scenario_as_simulated(
    scenario_file: ScenarioFile, tmp_path: Path
) -> None:
    f, sets, opts = scenario_file(), ["devices.count=3"], Options(seed=5, classes=(1.0, 2.0))
    o = run(f, sets, opts, out=tmp_path / "run")
    direct = simulate(resolve(f, sets, opts))
    written = pd.read_parquet(tmp_path / "run" / "rounds.parquet")
    pd.testing.assert_frame_equal(written, direct.rounds.reset_index(drop=True), check_dtype=False)
    assert o.scenario == direct.scenario


def test_the_scenario_is_resolved_once_and_simulated_as_resolved(
    scenario_file: ScenarioFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[str] = []
    given: list[object] = []
    real_check, real_simulate = resolve_mod.check_consistency, run_mod.simulate

    def counting_check(sc, source):  # type: ignore[no-untyped-def]
        checks.append(source)
        return real_check(sc, source)

    def spying_simulate(scenario, *args, **kwargs):  # type: ignore[no-untyped-def]
        given.append(scenario)
        return real_simulate(scenario, *args, **kwargs)

    monkeypatch.setattr(resolve_mod, "check_consistency", counting_check)
    monkeypatch.setattr(run_mod, "simulate", spying_simulate)
    run(scenario_file(), None, Options(policy="sled", devices=3), out=tmp_path / "run")
    assert len(checks) == 1
    assert len(given) == 1 and isinstance(given[0], Resolved)
    assert given[0].scenario.policy == "sled" and given[0].scenario.devices.count == 3


def test_the_resolved_scenario_reruns_to_the_same_folder(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    first = run(scenario_file(), ["devices.count=3"], Options(seed=5, classes=(1.0, 2.0)), out=tmp_path / "a")
    again = run(first.folder / "scenario.yaml", None, Options(), out=tmp_path / "b")
    assert again.scenario == first.scenario
    for name in ("summary.csv", "replicas.csv", "timeseries.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_same_seed_gives_the_same_records(tmp_path: Path) -> None:
    a, b, c = (
        run(None, QUICK, Options(devices=4, seed=s), out=tmp_path / name)
        for name, s in (("a", 11), ("b", 11), ("c", 12))
    )
    rounds = {x: pd.read_parquet(tmp_path / x / "rounds.parquet") for x in "abc"}
    assert len(rounds["a"]) > 100
    pd.testing.assert_frame_equal(rounds["a"], rounds["b"])
    assert (tmp_path / "a" / "summary.csv").read_bytes() == (tmp_path / "b" / "summary.csv").read_bytes()
    assert not rounds["a"].equals(rounds["c"])  # the seed matters: drawn speeds, lengths, acceptance
    assert (a.scenario.seed, b.scenario.seed, c.scenario.seed) == (11, 11, 12)


def test_open_arrivals_add_the_compliance_figure(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    o = run(scenario_file(), None, Options(arrivals="poisson:20"), out=tmp_path / "run")
    assert {p.name for p in o.folder.iterdir()} == RUN_FILES | {"compliance.png"}
    assert is_png(o.folder / "compliance.png")
    assert o.scenario.arrivals.process == "poisson"


def test_status_says_what_is_simulated(scenario_file: ScenarioFile, tmp_path: Path) -> None:
    from contextlib import nullcontext

    said: list[str] = []

    def status(text: str):  # type: ignore[no-untyped-def]
        said.append(text)
        return nullcontext()

    run(scenario_file(), None, Options(devices=3), out=tmp_path / "run", status=status)
    assert said == ["simulating N=3 under custom ..."]


@pytest.mark.parametrize(
    ("kwargs", "source", "words"),
    [
        ({"out": "FILE"}, "--out", ()),
        ({"log": Path("round.log")}, "--log", (".parquet",)),
        ({"step": 1e-7}, "--step", ("points over",)),
        ({"options": Options(arrivals="poisson:inf")}, "--arrivals", ("finite rate",)),
    ],
)
def test_bad_outputs_and_options_are_refused_before_any_work(
    scenario_file: ScenarioFile,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kwargs: dict,
    source: str,
    words: tuple[str, ...],
) -> None:
    def never(*args, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("simulated before the options were checked")

    monkeypatch.setattr(run_mod, "simulate", never)
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder")
    args = {"options": Options(), "out": tmp_path / "run", **kwargs}
    if args["out"] == "FILE":
        args["out"] = blocker
    if "log" in args:
        args["log"] = tmp_path / args["log"]
    with pytest.raises(ConfigError) as info:
        run(scenario_file(), None, **args)
    assert info.value.source == source, str(info.value)
    assert "\n" not in str(info.value)
    for w in words:
        assert w in str(info.value), str(info.value)
    assert not (tmp_path / "run").exists()


def test_describe_load() -> None:
    closed = resolve(None, None, Options(devices=12)).scenario
    assert describe_load(closed) == "N=12"
    assert describe_load(closed, devices=40) == "N=40"
    poisson = resolve(None, None, Options(arrivals="poisson:3", replicas=2)).scenario
    assert describe_load(poisson) == "Poisson 3 responses/s, 2 replicas"
    trace = resolve(None, None, Options(arrivals="bursty")).scenario
    assert describe_load(trace) == "concurrency trace bursty"


def test_host_notes_only_for_a_cpu_profile_measured_elsewhere() -> None:
    elsewhere = {"cpu": "Imaginary CPU 9000", "isa": "x86-64-v1"}
    (note,) = host_notes("cpu-vllm-mini-inproc", elsewhere)
    assert note.startswith("note: profile cpu-vllm-mini-inproc was measured on AMD EPYC (avx512)")
    assert "Imaginary CPU 9000" in note
    assert host_notes("cpu-vllm-mini-inproc", {"cpu": "AMD EPYC", "isa": "avx512"}) == []
    assert host_notes("a100-qwen3-32b-paper", elsewhere) == []  # measured on a GPU


# ------------------------------------------------------------------------------------------
# replay
# ------------------------------------------------------------------------------------------


@pytest.fixture
def recorded(scenario_file: ScenarioFile, tmp_path: Path) -> Path:
    """The per-round log of a deterministic two-device run."""
    log = tmp_path / "log.parquet"
    run(scenario_file(), None, Options(), out=tmp_path / "recorded", log=log)
    assert log.is_file() and Path(f"{log}.meta.json").is_file()
    return log


def test_replay_under_the_recorded_policy_reproduces_the_run(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "replay"
    r = replay(recorded, None, None, None, None, out=out)
    assert {p.name for p in out.iterdir()} == {
        "scenario.yaml",
        "rounds.parquet",
        "batches.parquet",
        "responses.parquet",
        "comparison.csv",
        "manifest.json",
    }
    m = manifest(out)
    assert (m["recorded_policy"], m["policy"], m["devices"], m["log"]) == (
        "custom",
        "custom",
        2,
        str(recorded),
    )
    assert r.about.startswith("custom (the recorded policy)")
    assert r.notes == []  # the tiny profile records no host
    cmp = r.comparison.set_index(r.comparison["class"].astype(str))
    assert list(cmp.index) == ["1", "all"]
    assert (cmp.responses_recorded == cmp.responses_simulated).all() and cmp.responses_recorded.min() > 0
    diffs = [c for c in cmp.columns if c.endswith("_diff")]
    assert diffs and (cmp[diffs] == 0).all().all()  # nothing random: the same server times


def test_replay_under_another_policy_says_so(recorded: Path, tmp_path: Path) -> None:
    r = replay(recorded, None, None, "sled", None, out=tmp_path / "replay")
    m = manifest(tmp_path / "replay")
    assert (m["recorded_policy"], m["policy"]) == ("custom", "sled")
    assert r.scenario.policy == "sled" and r.scenario.server.engine.enable_prefix_caching is False


def test_replay_checks_its_folder_before_reading_the_log(tmp_path: Path) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("a file, not a folder")
    with pytest.raises(ConfigError) as info:
        replay(tmp_path / "no-such-log.parquet", None, None, None, None, out=blocker)
    assert info.value.source == "--out"


def test_a_centralized_run_asked_for_a_log_is_refused_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A centralized run has no verification rounds to log: refused by name before simulating."""

    def never(*args, **kw):  # type: ignore[no-untyped-def]
        raise AssertionError("simulated before the log was checked")

    monkeypatch.setattr(run_mod, "simulate", never)
    log = tmp_path / "run" / "log.parquet"
    with pytest.raises(ConfigError, match="no verification rounds") as info:
        run(None, None, Options(policy="centralized"), out=tmp_path / "run", log=log)
    assert info.value.source == str(log) and "\n" not in str(info.value)
    assert not (tmp_path / "run").exists()
