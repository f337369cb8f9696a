"""The real server on vLLM's CPU backend, tried as a hostile and as a careless client would
(issue 42). Each test names the item of the issue it covers; the corruption item (one session's
rollback changing another's answers) is tests/engines/test_vllm_resident.py, on a model whose next
token depends on its whole context. Fast versions of the same promises on fake engines:
tests/serve/test_promises.py.

The servers run in this process (uvicorn in a thread) on one small vLLM engine: tiny-vllm's shape,
random weights, a KV cache of 24 usable blocks of 128 tokens, so admission binds at a few dozen
sessions. One test starts ``wispsim serve`` itself, on the default scenario with the resident
verifier, and stops it with SIGTERM under load.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("vllm")
for _module in ("fastapi", "uvicorn", "httpx", "psutil", "prometheus_client"):
    pytest.importorskip(_module, reason="the serve extra: pip install 'wispsim[serve]'")

import httpx  # noqa: E402

from tests.serve.support import free_port, serve_in_thread  # noqa: E402
from tests.serve.test_serve import SCENARIO  # noqa: E402
from tests.support import ROOT  # noqa: E402
from wispsim.serve.limits import Limits  # noqa: E402
from wispsim.sim.scenarios import load_scenario  # noqa: E402

pytestmark = pytest.mark.slow  # real vLLM engines and servers

TOKEN = "hostile-test-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
USABLE_BLOCKS = 24
ROUND = {"draft": [5, 6, 7], "accepted": 2, "commit": 3, "budget_s": 5.0, "n_hat": 3.0}


def served(policy: str, kind: str = "resubmit") -> Any:
    """The validation scenario for ``policy`` (its verifier of ``kind``), its KV cache capped at
    24 usable blocks."""
    sc = load_scenario(SCENARIO).with_policy(policy)
    srv = sc.server
    engine = replace(srv.engine, kv_capacity_tokens=USABLE_BLOCKS * 128)
    verifier = replace(srv.verifier, kind=kind) if srv.mode == "speculative" else srv.verifier
    return sc.replace(server=replace(srv, engine=engine, verifier=verifier))


@pytest.fixture(scope="module")
def start() -> Iterator[Any]:
    """Start a real server (in this process) for a scenario; yields ``start(sc, **limits) ->
    (url, app)``; every server is stopped at the end (the engine is shared: same settings)."""
    from wispsim.serve.app import ModelSource, VLLMBackend, build_engine, make_app

    running: list[Any] = []

    def run(sc: Any, **limits: Any) -> tuple[str, Any]:
        for stop in running:  # one server on the engine at a time
            stop()
        running.clear()
        engine, facts = build_engine(sc, ModelSource(arch="tiny-vllm"))
        app = make_app(sc, VLLMBackend(engine), facts, Limits(admin_token=TOKEN, **limits))
        url, stop = serve_in_thread(app)
        running.append(stop)
        return url, app

    yield run
    for stop in running:
        stop()


def open_sessions(http: httpx.Client, n: int, length: int, first: int = 200) -> list[str]:
    out = []
    for i in range(n):
        prompt = [(first + i * 7 + j) % 500 + 1 for j in range(length)]
        r = http.post("/sessions", json={"prompt": prompt})
        assert r.status_code == 200, r.text
        out.append(r.json()["session"])
    return out


def rounds_at_once(
    url: str, ids: list[str], body: dict[str, Any], timeout: float = 90
) -> list[httpx.Response]:
    """One round per session, all sent at once; each answer (or the test fails on a timeout)."""

    def one(sid: str) -> httpx.Response:
        with httpx.Client(base_url=url, timeout=timeout) as http:
            return http.post(f"/sessions/{sid}/rounds", json=body)

    with concurrent.futures.ThreadPoolExecutor(len(ids)) as pool:
        return list(pool.map(one, ids))


def test_ordinary_load_past_capacity_waits_for_room_and_is_all_served(start: Any) -> None:
    """Item 1 and 5: 40 sessions of 80-token prompts, one round each, never closed. Each needs one
    KV block with its expected output: 24 fit the engine at once (vLLM's own block left out) and
    the rest wait for admission -- no round is skipped by vLLM and waits forever. The devices
    never close their sessions: the idle ones expire and the waiting rounds are served."""
    url, _ = start(served("wisp", "resident"), session_idle_s=2.0)
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/health").json()["load"]["admission_limit_blocks"] == USABLE_BLOCKS
        ids = open_sessions(http, 40, 80)
        seen: list[dict[str, Any]] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                seen.append(http.get("/health").json()["load"])
                time.sleep(0.2)

        watcher = threading.Thread(target=watch)
        watcher.start()
        t0 = time.monotonic()
        answers = rounds_at_once(url, ids, ROUND)
        stop.set()
        watcher.join()
        assert [r.status_code for r in answers] == [200] * 40
        assert time.monotonic() - t0 < 60
        assert max(s["admission_sessions"] for s in seen) == USABLE_BLOCKS
        assert max(s["admission_waiting"] for s in seen) >= 10
        load = http.get("/health").json()["load"]
        assert load["sessions_expired_total"] >= 16
        assert "rounds_unserved_total" not in load  # admission kept every round within the engine's room
        assert http.post("/reset", headers=AUTH).status_code == 200


def test_drafts_longer_than_reserved_are_refused_and_the_server_serves_on(start: Any) -> None:
    """Item 1, the hostile form: admitted sessions sending drafts far longer than the k_max + 1
    tokens admission reserved for them get a 422; ordinary rounds go on being served."""
    url, _ = start(served("wisp", "resident"))
    with httpx.Client(base_url=url, timeout=60) as http:
        ids = open_sessions(http, 12, 200)
        assert [r.status_code for r in rounds_at_once(url, ids, ROUND)] == [200] * 12
        long = {"draft": list(range(1, 251)), "accepted": 0, "commit": 1, "budget_s": 5.0, "n_hat": 1.0}
        answers = rounds_at_once(url, ids, long)
        assert {r.status_code for r in answers} == {422} and "k_max" in answers[0].json()["detail"]
        assert [r.status_code for r in rounds_at_once(url, ids, ROUND)] == [200] * 12
        for sid in ids:
            assert http.delete(f"/sessions/{sid}").status_code == 200


def test_a_round_whose_session_closes_while_queued_is_answered(start: Any) -> None:
    """Item 3: rounds are sent while their sessions are being closed; every one is answered (a
    verdict if it ran first, a 409 if it was still waiting), none is left without a reply."""
    url, _ = start(served("fcfs"))
    with httpx.Client(base_url=url, timeout=30) as http:
        ids = open_sessions(http, 16, 300)
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            sent = [pool.submit(rounds_at_once, url, [sid], ROUND, 30) for sid in ids]
            closed = [pool.submit(http.delete, f"/sessions/{sid}") for sid in ids]
            answers = [f.result()[0] for f in sent]
            assert all(f.result().status_code in (200, 404) for f in closed)
        assert {r.status_code for r in answers} <= {200, 404, 409}
        waited = [r for r in answers if r.status_code == 409]
        assert all("closed while its round waited" in r.json()["detail"] for r in waited)
        assert http.get("/health").json()["load"]["sessions"] == 0


def test_sessions_are_owned_and_the_admin_routes_guarded(start: Any) -> None:
    """Item 4 on the real server."""
    url, _ = start(served("wisp"))
    with httpx.Client(base_url=url, timeout=30) as http:
        (mine,) = open_sessions(http, 1, 150)
        assert http.post(f"/sessions/{mine}/rounds", json=ROUND).status_code == 200
        # A near miss of the real id: its last two characters changed (an id may itself end in "AA").
        near = mine[:-2] + ("AA" if mine[-2:] != "AA" else "QA")
        for guess in ("0", "1", near):
            assert http.post(f"/sessions/{guess}/rounds", json=ROUND).status_code == 404
            assert http.delete(f"/sessions/{guess}").status_code == 404
        assert http.post("/reset").status_code == 401 and http.get("/log").status_code == 401
        log = http.get("/log", headers=AUTH).json()
        assert len(log["members"]) == 1 and mine not in json.dumps(log)
        assert http.post("/reset", headers=AUTH).status_code == 200
        assert http.post(f"/sessions/{mine}/rounds", json=ROUND).status_code == 404


def test_a_huge_body_is_refused_unread_and_stalls_nobody(start: Any) -> None:
    """Item 5: a 100 MB body is refused by its declared length before it is read, and one sent
    without a length is cut off at the cap; /health answers meanwhile."""
    url, _ = start(served("wisp"))
    big = b'{"prompt": [' + b"1," * (50 * 1024 * 1024) + b"1]}"

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    with httpx.Client(base_url=url, timeout=60) as http:
        results: dict[str, Any] = {}

        def send() -> None:
            results["sized"] = http.post(
                "/sessions", content=big, headers={"content-type": "application/json"}
            )
            results["chunked"] = http.post(
                "/sessions", content=chunked(), headers={"content-type": "application/json"}
            )

        t = threading.Thread(target=send)
        t.start()
        worst = 0.0
        while t.is_alive():
            t0 = time.monotonic()
            assert http.get("/health").status_code == 200
            worst = max(worst, time.monotonic() - t0)
            time.sleep(0.05)
        assert results["sized"].status_code == 413 and results["chunked"].status_code == 413
        assert worst < 1.0


def test_centralized_responses_are_capped_and_abandoned_ones_aborted(start: Any) -> None:
    """The same promises for centralized serving: at most --max-sessions live responses, and a
    response whose client went away is aborted in vLLM (it stops using the engine)."""
    url, _ = start(served("centralized"), max_sessions=2)
    body = {"prompt": [i % 500 + 1 for i in range(300, 500)], "output_tokens": 60}
    with httpx.Client(base_url=url, timeout=60) as http:
        with http.stream("POST", "/generate", json=body) as r1:
            lines1 = r1.iter_lines()
            next(lines1)
            with http.stream("POST", "/generate", json=body) as r2:
                lines2 = r2.iter_lines()
                next(lines2)
                assert http.post("/generate", json=body).status_code == 503
        deadline = time.monotonic() + 10
        while http.get("/health").json()["load"]["responses_live"] and time.monotonic() < deadline:
            time.sleep(0.1)
        load = http.get("/health").json()["load"]
        assert load["responses_live"] == 0 and load["responses_aborted_total"] == 2
        lines = [json.loads(x) for x in http.post("/generate", json=body).iter_lines() if x.strip()]
        assert lines[-1]["tokens"] == 60


def test_wispsim_serve_on_the_default_scenario_starts_resident_and_stops_on_sigterm(tmp_path: Any) -> None:
    """Item 6: the default scenario with the resident verifier starts (the KV block is the
    engine's, not the profile's); SIGTERM in the middle of rounds ends the process and its
    children within seconds."""
    import psutil

    port = free_port()
    env = {**os.environ, "WISPSIM_ADMIN_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "wispsim.cli", "serve", "--arch", "tiny-vllm", "--port", str(port),
           "--set", "server.verifier.kind=resident"]  # fmt: skip
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        facts = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                facts = httpx.get(f"{url}/health", timeout=2).json()
                break
            except httpx.HTTPError:
                time.sleep(1)
        assert facts is not None, log.read_text()[-2000:]
        assert facts["block_size"] == 128 and facts["verifier"] == "resident"
        with httpx.Client(base_url=url, timeout=60) as http:
            ids = open_sessions(http, 24, 300)
        pool = concurrent.futures.ThreadPoolExecutor(24)
        pending = [pool.submit(rounds_at_once, url, [sid], ROUND, 60) for sid in ids]
        time.sleep(0.3)
        children = psutil.Process(proc.pid).children(recursive=True)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 20
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        for f in pending:  # every round got an answer or a closed connection, none hangs
            with contextlib.suppress(httpx.HTTPError):
                f.result(timeout=30)
        pool.shutdown()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
