"""Replay logs: a `wispsim run` log replayed under its own policy reproduces the run; other
policies answer "what if"; bad logs are one-line errors naming the file and the column."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from tests.support import ROOT
from wispsim.analysis.metrics import summarize
from wispsim.cli.main import app
from wispsim.config import Scenario
from wispsim.errors import ConfigError
from wispsim.sim.records import SimResult
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate
from wispsim.study.replay.compare import compare, recorded_responses, wilson
from wispsim.study.replay.drive import log_scenario, replay
from wispsim.study.replay.log import COLUMN_NAMES, REQUIRED, meta_path, write_log
from wispsim.study.replay.read import read_log

SHORT = {"workload": {"warmup_s": 5, "duration_s": 30}, "server": {"profile": "a100-qwen3-32b-paper"}}
# 100 devices on the paper's A100 verifier with WISP on vLLM's LRU prefix cache: past its memory
# cliff, so about a third of the responses violate (neither 0 nor 1: a rate that cannot match by
# accident; with KV admission control, wisp's default, the rate at this N is a few percent)
DEVICES, SEED = 100, 1
RECORDED = "wisp-lru"


def short(policy: str = RECORDED) -> Scenario:
    return load_scenario(overrides=SHORT).with_policy(policy).with_devices(DEVICES)


@pytest.fixture(scope="module")
def recorded() -> SimResult:
    return simulate(resolve_server(short()), seed=SEED)


@pytest.fixture(scope="module")
def log_file(recorded: SimResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_log(recorded, tmp_path_factory.mktemp("log") / "wisp.parquet")


def _violation(res: SimResult) -> tuple[int, int]:
    r = res.responses[res.responses.measured]
    return int(r.violated.sum()), len(r)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_round_trip_reproduces_the_run(recorded: SimResult, tmp_path: Path, suffix: str) -> None:
    path = write_log(recorded, tmp_path / f"log{suffix}")
    log, meta = read_log(path)
    assert list(log.columns) == list(COLUMN_NAMES) and len(log) == len(recorded.rounds)
    assert meta["window"] == [5.0, 35.0] and meta["policy"] == RECORDED and meta["seed"] == SEED

    # the recorded violation rate, from the log alone, is the run's
    k, n = _violation(recorded)
    assert 0.1 < k / n < 0.9, "the test needs a load where the rate can differ"
    rec = recorded_responses(log, meta)
    rec = rec[rec.measured]
    assert (len(rec), int(rec.violated.sum())) == (n, k)
    assert summarize(recorded).iloc[-1].violation_rate == pytest.approx(k / n, abs=0)

    res = replay(log_scenario(meta, str(meta_path(path))), log, meta)
    k2, n2 = _violation(res)
    lo, hi = wilson(k, n)
    assert n2 == n and lo <= k2 / n2 <= hi  # within sampling error ...
    assert k2 == k  # ... and in fact exactly (docs/replay.md)
    table = compare(log, res, meta).set_index("class")
    assert list(table.index) == ["2", "4", "6", "8", "all"]
    assert (table.violation_diff == 0).all() and (table.truncated_simulated == 0).all()
    assert (table.queue_ks == 0).all() and (table.verify_ks == 0).all()
    assert table.loc["all", "queue_p99_ms_diff"] == 0


def test_replay_mirrors_the_device_loop_round_by_round(recorded: SimResult, log_file: Path) -> None:
    """Same policy and seed: every round arrives, dispatches and ends at the recorded time, in the
    same batch. If this breaks, study/replay/drive.py no longer mirrors Device.run_speculative.

    Up to where the recording stops knowing: a round still queued when the recording stopped has no
    verdict, so it is not in the log, yet the recorded scheduler saw it (docs/replay.md). From the
    last verdict of a response the recording left running, its next round may have been queued, and
    a batch may differ; every round dispatched before that is compared."""
    log, meta = read_log(log_file)
    res = replay(log_scenario(meta, "meta"), log, meta)
    rounds = res.rounds.copy()
    rounds["response"] = rounds.response.map(res.info["log_response"])
    cols = ["response", "round", "arrival", "budget", "dispatch", "verify_time", "batch", "l_cached", "t_end"]
    rec = recorded.rounds
    running = ~rec.response.isin(recorded.responses.response)  # no verdict on the response yet
    known = rec[running].groupby("response").t_end.max().min() if running.any() else math.inf
    a = rec[rec.dispatch < known][cols].sort_values(["response", "round"]).reset_index(drop=True)
    b = rounds[rounds.dispatch < known][cols].sort_values(["response", "round"]).reset_index(drop=True)
    assert len(a) > 0.95 * len(rec)  # the comparison covers the run
    pd.testing.assert_frame_equal(a, b)
    if known == math.inf:
        assert res.sim_end == recorded.sim_end


def test_censored_responses_without_rounds_travel_in_the_sidecar(tmp_path: Path) -> None:
    """Heavy overload: some measured responses complete no round before their SLO is lost. They
    are not in the rounds, so the sidecar lists them; both sides count them as violated."""
    over = {
        "workload": {"warmup_s": 0, "duration_s": 10, "output_tokens": {"dist": "constant", "value": 16}},
        "devices": {"classes": [8]},
    }
    sc = load_scenario(overrides=over).with_devices(300)
    orig = simulate(resolve_server(sc), seed=2)
    path = write_log(orig, tmp_path / "over.csv")
    log, meta = read_log(path)
    assert meta["unfinished"] and all(u["measured"] for u in meta["unfinished"])
    assert not set(log.response) & {u["response"] for u in meta["unfinished"]}
    res = replay(log_scenario(meta, "meta"), log, meta)
    table = compare(log, res, meta).set_index("class")
    assert table.loc["all", "responses_recorded"] == _violation(orig)[1] == _violation(res)[1]
    assert table.loc["all", "violation_recorded"] == table.loc["all", "violation_simulated"]
    assert table.loc["all", "unfinished_recorded"] >= len(meta["unfinished"])


def test_tiny_hand_written_log_replays_at_exact_times(det_scenario, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """One device, prompt 16, FCFS on the test profile (support.py: a=1e-4, b_compute=1e-6,
    b_read=1e-5, c=0.01, no noise). The log's own server times are ignored; its device-side times,
    the 0.1 s the device idles before its second round and the 1.1 s gap before its second
    response are kept."""
    rows = [
        # response 7: starts at 0; drafting starts 0.5 s later; two rounds commit 2 + 3 = 5 tokens
        (7, 0, 0.0, 5, 0, 0.5, 0.04, 0.01, 0.55, 0.02, 0.6, 2, 1, 2),
        (7, 1, 0.0, 5, 2, 0.7, 0.06, 0.01, 0.77, 0.02, 0.9, 3, 2, 3),
        # response 9: asked 1.1 s after response 7's recorded end (0.9 s)
        (9, 0, 2.0, 1, 0, 2.0, 0.02, 0.01, 2.03, 0.02, 2.1, 1, 0, 1),
    ]
    cols = ["response", "round", "response_start", "output_tokens", "position", "t_start", "draft_s"]
    cols += ["up_s", "t_arrival", "down_s", "t_end", "drafted", "accepted", "committed"]
    df = pd.DataFrame(rows, columns=cols).assign(device=3, slo=1.0, prompt_tokens=16, measured=True)
    path = tmp_path / "tiny.csv"
    df.to_csv(path, index=False)
    meta_path(path).write_text(json.dumps({"window": [0, 10]}))
    log, meta = read_log(path)
    res = replay(det_scenario(), log, meta, seed=0)
    r = res.rounds
    # round 1: cold, 18 new tokens: 18a + 18*18 b_compute + c
    v0 = 18e-4 + 324e-6 + 0.01
    # round 2: the 18-token prefix is cached, 3 new: 3a + 21*3 b_compute + 18 b_read + c
    v1 = 3e-4 + 63e-6 + 18e-5 + 0.01
    # response 9: a new session, cold: 17 new tokens
    v2 = 17e-4 + 289e-6 + 0.01
    end0 = 0.55 + v0 + 0.02
    end1 = end0 + 0.1 + 0.06 + 0.01 + v1 + 0.02
    start2 = end1 + 1.1
    assert r.t_start.tolist() == pytest.approx([0.5, end0 + 0.1, start2], abs=1e-12)
    assert r.arrival.tolist() == pytest.approx([0.55, end0 + 0.17, start2 + 0.03], abs=1e-12)
    assert r.verify_time.tolist() == pytest.approx([v0, v1, v2], abs=1e-12)
    assert r.l_cached.tolist() == [0, 18, 0]
    assert r.t_end.tolist() == pytest.approx([end0, end1, start2 + 0.03 + v2 + 0.02], abs=1e-12)
    resp = res.responses.set_index(res.responses.response.map(res.info["log_response"]))
    assert resp.t_start.tolist() == pytest.approx([0.0, start2], abs=1e-12)
    assert resp.speed.tolist() == pytest.approx([5 / end1, 1 / (0.03 + v2 + 0.02)], abs=1e-9)
    assert not resp.violated.any() and res.devices == 1


def _whatif(log_file: Path, policy: str) -> tuple[pd.DataFrame, SimResult, SimResult]:
    log, meta = read_log(log_file)
    sc = log_scenario(meta, "meta").with_policy(policy)
    res = replay(sc, log, meta)
    return compare(log, res, meta).set_index("class"), res, simulate(resolve_server(sc), seed=SEED)


def test_what_if_fcfs_matches_a_direct_fcfs_run(log_file: Path) -> None:
    """FCFS differs from WISP only on the server, and the devices draw the same numbers under both,
    so replaying the WISP log under FCFS must agree with simulating FCFS directly."""
    table, res, direct = _whatif(log_file, "fcfs")
    assert res.scenario.server.scheduler == "fcfs"
    row = table.loc["all"]
    assert np.isfinite(row[["violation_recorded", "violation_simulated", "queue_p90_ms_simulated"]]).all()
    assert row.violation_simulated < row.violation_recorded_lo  # FCFS does better at this load
    k, n = _violation(direct)
    lo, hi = wilson(k, n)
    assert lo <= row.violation_simulated <= hi


def test_what_if_centralized_serves_the_recorded_responses(log_file: Path) -> None:
    table, res, direct = _whatif(log_file, "centralized")
    assert res.rounds.empty and not res.batches.empty
    row = table.loc["all"]
    assert row.responses_simulated > 0 and np.isfinite(row.violation_simulated)
    assert np.isnan(row.queue_p50_ms_simulated) and np.isfinite(row.queue_p50_ms_recorded)
    k, n = _violation(direct)
    lo, hi = wilson(k, n)
    assert lo <= row.violation_simulated <= hi


def test_a_centralized_run_has_no_log(tmp_path: Path) -> None:
    res = simulate(
        resolve_server(
            load_scenario(overrides={"workload": {"warmup_s": 1, "duration_s": 3}})
            .with_policy("centralized")
            .with_devices(4)
        )
    )
    with pytest.raises(ConfigError, match="replay needs the log of a speculative run"):
        write_log(res, tmp_path / "c.parquet")


# ------------------------------------------------------------------------------------------
# bad logs
# ------------------------------------------------------------------------------------------


def _csv_log(log_file: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    df = pd.read_parquet(log_file)
    df = edit(df)
    path = tmp_path / "bad.csv"
    df.to_csv(path, index=False)
    meta_path(path).write_text(meta_path(log_file).read_text())
    return path


def _set(col: str, value: object, row: int = 3):  # type: ignore[no-untyped-def]
    def edit(df: pd.DataFrame) -> pd.DataFrame:
        df[col] = df[col].astype(object)
        df.loc[row, col] = value
        return df

    return edit


@pytest.mark.parametrize(
    ("edit", "column", "problem"),
    [
        (lambda df: df.drop(columns=["accepted"]), "accepted", "missing column(s) accepted"),
        (_set("draft_s", -0.01), "draft_s", "row 4: must be >= 0"),
        (_set("up_s", float("inf")), "up_s", "row 4: must be a finite number"),
        (_set("t_end", None), "t_end", "row 4: must be a finite number"),
        (_set("draft_s", "fast"), "draft_s", "row 4: not a number"),
        (lambda df: df.assign(accepted=df.drafted + 1), "accepted", "row 1: must be <= drafted"),
        (_set("measured", "maybe"), "measured", "row 4: must be true or false"),
        (lambda df: df.assign(position=0), "position", "position must be the tokens committed"),
        (lambda df: df.assign(measured=~df.measured), "measured", "the sidecar's window [5, 35)"),
    ],
)
def test_bad_logs_name_the_file_and_the_column(log_file: Path, tmp_path: Path, edit, column, problem) -> None:  # type: ignore[no-untyped-def]
    path = _csv_log(log_file, tmp_path, edit)
    with pytest.raises(ConfigError) as e:
        read_log(path)
    assert e.value.source == str(path) and e.value.field == column, str(e.value)
    assert problem in str(e.value)


def test_unreadable_logs_and_sidecars(log_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "corrupt.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(ConfigError, match=r"corrupt\.parquet: cannot read as Parquet"):
        read_log(bad)
    with pytest.raises(ConfigError, match=r"nope\.csv: file not found"):
        read_log(tmp_path / "nope.csv")
    with pytest.raises(ConfigError, match=r"unknown log format '\.txt'"):
        read_log(tmp_path / "log.txt")
    path = _csv_log(log_file, tmp_path, lambda df: df)
    meta_path(path).unlink()
    with pytest.raises(ConfigError, match=r"bad\.csv\.meta\.json: sidecar not found"):
        read_log(path)
    meta_path(path).write_text(json.dumps({"window": [10, 5]}))
    with pytest.raises(ConfigError) as e:
        read_log(path)
    assert e.value.field == "window"
    meta_path(path).write_text("{not json")
    with pytest.raises(ConfigError, match="not readable JSON"):
        read_log(path)


def test_a_minimal_real_log_without_server_columns_replays(log_file: Path, tmp_path: Path) -> None:
    """A deployment that logs only the device side, with a sidecar holding only the window."""
    path = _csv_log(log_file, tmp_path, lambda df: df[list(REQUIRED)])
    meta_path(path).write_text(json.dumps({"window": [5, 35]}))
    log, meta = read_log(path)
    assert log.queue_s.isna().all() and meta["unfinished"] == []
    res = replay(short(), log, meta, seed=SEED)
    table = compare(log, res, meta).set_index("class")
    assert np.isnan(table.loc["all", "queue_ks"]) and np.isfinite(table.loc["all", "violation_simulated"])
    assert table.loc["all", "violation_diff"] == 0  # the default scenario, policy and seed ran


# ------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_run_log_then_replay(tmp_path: Path) -> None:
    quick = ["--set", "workload.warmup_s=5", "--set", "workload.duration_s=30"]
    log = tmp_path / "run" / "log.csv"
    args = ["run", "--policy", RECORDED, "--devices", str(DEVICES), "--seed", str(SEED), *quick]
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run"), "--log", str(log)])
    assert r.exit_code == 0, r.output
    assert log.is_file() and meta_path(log).is_file()
    r = CliRunner().invoke(app, ["replay", str(log), "--out", str(tmp_path / "same")])
    assert r.exit_code == 0, r.output
    for f in ("rounds.parquet", "batches.parquet", "responses.parquet", "scenario.yaml", "comparison.csv"):
        assert (tmp_path / "same" / f).is_file(), f
    manifest = json.loads((tmp_path / "same" / "manifest.json").read_text())
    assert manifest["policy"] == manifest["recorded_policy"] == RECORDED and manifest["seed"] == SEED
    same = pd.read_csv(tmp_path / "same" / "comparison.csv", dtype={"class": str}).set_index("class")
    summary = pd.read_csv(tmp_path / "run" / "summary.csv", dtype={"class": str}).set_index("class")
    assert same.loc["all", "violation_simulated"] == same.loc["all", "violation_recorded"]
    assert same.loc["all", "violation_recorded"] == pytest.approx(summary.loc["all", "violation_rate"])
    sc = load_scenario(tmp_path / "same" / "scenario.yaml")
    assert (sc.workload.warmup_s, sc.workload.duration_s, sc.devices.count) == (5.0, 30.0, DEVICES)

    r = CliRunner().invoke(app, ["replay", str(log), "--policy", "fcfs", "--out", str(tmp_path / "fcfs")])
    assert r.exit_code == 0, r.output
    assert f"recorded ({RECORDED}) vs simulated (fcfs)" in " ".join(r.output.split())
    fcfs = pd.read_csv(tmp_path / "fcfs" / "comparison.csv", dtype={"class": str}).set_index("class")
    assert fcfs.loc["all", "violation_recorded"] == same.loc["all", "violation_recorded"]
    assert fcfs.loc["all", "violation_simulated"] != same.loc["all", "violation_simulated"]


def test_cli_bad_log_is_one_line_with_exit_code_2(log_file: Path, tmp_path: Path) -> None:
    path = _csv_log(log_file, tmp_path, lambda df: df.drop(columns=["t_end"]))
    p = subprocess.run(
        [sys.executable, "-m", "wispsim.cli", "replay", str(path), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    text = " ".join(p.stderr.split())
    assert "bad.csv: t_end: missing column(s) t_end" in text, text


def test_docs_describe_every_column() -> None:
    doc = (ROOT / "docs" / "replay.md").read_text()
    section = doc.split("## The log format")[1].split("### The sidecar")[0]
    table = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.M))
    assert table == set(COLUMN_NAMES)


@pytest.mark.parametrize("path", ["run", "replay"])
def test_the_chat_endpoint_is_honoured_by_run_and_replay(log_file: Path, path: str) -> None:
    """``server.host.endpoint: chat`` charges the chat template in the API server wherever the host
    CPU is modelled, on a run and on a replay alike (bench: tests/cli/test_bench_vllm_cli.py;
    serve refuses it: tests/runs/test_serve.py): the same responses start later."""
    import dataclasses

    log, meta = read_log(log_file)
    base = log_scenario(meta, "meta").with_policy("centralized")
    first = {}
    for endpoint in ("completions", "chat"):
        # a slow host (a tenth of the measuring one's speed): the template's 33 ms a request stands
        # clear of how the engine's steps fall
        host = dataclasses.replace(base.server.host, cpu="on", cpu_speed=0.1, endpoint=endpoint)
        sc = base.replace(server=dataclasses.replace(base.server, host=host))
        # a run at light load (4 devices: no queue to reorder them), a replay of the recorded 100
        res = (
            replay(sc, log, meta)
            if path == "replay"
            else simulate(resolve_server(sc.with_devices(4)), seed=SEED)
        )
        first[endpoint] = float((res.responses.t_first - res.responses.t_start).mean())
    assert first["chat"] > first["completions"]


def test_the_verifier_build_is_honoured_by_replay(log_file: Path) -> None:
    """``server.build`` on a replay (issue 46): the recorded devices' rounds meet the build's
    verifier. Replayed under WISP on its own build (wisp-grpc: resident sessions) a warm round
    forwards only its drafts (the model counts the bonus token as held); on a stock vLLM server it
    forwards its prefix's partial tail block again beside them."""
    from wispsim.config import parse_set

    log, meta = read_log(log_file)

    def on(build: str) -> SimResult:
        sc = log_scenario(meta, "meta", parse_set(["policy=wisp", f"server.build={build}"]))
        assert sc.server.build == build
        return replay(sc, log, meta)

    warm = lambda r: r[(r["round"] > 0) & (r.l_cached > 0)]  # noqa: E731
    mine, theirs = warm(on("wisp-grpc").rounds), warm(on("stock-vllm").rounds)
    assert len(mine) > 50 and (mine.l_new == mine.k).all()
    assert (theirs.l_new > theirs.k).mean() > 0.8 and theirs.l_new.mean() > mine.l_new.mean() + 3


def test_static_batching_is_honoured_by_replay(log_file: Path) -> None:
    """``server.engine.batching: static`` on a replay (issue 46): the recorded requests meet
    request-level batching, so later ones wait for the running batch and their first tokens come
    later than under continuous batching (serve and bench refuse it: tests/runs/test_serve.py,
    tests/cli/test_bench_vllm_cli.py)."""
    from wispsim.config import parse_set

    log, meta = read_log(log_file)

    def first(batching: str) -> float:
        sc = log_scenario(
            meta, "meta", parse_set(["policy=centralized", f"server.engine.batching={batching}"])
        )
        assert sc.server.engine.batching == batching
        r = replay(sc, log, meta).responses
        return float((r.t_first - r.t_start).mean())

    assert first("static") > 1.5 * first("continuous")
