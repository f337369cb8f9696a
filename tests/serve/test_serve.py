"""The real deployment's code paths without vLLM: the HTTP API, the dispatch loop, the wall-clock
SimPy environment, and a swarm against a server whose engine is a fake with vLLM's block-granular
prefix cache. The same paths on the real engine are tested in tests/serve/test_validate_vllm.py."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

# the serve extra (fastapi, uvicorn, httpx, psutil): without it these tests skip, and the commands say
# what to install (tests/cli/test_extras.py)
for _module in ("fastapi", "uvicorn", "httpx", "psutil"):
    pytest.importorskip(_module, reason="the serve extra: pip install 'wispsim[serve]'")

from tests.serve.support import serve_in_thread  # noqa: E402
from tests.support import ROOT, cli, write_profile  # noqa: E402
from wispsim.serve.swarm import WispsimServer  # noqa: E402
from wispsim.sim.scenarios import load_scenario, resolve_server  # noqa: E402

SCENARIO = ROOT / "scenarios" / "validation-cpu.yaml"
BLOCK = 128
FACTS = {
    "engine": "fake",
    "device": "cpu",
    "block_size": BLOCK,
    "kv_capacity_tokens": 23296,
    "vocab": 49152,
    "max_len": 600,
    "prefix_caching": True,
    "model": "fake",
    "dtype": "float32",
}


class FakeBackend:
    """vLLM's automatic prefix cache in miniature: whole blocks of earlier sequences are reused,
    the last token is always computed; never evicts. A batch takes 2 ms + 0.05 ms per new token."""

    def __init__(self, caching: bool = True) -> None:
        self.seen: set[tuple[int, ...]] = set()
        self.caching = caching
        self.batches: list[list[int]] = []

    def cached(self, seq: list[int]) -> int:
        hit = 0
        if self.caching:
            for end in range(BLOCK, len(seq), BLOCK):  # never the last token
                if tuple(seq[:end]) not in self.seen:
                    break
                hit = end
        return hit

    def run_batch(self, seqs: list[list[int]]) -> tuple[list[int], tuple[int, ...]]:
        cached = tuple(self.cached(s) for s in seqs)
        time.sleep(0.002 + 0.00005 * sum(len(s) - c for s, c in zip(seqs, cached, strict=True)))
        for s in seqs:
            for end in range(BLOCK, len(s) + 1, BLOCK):
                self.seen.add(tuple(s[:end]))
        self.batches.append([len(s) for s in seqs])
        return [7] * len(seqs), cached

    def reset_cache(self) -> None:
        self.seen.clear()

    def release_prefixes(self, seqs: list[list[int]]) -> int:
        """Session-aware freeing: an ended session's blocks leave the cache."""
        self.released = [*getattr(self, "released", []), *seqs]
        gone = {t for t in self.seen if any(list(t) == q[: len(t)] for q in seqs)}
        self.seen -= gone
        return len(gone)


def scenario(policy: str = "wisp", **workload: float):
    sc = load_scenario(SCENARIO).with_policy(policy)
    from dataclasses import replace

    return sc.replace(workload=replace(sc.workload, **workload)) if workload else sc


def test_api_answers_bad_requests_in_one_line() -> None:
    from fastapi.testclient import TestClient

    from wispsim.serve.app import make_app

    app = make_app(scenario(), FakeBackend(), FACTS)
    with TestClient(app) as c:
        assert c.get("/health").json()["policy"] == "wisp"
        sid = c.post("/sessions", json={"prompt": list(range(200, 400))}).json()["session"]
        r = c.post(
            f"/sessions/{sid}/rounds",
            json={"draft": [5, 6, 7], "accepted": 2, "commit": 3, "budget_s": 1.0, "n_hat": 3.0},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["committed"] == 3 and body["l_cached"] == 0 and body["l_new"] == 203
        assert body["batch"] == 0 and body["queue_s"] >= 0 and body["verify_s"] > 0
        # the next round reads the session's first whole block from the cache, as planned
        r = c.post(
            f"/sessions/{sid}/rounds",
            json={"draft": [5, 6], "accepted": 0, "commit": 1, "budget_s": 1.0, "n_hat": 1.0},
        )
        body = r.json()
        assert (body["l_cached"], body["l_new"]) == (128, 203 + 2 - 128)
        assert (body["l_cached_plan"], body["l_new_plan"]) == (128, 203 + 2 - 128)
        bad = [
            (
                "/sessions/99/rounds",
                {"draft": [1], "accepted": 0, "commit": 1, "budget_s": 1, "n_hat": 1},
                404,
                "no such session",
            ),
            (
                f"/sessions/{sid}/rounds",
                {"draft": [1], "accepted": 2, "commit": 1, "budget_s": 1, "n_hat": 1},
                422,
                "accepted",
            ),
            (
                f"/sessions/{sid}/rounds",
                {"draft": [1], "accepted": 1, "commit": 3, "budget_s": 1, "n_hat": 1},
                422,
                "commit",
            ),
            (
                f"/sessions/{sid}/rounds",
                {"draft": [10**9], "accepted": 0, "commit": 1, "budget_s": 1, "n_hat": 1},
                422,
                "vocabulary",
            ),
            (
                f"/sessions/{sid}/rounds",
                {"draft": [], "accepted": 0, "commit": 1, "budget_s": 1, "n_hat": 1},
                422,
                "draft",
            ),
            (
                f"/sessions/{sid}/rounds",
                {"draft": [1], "accepted": 0, "commit": 1, "n_hat": 1},
                422,
                "budget_s",
            ),
            ("/sessions", {"prompt": "hello"}, 422, "prompt"),
            ("/generate", {"prompt": [1], "output_tokens": 3}, 404, "speculative"),
        ]
        for path, payload, status, words in bad:
            r = c.post(path, json=payload)
            assert r.status_code == status, (path, r.text)
            detail = r.json()["detail"]
            assert isinstance(detail, str) and "\n" not in detail and words in detail, detail
        assert c.delete(f"/sessions/{sid}").status_code == 200
        assert c.delete(f"/sessions/{sid}").status_code == 404
        assert c.get("/log").status_code == 401 and c.post("/reset").status_code == 401
        auth = admin(app)
        log = c.get("/log", headers=auth).json()
        assert len(log["batches"]) == 2 and log["members"][1]["l_cached"] == 128
        assert c.post("/reset", headers=auth).json() == {"status": "reset"}
        assert c.get("/log", headers=auth).json()["batches"] == []


def test_admission_control_makes_a_session_wait_until_another_ends() -> None:
    """server.verifier.kv_policy: admission on the real server: with room for one reservation (prompt 200
    + 32 expected output + k_max + 1 = 2 blocks of 3), a second session's first round waits until
    the first session is closed; the engine is told to free the closed session's blocks first."""
    import threading

    from fastapi.testclient import TestClient

    from wispsim.serve.app import make_app

    sc = scenario("wisp")
    assert sc.server.verifier.kv_policy == "admission"
    backend = FakeBackend()
    app = make_app(sc, backend, {**FACTS, "kv_capacity_tokens": 3 * BLOCK})
    body = {"draft": [5, 6, 7], "accepted": 2, "commit": 3, "budget_s": 5.0, "n_hat": 3.0}
    with TestClient(app) as c:
        a = c.post("/sessions", json={"prompt": list(range(200, 400))}).json()["session"]
        b = c.post("/sessions", json={"prompt": list(range(400, 600))}).json()["session"]
        assert c.post(f"/sessions/{a}/rounds", json=body).status_code == 200
        answer: dict[str, Any] = {}
        t = threading.Thread(target=lambda: answer.update(c.post(f"/sessions/{b}/rounds", json=body).json()))
        t.start()
        time.sleep(0.4)
        assert not answer  # b waits: its reservation does not fit beside a's
        assert c.post(f"/sessions/{a}/rounds", json=body).json()["l_cached"] == 128  # a runs on
        assert c.delete(f"/sessions/{a}").status_code == 200
        t.join(10)
        assert answer["committed"] == 3 and answer["queue_s"] >= 0.4
        members = c.get("/log", headers=admin(app)).json()["members"]
        waits = [m["admission_wait_s"] for m in members]  # a's two rounds, then b's
        assert waits[:2] == [0, 0] and waits[2] >= 0.4
        assert backend.released and backend.released[0][:200] == list(range(200, 400))
        # a session closed while its round waits is answered; so is one still waiting at a reset
        # (devices that are gone leave b admitted and the rest waiting behind it)
        for finish in ("delete", "reset"):
            wid = c.post("/sessions", json={"prompt": list(range(600, 800))}).json()["session"]
            late: dict[str, Any] = {}
            t = threading.Thread(
                target=lambda wid=wid, late=late: late.update(
                    status=c.post(f"/sessions/{wid}/rounds", json=body).status_code
                )
            )
            t.start()
            time.sleep(0.3)
            assert not late
            if finish == "delete":
                assert c.delete(f"/sessions/{wid}").status_code == 200
            else:
                assert c.post("/reset", headers=admin(app)).status_code == 200
            t.join(10)
            assert late["status"] == 409, finish


def test_wall_clock_waits_and_wakes_on_posts() -> None:
    from wispsim.serve.clock import WallClock

    env = WallClock()
    seen: list[tuple[str, float]] = []
    ev = env.event()

    def proc():
        yield env.timeout(0.2)
        seen.append(("timeout", env.now))
        yield ev
        seen.append(("posted", env.now))

    env.process(proc())
    threading.Timer(0.35, lambda: env.post(ev.succeed)).start()
    t0 = time.monotonic()
    env.run(until=ev)
    env.run(until=env.now + 0.01)
    wall = time.monotonic() - t0
    assert seen[0][0] == "timeout" and seen[0][1] == pytest.approx(0.2)
    assert seen[1][0] == "posted" and 0.33 < seen[1][1] < 0.6
    assert 0.33 < wall < 1.0


TOKEN = "test-admin-token-0123456789"


@pytest.fixture()
def fake_server(monkeypatch: pytest.MonkeyPatch):
    """A real HTTP server (uvicorn, in a thread) on the fake engine; yields (url, backend). Its
    admin token is ``TOKEN``, in the environment for the swarm command."""
    from wispsim.serve.app import make_app
    from wispsim.serve.limits import ADMIN_TOKEN_ENV, Limits

    monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
    stops = []

    def start(policy: str = "wisp"):
        backend = FakeBackend(caching=policy != "sled")
        url, stop = serve_in_thread(make_app(scenario(policy), backend, FACTS, Limits(admin_token=TOKEN)))
        stops.append(stop)
        return url, backend

    yield start
    for stop in stops:
        stop()


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_swarm_records_what_the_server_did_and_the_log_replays(fake_server, tmp_path: Path) -> None:
    from wispsim.serve.swarm import run_swarm
    from wispsim.study.replay import compare, log_scenario, read_log, replay, write_log

    url, backend = fake_server("wisp")
    sc = scenario("wisp", warmup_s=0.5, duration_s=3.0).with_devices(3)
    run = run_swarm(resolve_server(sc), WispsimServer(url, token=TOKEN))
    r = run.result.rounds
    assert len(r) > 20 and r.batch.ge(0).all()
    assert (r.dispatch >= r.arrival - 0.05).all()  # one host: the clocks agree (loose: a loaded machine)
    assert (r.verify_time > 0).all() and (r.t_end >= r.dispatch + r.verify_time - 0.05).all()
    # the fake reuses whole 128-token blocks and always computes the last token, like vLLM
    prefix = r.l_new + r.l_cached - r.k
    later = r["round"] > 0
    assert (r.l_cached[later] == (prefix[later] // BLOCK) * BLOCK).all()
    assert (r.l_cached[~later] == 0).all() and r.cold[~later].all()
    # the server's batches are the rounds' batches
    sb = run.server_batches
    assert set(r.batch) <= set(sb.batch) and len(sb) <= len(backend.batches)  # one may still run
    assert (sb.n_cached == sb.n_cached_plan).mean() > 0.9  # the scheduler's view of the cache holds
    assert set(run.result.batches.columns) >= {"t_dispatch", "latency", "size"}
    path = write_log(run.result, tmp_path / "real.parquet")
    log, meta = read_log(path)
    sim = replay(log_scenario(meta, str(path)), log, meta)
    table = compare(log, sim, meta)
    assert "violation_recorded" in table.columns and len(table)


def test_swarm_refuses_a_server_of_another_policy(fake_server, capsys, monkeypatch) -> None:
    url, _ = fake_server("fcfs")
    code, _, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--policy", "wisp", "--url", url,
                       "--devices", "1", "--out", "/tmp/wispsim-test-swarm-refused")  # fmt: skip
    assert code == 2 and "runs fcfs" in err and "--policy wisp" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_swarm_cli_writes_records_and_log(fake_server, capsys, monkeypatch, tmp_path: Path) -> None:
    url, _ = fake_server("wisp")
    out, log = tmp_path / "swarm", tmp_path / "log.csv"
    code, _stdout, err = cli(capsys, monkeypatch, "swarm", str(SCENARIO), "--policy", "wisp", "--url", url,
                            "--devices", "2", "--out", str(out), "--log", str(log),
                            "--set", "workload.warmup_s=0.5", "--set", "workload.duration_s=2")  # fmt: skip
    assert code == 0, err
    for name in (
        "rounds.parquet",
        "responses.parquet",
        "server_batches.parquet",
        "summary.csv",
        "manifest.json",
    ):
        assert (out / name).is_file(), name
    assert len(pd.read_csv(log)) > 5 and (tmp_path / "log.csv.meta.json").is_file()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["serve", "--arch", "nope"], "--arch"),
        (["serve"], "--model/--arch"),
        (["serve", "--arch", "tiny-vllm", "--model", "x"], "--model/--arch"),
        (["serve", "--arch", "tiny-vllm", "--dtype", "int3"], "--dtype"),
        (["serve", "--arch", "tiny-vllm", "--port", "70000"], "--port"),
        (["serve", "--arch", "tiny-vllm", "--set", "server.replicas=2"], "replicas"),
        (["validate", "--arch", "tiny-vllm", "--regime", "a b:x=1"], "--regime"),
        (["validate", "--arch", "tiny-vllm", "--regime", "a", "--regime", "a"], "unique"),
        (
            ["validate", "--arch", "tiny-vllm", "--regime", "p:server.engine.kv_capacity_tokens=-3"],
            "kv_capacity_tokens",
        ),
        (["validate", "--arch", "tiny-vllm", "--policies", "wisp,nope"], "nope"),
        (
            ["swarm", "--url", "http://127.0.0.1:9", "--devices", "1", "--admin-token", "t" * 20],
            "127.0.0.1:9",
        ),
        (["swarm", "--url", "http://127.0.0.1:9", "--devices", "1"], "--admin-token"),
        (["serve", "--arch", "tiny-vllm", "--max-sessions", "0"], "--max-sessions"),
        (["serve", "--arch", "tiny-vllm", "--session-idle-s", "0.1"], "--session-idle-s"),
        (["serve", "--arch", "tiny-vllm", "--max-body-bytes", "10"], "--max-body-bytes"),
        (["serve", "--arch", "tiny-vllm", "--admin-token", "short"], "--admin-token"),
    ],
)
def test_bad_options_are_one_line_errors(
    capsys, monkeypatch, tmp_path: Path, args: list[str], words: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, monkeypatch, *args)
    assert code == 2, err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_capacity_is_the_last_n_before_the_first_miss() -> None:
    from wispsim.study.validate import capacity_of

    assert capacity_of({2: 0.0, 4: 0.04, 6: 0.2, 8: 0.0}, 0.05) == 4
    assert capacity_of({2: 0.5, 4: 0.0}, 0.05) == 0
    assert capacity_of({2: 0.0, 4: float("nan")}, 0.05) == 2


@pytest.mark.slow
def test_validate_real_from_simulates_stored_real_points_again(
    fake_server, capsys, monkeypatch, tmp_path: Path
) -> None:
    """A stored real point is simulated again without a server; --sim-set changes only the
    simulated side, and done.json is written last with both."""
    import json

    from wispsim.results import Results
    from wispsim.serve.real_points import store_real
    from wispsim.serve.swarm import run_swarm
    from wispsim.study.validate import DONE, SimSide, point, store_sim

    url, _ = fake_server("wisp")
    sc = scenario("wisp", warmup_s=0.5, duration_s=2.0).with_devices(2)
    first = tmp_path / "first"
    folder = point(Results(first), "compute", "wisp", 2)
    store_real(folder, sc, run_swarm(resolve_server(sc), WispsimServer(url, token=TOKEN)))
    done = store_sim(folder, SimSide(sc), 2)
    assert (folder / DONE).is_file() and done["real"]["responses"] >= 1
    assert done["server"]["kv_capacity_tokens"] == FACTS["kv_capacity_tokens"]
    sim_sc = (folder / "sim_scenario.yaml").read_text()
    assert "kv_capacity_tokens: 23296" in sim_sc  # the engine's real capacity, not the profile's
    assert (folder / "replay_comparison.csv").is_file() and (folder / "real_log.parquet").is_file()
    again = tmp_path / "again"
    code, _, err = cli(capsys, monkeypatch, "validate", str(SCENARIO), "--policies", "wisp", "--devices", "2",
                       "--real-from", str(first), "--out", str(again),
                       "--set", "workload.warmup_s=0.5", "--set", "workload.duration_s=2",
                       "--sim-set", "server.verifier.delta_ms=50")  # fmt: skip
    assert code == 0, err
    redone = json.loads((point(Results(again), "compute", "wisp", 2) / DONE).read_text())
    assert redone["real"] == done["real"] and redone["sim_sets"] == ["server.verifier.delta_ms=50"]
    assert "delta_ms: 50" in (point(Results(again), "compute", "wisp", 2) / "sim_scenario.yaml").read_text()
    comp = pd.read_csv(again / "comparison.csv")
    assert (
        set(comp.metric) >= {"violation_rate", "goodput_tps", "verify_p50_ms"} and (comp.devices == 2).all()
    )
    code, _, err = cli(capsys, monkeypatch, "validate", "--real-from", str(first), "--out", str(first))
    assert code == 2 and "--real-from" in err
    # re-priced with another profile (a 1 GiB toy GPU: no activation reserve), the simulated
    # scheduler still plans as the real server did
    fitted = write_profile(tmp_path / "fitted.yaml")
    priced = tmp_path / "priced"
    code, _, err = cli(capsys, monkeypatch, "validate", str(SCENARIO), "--policies", "wisp", "--devices", "2",
                       "--real-from", str(first), "--out", str(priced),
                       "--set", "workload.warmup_s=0.5", "--set", "workload.duration_s=2",
                       "--sim-set", f"server.profile={fitted}",
                       "--sim-set", "server.engine.activation_reserve_gib=0")  # fmt: skip
    assert code == 0, err
    sim_sc = point(Results(priced), "compute", "wisp", 2) / "sim_scenario.yaml"
    sim_srv = yaml.safe_load(sim_sc.read_text())["server"]
    served = yaml.safe_load((folder / "scenario.yaml").read_text())["server"]
    assert sim_srv["profile"] == str(fitted) and sim_srv["planning_profile"] == served["profile"]


@pytest.mark.slow
def test_profile_fit_reads_a_deployment_batch_log(fake_server, capsys, monkeypatch, tmp_path: Path) -> None:
    """The fake engine takes 2 ms + 0.05 ms per new token: the fit from its logged batches finds that."""
    import json

    from wispsim.results import Results
    from wispsim.serve.real_points import store_real
    from wispsim.serve.swarm import run_swarm
    from wispsim.study.validate import point

    url, _ = fake_server("wisp")
    sc = scenario("wisp", warmup_s=0.5, duration_s=3.0).with_devices(3)
    folder = point(Results(tmp_path / "v"), "compute", "wisp", 3)
    store_real(folder, sc, run_swarm(resolve_server(sc), WispsimServer(url, token=TOKEN)))
    out = tmp_path / "prof" / "deployed.yaml"
    code, _, err = cli(capsys, monkeypatch, "profile", "fit", str(tmp_path / "v"), "--out", str(out),
                       "--bootstrap", "20", "--no-plots", "--folds", "2")  # fmt: skip
    assert code == 0, err
    rows = pd.read_csv(tmp_path / "prof" / "data" / "deployed.csv")
    assert len(rows) > 10 and (rows.category == "deployment").all()
    assert (rows.n_cached % BLOCK == 0).all()
    meta = json.loads((tmp_path / "prof" / "data" / "deployed.csv.meta.json").read_text())
    assert meta["model_facts"]["name"] == "HuggingFaceTB/SmolLM2-135M" and meta["deployment"][
        "batches"
    ] == len(rows)
    from wispsim.model.profiles import load_profile

    est = load_profile(str(out)).estimator
    assert 5e-6 < est.a < 5e-4  # 0.05 ms per new token (sleep timing on a shared machine is loose)
    code, _, err = cli(
        capsys, monkeypatch, "profile", "fit", str(tmp_path / "prof"), "--out", str(tmp_path / "x.yaml")
    )
    assert code == 2 and "no verification batch log" in err


class FakeResident:
    """Sessions kept in a fake engine: what each holds, what each round sent, who ended."""

    def __init__(self) -> None:
        self.held: dict[int, list[int]] = {}
        self.sent: list[tuple[int, int, int]] = []  # (session, tokens sent, tokens held)
        self.ended: list[int] = []

    def run(self, items: list[tuple[int, list[int], list[int]]]) -> tuple[list[int], tuple[int, ...]]:
        held = []
        for sid, committed, draft in items:
            have = self.held.get(sid, [])
            keep = 0
            while keep < min(len(have), len(committed)) and have[keep] == committed[keep]:
                keep += 1
            self.sent.append((sid, len(committed) - keep + len(draft), keep))
            self.held[sid] = committed + draft
            held.append(keep)
        return [7] * len(items), tuple(held)

    def end(self, sids: list[int]) -> None:
        self.ended += sids
        for sid in sids:
            self.held.pop(sid, None)

    def clear(self) -> None:
        self.end(list(self.held))


def test_a_resident_verifier_sends_each_round_its_new_tokens_only() -> None:
    """server.verifier.kind: resident on the real server: the session stays in the engine, a round
    sends the last bonus token and its drafts (what the reply and the log call l_new) over the
    held tokens (l_cached); a closed session ends in the engine (in the batch thread, once it is
    idle), a reset ends the rest; the re-submitting run_batch is never called."""
    from fastapi.testclient import TestClient

    from wispsim.serve.app import make_app

    sc = scenario("wisp")
    sc = sc.replace(server=replace(sc.server, verifier=replace(sc.server.verifier, kind="resident")))
    backend = FakeBackend()
    resident = FakeResident()
    backend.resident_sessions = lambda: resident  # type: ignore[attr-defined]
    app = make_app(sc, backend, FACTS)
    body = {"draft": [5, 6, 8], "accepted": 2, "commit": 3, "budget_s": 5.0, "n_hat": 3.0}
    with TestClient(app) as c:
        a = c.post("/sessions", json={"prompt": list(range(200, 400))}).json()["session"]
        b = c.post("/sessions", json={"prompt": list(range(400, 500))}).json()["session"]
        first = c.post(f"/sessions/{a}/rounds", json=body).json()
        assert (first["l_new"], first["l_cached"]) == (203, 0)  # the session opens
        second = c.post(f"/sessions/{a}/rounds", json=body).json()
        assert (second["l_new"], second["l_cached"]) == (4, 202)  # the bonus token and 3 drafts
        assert c.delete(f"/sessions/{a}").status_code == 200
        deadline = time.monotonic() + 5  # ended in the batch thread as soon as it is idle
        while not resident.ended and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(resident.ended) == 1
        assert c.post(f"/sessions/{b}/rounds", json=body).json()["l_new"] == 103
        assert len(resident.ended) == 1
        assert c.post("/reset", headers=admin(app)).status_code == 200
        assert len(resident.ended) == 2 and not resident.held
    assert backend.batches == []


def admin(app: Any) -> dict[str, str]:
    """The header /reset and /log need."""
    return {"Authorization": f"Bearer {app.state.admin_token}"}
