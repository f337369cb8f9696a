"""What the real server promises a hostile or careless client (issue 42), on fake engines: every
accepted request answered, sessions owned, everything bounded, and the swarm retrying where the
server says "not now". The same promises on the real engine: tests/serve/test_hostile.py."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

for _module in ("fastapi", "uvicorn", "httpx", "psutil", "prometheus_client"):
    pytest.importorskip(_module, reason="the serve extra: pip install 'wispsim[serve]'")

from tests.serve.support import serve_in_thread  # noqa: E402
from tests.serve.test_serve import BLOCK, FACTS, TOKEN, FakeBackend, FakeResident, scenario  # noqa: E402
from wispsim.engines.vllm_steps import EngineStalled  # noqa: E402
from wispsim.serve.limits import Limits  # noqa: E402

ROUND = {"draft": [5, 6, 7], "accepted": 2, "commit": 3, "budget_s": 5.0, "n_hat": 3.0}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class SlowBackend(FakeBackend):
    """A batch takes ``delay`` seconds; ``fail`` makes the next batch raise it."""

    def __init__(self, delay: float = 0.5) -> None:
        super().__init__()
        self.delay = delay
        self.fail: BaseException | None = None

    def run_batch(self, seqs: list[list[int]]) -> tuple[list[int], tuple[int, ...]]:
        time.sleep(self.delay)
        if self.fail is not None:
            e, self.fail = self.fail, None
            raise e
        return super().run_batch(seqs)


def client(sc: Any = None, backend: Any = None, facts: dict[str, Any] | None = None, **limits: Any) -> Any:
    from fastapi.testclient import TestClient

    from wispsim.serve.app import make_app

    app = make_app(
        sc or scenario(), backend or FakeBackend(), facts or FACTS, Limits(admin_token=TOKEN, **limits)
    )
    return TestClient(app)


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        r = fn()
        out.update(status=r.status_code, body=r.json(), headers=dict(r.headers))

    t = threading.Thread(target=run)
    t.start()
    return t, out


def open_session(c: Any, start: int = 200, n: int = 200) -> str:
    r = c.post("/sessions", json={"prompt": list(range(start, start + n))})
    assert r.status_code == 200, r.text
    return str(r.json()["session"])


def test_sessions_are_owned_by_unguessable_ids() -> None:
    """An id is 128 random bits; a wrong, stale or closed id gets the same 404, naming nothing;
    ids do not come back after a reset; /reset and /log need the admin token."""
    with client() as c:
        ids = {open_session(c, 200 + 10 * i) for i in range(20)}
        assert len(ids) == 20 and all(len(i) >= 22 for i in ids)
        a = sorted(ids)[0]
        assert c.post(f"/sessions/{a}/rounds", json=ROUND).status_code == 200
        details = set()
        for other in ("0", "1", a[:-1] + ("A" if a[-1] != "A" else "B"), "x" * 22):
            r = c.post(f"/sessions/{other}/rounds", json=ROUND)
            assert r.status_code == 404
            details.add(r.json()["detail"])
            assert c.delete(f"/sessions/{other}").status_code == 404
        assert len(details) == 1 and a not in details.pop()
        for path, method in (("/reset", "post"), ("/log", "get")):
            assert getattr(c, method)(path).status_code == 401
            bad = {"Authorization": "Bearer " + TOKEN[:-1] + "x"}
            assert getattr(c, method)(path, headers=bad).status_code == 401
        assert c.post("/reset", headers=AUTH).status_code == 200
        assert c.post(f"/sessions/{a}/rounds", json=ROUND).status_code == 404  # gone with the reset
        assert open_session(c) not in ids


def test_a_draft_longer_than_admission_reserved_is_refused() -> None:
    with client() as c:
        sid = open_session(c)
        k_max = scenario().drafting.largest
        body = {**ROUND, "draft": list(range(1, k_max + 2)), "accepted": 0, "commit": 1}
        r = c.post(f"/sessions/{sid}/rounds", json=body)
        assert r.status_code == 422 and f"k_max = {k_max}" in r.json()["detail"]
        ok = {**body, "draft": body["draft"][:k_max]}
        assert c.post(f"/sessions/{sid}/rounds", json=ok).status_code == 200


def test_a_round_queued_when_its_session_closes_is_answered() -> None:
    """b's round waits behind a's batch; b is closed meanwhile: b's round gets a 409 at once."""
    backend = SlowBackend(delay=1.0)
    with client(scenario("fcfs"), backend) as c:
        a, b = open_session(c, 200), open_session(c, 400)
        ta, ra = in_thread(lambda: c.post(f"/sessions/{a}/rounds", json=ROUND))
        time.sleep(0.2)  # a's batch is on the engine
        tb, rb = in_thread(lambda: c.post(f"/sessions/{b}/rounds", json=ROUND))
        time.sleep(0.2)  # b's round waits in the queue
        t0 = time.monotonic()
        assert c.delete(f"/sessions/{b}").status_code == 200
        tb.join(5)
        assert rb["status"] == 409 and "closed while its round waited" in rb["body"]["detail"]
        assert time.monotonic() - t0 < 0.5  # answered, not left for the next batch
        ta.join(5)
        assert ra["status"] == 200


def test_an_engine_failure_answers_its_batch_and_the_loop_goes_on() -> None:
    """A crash in the engine is a 500 for that batch; a stall a 503 that leaves the session as it
    was (retry); the next rounds run."""
    backend = SlowBackend(delay=0.0)
    with client(backend=backend) as c:
        sid = open_session(c)
        backend.fail = RuntimeError("boom")
        r = c.post(f"/sessions/{sid}/rounds", json=ROUND)
        assert r.status_code == 500 and r.json()["detail"] == "engine: RuntimeError: boom"
        backend.fail = EngineStalled("the engine cannot schedule 1 of its requests", {"x"}, {})
        r = c.post(f"/sessions/{sid}/rounds", json=ROUND)
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and "retry" in r.json()["detail"]
        r = c.post(f"/sessions/{sid}/rounds", json=ROUND)
        assert r.status_code == 200 and r.json()["l_new"] == 203  # the session kept its 200 tokens
        load = c.get("/health").json()["load"]
        assert load["engine_errors_total"] == 1 and load["engine_stalls_total"] == 1


def test_a_resident_round_the_engine_could_not_fit_is_a_503() -> None:
    class Full(FakeResident):
        def run(self, items: list[tuple[int, list[int], list[int]]]) -> Any:
            _, held = super().run(items)
            return [None] * len(items), held

    sc = scenario("wisp")
    sc = sc.replace(server=replace(sc.server, verifier=replace(sc.server.verifier, kind="resident")))
    backend = FakeBackend()
    backend.resident_sessions = lambda: Full()  # type: ignore[attr-defined]
    with client(sc, backend) as c:
        sid = open_session(c)
        r = c.post(f"/sessions/{sid}/rounds", json=ROUND)
        assert r.status_code == 503 and "no KV room" in r.json()["detail"]
        assert c.get("/health").json()["load"]["rounds_unserved_total"] == 1


def test_bodies_are_bounded_and_checked_before_use() -> None:
    """Over --max-body-bytes: 413 by its declared length or while it streams; deep nesting,
    NaN and 2^63 are one-line 4xx answers."""
    with client(max_body_bytes=4096) as c:
        big = {"prompt": list(range(1, 3000))}
        r = c.post("/sessions", json=big)
        assert r.status_code == 413 and "--max-body-bytes" in r.json()["detail"]

        def chunks() -> Any:  # no Content-Length: counted as it arrives
            yield b'{"prompt": ['
            for _ in range(3000):
                yield b"1,"
            yield b"1]}"

        r = c.post("/sessions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        sid = open_session(c)
        bad = [
            ("/sessions", "[" * 3000 + "]" * 3000),
            (
                f"/sessions/{sid}/rounds",
                '{"draft": [5], "accepted": 0, "commit": 1, "budget_s": NaN, "n_hat": 1}',
            ),
            (
                f"/sessions/{sid}/rounds",
                '{"draft": [5], "accepted": 0, "commit": 1, "budget_s": 1, "n_hat": Infinity}',
            ),
            ("/sessions", json.dumps({"prompt": [2**63]})),
            ("/sessions", "not json"),
        ]
        for path, text in bad:
            r = c.post(path, content=text, headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
            detail = r.json()["detail"]
            assert isinstance(detail, str) and "\n" not in detail and len(detail) < 300
        assert c.get("/health").json()["status"] == "ready"


def test_idle_sessions_expire_and_free_their_reservation() -> None:
    """Admission holds one reservation; a's device is gone without closing it. b's round waits
    (a 'waiting' gauge says so), a expires after --session-idle-s, and b is served."""
    with client(facts={**FACTS, "kv_capacity_tokens": 3 * BLOCK}, session_idle_s=1.0) as c:
        a, b = open_session(c, 200), open_session(c, 400)
        assert c.post(f"/sessions/{a}/rounds", json=ROUND).status_code == 200
        t, out = in_thread(lambda: c.post(f"/sessions/{b}/rounds", json=ROUND))
        time.sleep(0.3)
        load = c.get("/health").json()["load"]
        assert load["admission_waiting"] == 1 and load["admission_sessions"] == 1
        t.join(10)
        assert out["status"] == 200 and out["body"]["queue_s"] >= 0.5
        load = c.get("/health").json()["load"]
        assert load["sessions_expired_total"] >= 1 and load["admission_sessions"] == 1
        assert c.post(f"/sessions/{a}/rounds", json=ROUND).status_code == 404


def test_sessions_waiting_rounds_and_the_log_are_capped() -> None:
    backend = SlowBackend(delay=0.6)
    with client(scenario("fcfs"), backend, max_sessions=3, max_waiting=1, log_rows=2) as c:
        ids = [open_session(c, 200 + 100 * i) for i in range(3)]
        r = c.post("/sessions", json={"prompt": [5, 6, 7]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and "sessions" in r.json()["detail"]
        ta, _ = in_thread(lambda: c.post(f"/sessions/{ids[0]}/rounds", json=ROUND))
        time.sleep(0.2)  # on the engine
        tb, _ = in_thread(lambda: c.post(f"/sessions/{ids[1]}/rounds", json=ROUND))
        time.sleep(0.2)  # queued: the one round allowed to wait
        r = c.post(f"/sessions/{ids[2]}/rounds", json=ROUND)
        assert r.status_code == 503 and "waiting" in r.json()["detail"]
        ta.join(5)
        tb.join(5)
        for _ in range(2):
            assert c.post(f"/sessions/{ids[2]}/rounds", json=ROUND).status_code == 200
        log = c.get("/log", headers=AUTH).json()
        assert len(log["batches"]) == 2 and log["dropped_batches"] == 2 and len(log["members"]) == 2
        assert c.delete(f"/sessions/{ids[0]}").status_code == 200
        assert c.post("/sessions", json={"prompt": [5, 6, 7]}).status_code == 200


def test_health_and_metrics_report_the_load() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with client() as c:
        sid = open_session(c)
        assert c.post(f"/sessions/{sid}/rounds", json=ROUND).status_code == 200
        health = c.get("/health").json()
        assert health["load"]["sessions"] == 1 and health["load"]["rounds_total"] == 1
        assert "admin_token" not in health["limits"] and TOKEN not in json.dumps(health)
        r = c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        samples = {s.name: s for f in text_string_to_metric_families(r.text) for s in f.samples}
        assert samples["wispsim:sessions"].value == 1
        assert samples["wispsim:rounds_total"].value == 1
        assert samples["wispsim:admission_limit_blocks"].labels == {"mode": "speculative", "policy": "wisp"}


class FakeLLMEngine:
    """vLLM's ``LLMEngine`` in miniature for centralized serving: one token per live request per
    step (2 ms); ``frozen`` makes it schedule nothing (a stall)."""

    def __init__(self) -> None:
        self.live: dict[str, list[Any]] = {}
        self.aborted: list[str] = []
        self.frozen = False

    def add_request(self, rid: str, prompt: Any, params: Any) -> None:
        self.live[rid] = [list(prompt), int(params), 0]

    def abort_request(self, ids: list[str]) -> None:
        for rid in ids:
            if self.live.pop(rid, None) is not None:
                self.aborted.append(rid)

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def step(self) -> list[Any]:
        time.sleep(0.002)
        if self.frozen:
            return []
        outs = []
        for rid, item in list(self.live.items()):
            item[2] += 1
            done = item[2] >= item[1]
            out = type("O", (), {"token_ids": [1] * item[2]})()
            outs.append(
                type(
                    "R",
                    (),
                    {
                        "request_id": rid,
                        "outputs": [out],
                        "prompt_token_ids": item[0],
                        "num_cached_tokens": 0,
                        "finished": done,
                    },
                )()
            )
            if done:
                del self.live[rid]
        return outs


class CentralBackend(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.engine = FakeLLMEngine()

    def central(self, vocab: int, max_len: int, limits: Limits) -> Any:
        from wispsim.serve.central import CentralServer

        return CentralServer(self.engine, lambda n: n, lambda ids: ids, vocab, max_len, limits=limits)


@pytest.fixture()
def central_server():
    """A real HTTP server (uvicorn, in a thread) for centralized serving on the fake engine."""
    from wispsim.serve.app import make_app

    backend = CentralBackend()
    app = make_app(scenario("centralized"), backend, FACTS, Limits(admin_token=TOKEN, max_sessions=2))
    url, stop = serve_in_thread(app)
    yield url, backend.engine
    stop()


def test_centralized_responses_are_capped_aborted_and_never_left_waiting(central_server) -> None:
    """At most --max-sessions live responses (503 beyond); a client that goes away has its
    response aborted in the engine; an engine that stops making progress ends every live
    response with an error line."""
    import httpx

    url, engine = central_server
    body = {"prompt": [5, 6, 7], "output_tokens": 100_000 // 1000}
    with httpx.Client(base_url=url, timeout=10) as http:
        with http.stream("POST", "/generate", json={**body, "output_tokens": 500}) as r1:
            lines1 = r1.iter_lines()  # kept: a dropped iterator closes its response
            assert json.loads(next(lines1))["tokens"] >= 1
            with http.stream("POST", "/generate", json={**body, "output_tokens": 500}) as r2:
                lines2 = r2.iter_lines()
                next(lines2)
                r3 = http.post("/generate", json=body)
                assert r3.status_code == 503 and r3.headers["retry-after"] == "1"
        # both clients went away mid-stream: their responses are aborted
        deadline = time.monotonic() + 5
        while len(engine.aborted) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(engine.aborted) == 2 and not engine.live
        engine.frozen = True
        lines = [json.loads(x) for x in http.post("/generate", json=body).iter_lines() if x.strip()]
        assert "error" in lines[-1] and "could not schedule" in lines[-1]["error"]
        engine.frozen = False
        done = [json.loads(x) for x in http.post("/generate", json=body).iter_lines() if x.strip()]
        assert done[-1]["tokens"] == body["output_tokens"]


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_the_swarm_retries_when_the_server_says_not_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """One session at a time: the second device's session is refused (503) until the first
    device's response ends; the swarm waits as Retry-After says and every round is served."""
    from wispsim.serve.app import make_app
    from wispsim.serve.swarm import WispsimServer, run_swarm
    from wispsim.sim.scenarios import resolve_server

    app = make_app(scenario("wisp"), FakeBackend(), FACTS, Limits(admin_token=TOKEN, max_sessions=1))
    url, stop = serve_in_thread(app)
    try:
        sc = scenario("wisp", warmup_s=0.5, duration_s=3.0).with_devices(2)
        run = run_swarm(resolve_server(sc), WispsimServer(url, token=TOKEN))
    finally:
        stop()
    assert run.result.info["retries"] > 0
    assert len(run.result.rounds) > 10 and (run.result.rounds.verify_time > 0).all()
