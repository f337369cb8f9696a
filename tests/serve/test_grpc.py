"""The verification service over gRPC (issue 46, item 1: the ``wisp-grpc`` build), on a fake
engine: the same sessions, verdicts and errors as the HTTP API on the same server, one loop for
both. On the real engine, with the swarm speaking it: tests/serve/test_serve.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

for _module in ("fastapi", "uvicorn", "httpx", "psutil", "prometheus_client", "grpc"):
    pytest.importorskip(_module, reason="the serve extra: pip install 'wispsim[serve]'")

import httpx  # noqa: E402

from tests.serve.support import free_port  # noqa: E402
from tests.serve.test_serve import FACTS, TOKEN, FakeBackend, scenario  # noqa: E402
from wispsim.serve.client import SwarmError  # noqa: E402
from wispsim.serve.grpc_api import MESSAGES, PROTO, GrpcSessions, M  # noqa: E402
from wispsim.serve.limits import Limits  # noqa: E402

ROUND = {"draft": [5, 6, 7], "accepted": 2, "commit": 3, "budget_s": 5.0, "n_hat": 3.0}


@pytest.fixture
def servers() -> Iterator[tuple[str, str]]:
    """``wispsim serve``'s HTTP app and gRPC service on one loop (as ``serve`` runs them) over a
    fake engine; yields (HTTP URL, gRPC target)."""
    from wispsim.serve.app import Servers, make_app

    facts = dict(FACTS)
    app = make_app(scenario(), FakeBackend(), facts, Limits(admin_token=TOKEN, max_body_bytes=4096))
    port = free_port()
    s = Servers(app, facts, "127.0.0.1", port, Limits(admin_token=TOKEN, max_body_bytes=4096), 0)
    ready = threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(s.run(lambda f, t: ready.set())), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield f"http://127.0.0.1:{port}", f"127.0.0.1:{facts['grpc_port']}"
    s.stop()
    thread.join(timeout=30)


def rpc(target: str, work: Any) -> Any:
    async def main() -> Any:
        c = GrpcSessions(target, SwarmError, retry_s=0.0)
        try:
            return await work(c)
        finally:
            await c.aclose()

    return asyncio.run(main())


def test_the_proto_text_says_what_the_messages_are() -> None:
    for name, fields in MESSAGES.items():
        assert f"message {name} {{" in PROTO
        for number, spec in enumerate(fields, 1):
            assert f"{spec} = {number};" in " ".join(PROTO.split())
    r = M["RoundRequest"](session="s", draft=[1, 2, 3], accepted=2, commit=3, budget_s=0.5, n_hat=2.0)
    assert M["RoundRequest"].FromString(r.SerializeToString()) == r


def test_a_round_over_grpc_is_the_round_over_http(servers: tuple[str, str]) -> None:
    url, target = servers
    assert httpx.get(f"{url}/health").json()["grpc_port"] == int(target.rsplit(":", 1)[1])

    async def work(c: GrpcSessions) -> Any:
        sid = await c.open(list(range(200, 400)))
        first = await c.verify(sid, ROUND)
        second = await c.verify(sid, ROUND)
        await c.close(sid)
        return sid, first, second

    sid, first, second = rpc(target, work)
    assert len(sid) == 22 and first["committed"] == 3 and first["batch_size"] == 1
    assert second["l_cached"] > 0 and second["t_dispatch"] >= first["t_done"]
    # the same server answers HTTP: a session opened there verifies the same way
    with httpx.Client(base_url=url) as http:
        hsid = http.post("/sessions", json={"prompt": list(range(200, 400))}).json()["session"]
        h = http.post(f"/sessions/{hsid}/rounds", json=ROUND).json()
    assert set(h) == set(first) and (h["accepted"], h["committed"], h["l_new"]) == (
        first["accepted"], first["committed"], first["l_new"],
    )  # fmt: skip


def test_grpc_errors_are_the_http_ones_in_one_line(servers: tuple[str, str]) -> None:
    _, target = servers

    def fails(work: Any) -> str:
        with pytest.raises(SwarmError) as e:
            rpc(target, work)
        assert "\n" not in str(e.value)
        return str(e.value)

    async def unknown(c: GrpcSessions) -> Any:
        return await c.verify("nosuchsession", ROUND)

    assert "NOT_FOUND" in fails(unknown)

    async def bad_round(c: GrpcSessions) -> Any:
        sid = await c.open([5, 6, 7])
        return await c.verify(sid, {**ROUND, "commit": 0})

    said = fails(bad_round)
    assert "INVALID_ARGUMENT" in said and "Verify: commit" in said

    async def huge(c: GrpcSessions) -> Any:
        return await c.open(list(range(100, 3000)))  # over --max-body-bytes 4096

    assert "RESOURCE_EXHAUSTED" in fails(huge)

    async def closed(c: GrpcSessions) -> Any:
        sid = await c.open([5, 6, 7])
        await c.close(sid)
        return await c.verify(sid, ROUND)

    assert "NOT_FOUND" in fails(closed)


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_a_swarm_whose_devices_speak_grpc_drives_the_server_over_it(servers: tuple[str, str]) -> None:
    """``server.host.transport: grpc`` (the wisp-grpc build's): the swarm's rounds go over gRPC,
    and what it records is what the server logged; a server with no gRPC port is refused in one
    line."""
    from dataclasses import replace

    from wispsim.serve.swarm import WispsimServer, run_swarm
    from wispsim.sim.scenarios import resolve_server

    url, _ = servers
    sc = scenario("wisp", warmup_s=0.5, duration_s=2.0).with_devices(3)
    grpc_sc = sc.replace(server=replace(sc.server, host=replace(sc.server.host, transport="grpc")))
    run = run_swarm(resolve_server(grpc_sc), WispsimServer(url, token=TOKEN))
    r = run.result.rounds
    assert len(r) > 10 and r.batch.ge(0).all() and set(r.batch) <= set(run.server_batches.batch)
    assert (r.verify_time > 0).all()
    assert len(run.members) >= len(r)  # every round the devices recorded, the server logged
    assert run.facts["grpc_port"] > 0 and run.result.info["retries"] == 0


def test_a_grpc_scenario_against_a_server_without_grpc_is_one_line(monkeypatch: Any) -> None:
    from dataclasses import replace

    from tests.serve.support import serve_in_thread
    from wispsim.serve.app import make_app
    from wispsim.serve.swarm import WispsimServer, run_swarm
    from wispsim.sim.scenarios import resolve_server

    url, stop = serve_in_thread(
        make_app(scenario("wisp"), FakeBackend(), dict(FACTS), Limits(admin_token=TOKEN))
    )
    try:
        sc = scenario("wisp", warmup_s=0.5, duration_s=1.0).with_devices(1)
        sc = sc.replace(server=replace(sc.server, host=replace(sc.server.host, transport="grpc")))
        with pytest.raises(SwarmError, match=r"speak gRPC .* serves none; start it on the same scenario"):
            run_swarm(resolve_server(sc), WispsimServer(url, token=TOKEN))
    finally:
        stop()


@pytest.mark.slow
def test_the_wisp_grpc_build_on_a_real_engine_serves_a_swarm_over_grpc() -> None:
    """``--set server.build=wisp-grpc`` on vLLM's CPU backend (tiny-vllm's shape, random weights):
    resident sessions, the swarm's rounds over gRPC; every round the devices recorded was served
    over the sessions' KV (after a session's first round, only its drafts and bonus token are new)."""
    pytest.importorskip("vllm")
    from dataclasses import replace

    from tests.support import ROOT
    from wispsim.serve.app import Servers, make_app
    from wispsim.serve.backend import ModelSource, VLLMBackend, build_engine
    from wispsim.serve.swarm import WispsimServer, run_swarm
    from wispsim.sim.scenarios import load_scenario, resolve_server

    sc = load_scenario(
        ROOT / "scenarios" / "validation-cpu.yaml", overrides={"server": {"build": "wisp-grpc"}}
    )
    sc = sc.with_policy("wisp").with_devices(4)
    sc = sc.replace(workload=replace(sc.workload, warmup_s=1.0, duration_s=6.0))
    assert (sc.server.build, sc.server.verifier.kind, sc.server.host.transport) == (
        "wisp-grpc",
        "resident",
        "grpc",
    )
    engine, facts = build_engine(sc, ModelSource(arch="tiny-vllm"))
    try:
        app = make_app(sc, VLLMBackend(engine), facts, Limits(admin_token=TOKEN))
        port = free_port()
        s = Servers(app, facts, "127.0.0.1", port, Limits(admin_token=TOKEN), 0)
        ready = threading.Event()
        thread = threading.Thread(target=lambda: asyncio.run(s.run(lambda f, t: ready.set())), daemon=True)
        thread.start()
        assert ready.wait(60)
        try:
            run = run_swarm(resolve_server(sc), WispsimServer(f"http://127.0.0.1:{port}", token=TOKEN))
        finally:
            s.stop()
            thread.join(timeout=60)
    finally:
        engine.close()
    r = run.result.rounds
    later = r[r["round"] > 0]
    assert len(r) > 20 and len(later) > 10
    # resident: a later round computes its drafts and the bonus token only -- or fewer, where the
    # engine still holds a rejected draft's KV that equals the token committed at its position
    # (the swarm's drafts are random tokens here, so now and then one is the committed token)
    assert (later.l_cached > 0).all() and later.l_new.between(1, later.k + 1).all()
    assert (later.l_new == later.k + 1).mean() > 0.9
    assert run.facts["grpc_port"] > 0 and set(r.batch) <= set(run.server_batches.batch)
