"""The serving host's CPU (issue 36): the engine core prices every verification batch beside its
GPU work (added without async scheduling, the larger of the two with it), API-server processes
serve every round first come first served, and a session-resident verifier resumes sessions
instead of re-submitting them."""

from __future__ import annotations

from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy
import yaml

from tests.support import deterministic_overrides, write_profile
from wispsim.config import ServerConfig
from wispsim.config.server import HostConfig
from wispsim.errors import ConfigError
from wispsim.model.host_cpu import HostCPU, for_server, host_cpu, measured_terms
from wispsim.model.profiles import load_profile
from wispsim.model.roofline import Roofline
from wispsim.model.verifier_kinds import verifier_kind
from wispsim.sim.front import GenerationFront
from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate

SPEED = 0.5  # a host half as fast as the measuring one: its costs are twice the shipped terms


def _host(async_scheduling: bool = False, speed: float = SPEED, count: int = 1) -> HostCPU:
    return host_cpu(speed, count, async_scheduling)


def test_the_shipped_terms_scale_with_the_hosts_speed() -> None:
    terms = measured_terms()
    slow, fast = host_cpu(1.0), host_cpu(4.0)
    assert slow.step == pytest.approx(terms["engine_core_ms"]["step"] / 1e3)
    assert fast.step == pytest.approx(slow.step / 4)
    assert fast.api(False, ids=100) == pytest.approx(slow.api(False, ids=100) / 4)
    # a text prompt costs its tokenization on top; a resident round sends its new tokens only
    assert slow.api(False, text=1000) > slow.api(False) + 0.5e-3
    assert slow.engine(1, 1, 0, 1024) > slow.engine(1, 0, 1, 5) - slow.session + slow.arrival


def test_a_step_adds_its_cpu_or_hides_it_behind_the_gpu() -> None:
    sync, overlapped = _host(False), _host(True)
    assert sync.step_time(0.010, 0.004) == pytest.approx(0.014)
    assert overlapped.step_time(0.010, 0.004) == pytest.approx(0.010)
    assert overlapped.step_time(0.002, 0.004) == pytest.approx(0.004)  # the CPU caps the step


def test_auto_models_the_host_where_the_profile_was_calibrated_with_it() -> None:
    from wispsim.model.host_cpu import HostFacts

    cfg = ServerConfig()
    measured = HostFacts()  # a measured profile: its timings include the host
    assert for_server(cfg, measured) is None
    calibrated = HostFacts(frontend=0.013, cpu_speed=3.0)
    assert for_server(cfg, calibrated).step == pytest.approx(host_cpu(3.0).step)  # type: ignore[union-attr]
    assert for_server(ServerConfig(host=HostConfig(cpu="off")), calibrated) is None
    on = for_server(ServerConfig(host=HostConfig(cpu="on", cpu_speed=2.0, api_server_count=3)), measured)
    assert on is not None and on.api_servers == 3 and on.step == pytest.approx(host_cpu(2.0).step)


def test_host_facts_live_on_the_profile_not_on_its_cost_form() -> None:
    """A roofline profile's front end and host speed are the profile's host facts (stored beside
    its overheads); the cost form prices GPU time only."""
    from wispsim.model.profiles import load_profile

    prof = load_profile("a100-qwen3-32b")
    assert prof.host.frontend > 0 and prof.host.cpu_speed is not None
    assert not hasattr(prof.estimator, "frontend") and not hasattr(prof.estimator, "host_cpu_speed")


def test_a_resident_verifier_pays_no_arrival_term() -> None:
    from wispsim.model.archs import load_arch

    roof = Roofline(load_arch("tiny-vllm"), 1, 2, 2, 1e12, 1e14, float("inf"), arrival=2e-3)
    res = verifier_kind("resident").cost(roof)
    assert res.arrival == 0.0 and roof.arrival == 2e-3
    # two members and one more, every one of them arriving anew to the re-submitting verifier
    assert roof.price_with(roof_shape(), 4, 100) - res.price_with(roof_shape(), 4, 100) == pytest.approx(
        3 * 2e-3
    )


def roof_shape() -> Any:
    from wispsim.model.batch import Shape

    return Shape.of([(4, 100), (5, 300)])


class _Engine:
    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.got: list[tuple[float, int]] = []
        self.chunks: list[tuple[float, Any, int]] = []  # (when written, response, outputs carried)

    def submit(self, g: Any) -> simpy.Event:
        self.got.append((self.env.now, g.rid))
        return g.done

    def written(self, s: Any, t: float, outputs: int) -> None:
        self.chunks.append((t, s, outputs))


def test_api_processes_serve_first_come_first_served_by_connection() -> None:
    from wispsim.sim.generation import Generation

    env = simpy.Environment()
    engine = _Engine(env)
    host = _host(count=2)
    api = GenerationFront(env, engine, host, 0.0)  # type: ignore[arg-type]
    service = host.api(False, text=100)
    for rid in range(4):  # sessions 0 and 2 share process 0, 1 and 3 process 1
        api.submit(Generation(rid, 100, 1, env.event()))
    env.run()
    at = dict((rid, t) for t, rid in engine.got)
    assert at[0] == pytest.approx(service) and at[1] == pytest.approx(service)
    assert at[2] == pytest.approx(2 * service) and at[3] == pytest.approx(2 * service)


def _streaming(count: int = 1) -> HostCPU:
    """A host whose API servers cost only a response's output: 1 ms a step's message, 0.1 ms a
    token and 0.2 ms an output handled, 0.5 ms a chunk written (round numbers, not the shipped
    terms)."""
    zero = dict.fromkeys(("step", "request", "arrival", "session", "token"), 0.0)
    api = {"api_request": 0.0, "api_session": 0.0, "api_ids": 0.0, "api_text": 0.0}
    return HostCPU(**zero, **api, api_step=1e-3, api_token=1e-4, api_output=2e-4, api_chunk=5e-4,
                   api_servers=count)  # fmt: skip


def _front(count: int = 1) -> tuple[simpy.Environment, GenerationFront, _Engine]:
    env = simpy.Environment()
    engine = _Engine(env)
    return env, GenerationFront(env, engine, _streaming(count), 0.0), engine  # type: ignore[arg-type]


def test_a_steps_outputs_stream_through_each_api_server_in_turn() -> None:
    """Each process that streams any of a step's outputs reads the step's message once and handles
    its outputs, then its responses' tasks write a chunk each, in order; the two processes work
    side by side."""
    env, front, engine = _front(count=2)
    front.stream([("a", 0, 1), ("b", 2, 1), ("c", 1, 3)])  # ids 0 and 2 on process 0, 1 on process 1
    env.run()
    got = {s: (t, n) for t, s, n in engine.chunks}
    assert got["a"] == pytest.approx((1.6e-3 + 5e-4, 1))  # the message, two outputs, then its chunk
    assert got["b"] == pytest.approx((1.6e-3 + 1e-3, 1))
    assert got["c"] == pytest.approx((1.5e-3 + 5e-4, 1))
    # a step ending while process 0 still writes waits for it, and is alone in its handler's turn
    front.stream([("d", 4, 1)])
    env.run()
    assert engine.chunks[-1][1:] == ("d", 1)
    assert engine.chunks[-1][0] == pytest.approx(2.6e-3 + 1.3e-3 + 5e-4)
    assert _streaming().api(False, chat=True) == 0.0  # no chat term here


def test_a_process_that_falls_behind_merges_a_responses_outputs_into_one_chunk() -> None:
    """vLLM's ``RequestOutputCollector``: a second step's message that arrives while the handler
    walks the first is read straight after it, before the responses' tasks run, so each response
    gets one chunk carrying both outputs, and the process spends one chunk's CPU on it, not two."""
    env, front, engine = _front()
    front.stream([("a", 0, 1), ("b", 0, 1)])  # the handler is busy until 1.6 ms
    env.run(until=1e-3)
    front.stream([("a", 0, 1), ("b", 0, 1)])
    env.run()
    assert [(s, n) for _, s, n in engine.chunks] == [("a", 2), ("b", 2)]
    assert [t for t, _, _ in engine.chunks] == pytest.approx([3.2e-3 + 5e-4, 3.2e-3 + 1e-3])
    # without the backlog the same outputs are four chunks, each step's written before the next
    env, front, engine = _front()
    front.stream([("a", 0, 1), ("b", 0, 1)])
    env.run(until=5e-3)
    front.stream([("a", 0, 1), ("b", 0, 1)])
    env.run()
    assert [(s, n) for _, s, n in engine.chunks] == [("a", 1), ("b", 1), ("a", 1), ("b", 1)]


def test_the_handler_lets_the_tasks_write_between_slices_of_a_step() -> None:
    """A step of more than 128 outputs (``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``) is handled a slice at a
    time, with the responses of each slice writing their chunks before the next slice."""
    env, front, engine = _front()
    front.stream([(i, 0, 1) for i in range(130)])
    env.run()
    times = {s: t for t, s, _ in engine.chunks}
    first_slice = 1e-3 + 128 * 3e-4
    assert times[0] == pytest.approx(first_slice + 5e-4)
    assert times[127] == pytest.approx(first_slice + 128 * 5e-4)
    assert times[128] == pytest.approx(first_slice + 128 * 5e-4 + 2 * 3e-4 + 5e-4)
    assert len(engine.chunks) == 130


def test_a_response_is_done_when_its_last_chunk_leaves_the_api_server(tmp_path: Path) -> None:
    """End to end through the engine: the same responses with the output path costed end later
    by at least a step's message and a chunk, and every chunk time moves with them."""
    from wispsim.model.latency import Pricing, make_latency
    from wispsim.sim.centralized import CentralizedServer
    from wispsim.sim.generation import Generation

    prof = load_profile(str(write_profile(tmp_path / "p.yaml")))
    ends: list[dict[int, float]] = []
    chunk_log: list[dict[int, list[float]]] = []
    for host in (None, _streaming()):
        env = simpy.Environment()
        chunks: dict[int, list[float]] = {}
        pricing = Pricing(make_latency(prof, ServerConfig(), np.random.default_rng(0)), None)
        engine = CentralizedServer(env, 4096, 16, 8, 2048, pricing, [], count(), chunk_times=chunks)
        front = GenerationFront(env, engine, host, 0.0) if host is not None else engine
        done: dict[int, float] = {}
        for rid in range(3):
            ev = front.submit(Generation(rid, 64, 5, env.event()))
            ev.callbacks.append(lambda e, rid=rid, done=done: done.__setitem__(rid, e.env.now))
        env.run()
        ends.append(done)
        chunk_log.append(chunks)
    for rid in range(3):
        assert ends[1][rid] >= ends[0][rid] + 1e-3 + 5e-4 + 1e-4
        assert len(chunk_log[1][rid]) == len(chunk_log[0][rid]) == 5
        assert all(b > a for a, b in zip(chunk_log[0][rid], chunk_log[1][rid], strict=True))


def test_an_api_server_behind_the_engine_streams_fewer_larger_chunks(tmp_path: Path) -> None:
    """End to end: where writing a chunk takes longer than the engine's step, each response's
    outputs merge (one chunk for several steps, vLLM's collector) and every token still arrives:
    fewer chunks than steps, the chunks in time order, each response done with its last chunk."""
    from wispsim.model.latency import Pricing, make_latency
    from wispsim.sim.centralized import CentralizedServer
    from wispsim.sim.generation import Generation

    prof = load_profile(str(write_profile(tmp_path / "p.yaml")))
    zero = dict.fromkeys(("step", "request", "arrival", "session", "token"), 0.0)
    api = {"api_request": 0.0, "api_session": 0.0, "api_ids": 0.0, "api_text": 0.0}
    slow = HostCPU(**zero, **api, api_step=1e-4, api_output=1e-4, api_chunk=0.2)  # a chunk: 0.2 s
    env = simpy.Environment()
    chunks: dict[int, list[float]] = {}
    pricing = Pricing(make_latency(prof, ServerConfig(), np.random.default_rng(0)), None)
    engine = CentralizedServer(env, 4096, 16, 8, 2048, pricing, [], count(), chunk_times=chunks)
    front = GenerationFront(env, engine, slow, 0.0)
    served: dict[int, tuple[float, Any]] = {}
    for rid in range(3):
        ev = front.submit(Generation(rid, 64, 40, env.event()))
        ev.callbacks.append(lambda e, rid=rid: served.__setitem__(rid, (e.env.now, e.value)))
    env.run()
    for rid in range(3):
        times = chunks[rid]
        assert 1 < len(times) < 40  # merged: fewer chunks than the 40 steps that gave tokens
        assert times == sorted(times)
        done, value = served[rid]
        assert value.chunks == len(times)
        assert done == pytest.approx(times[-1]) and value.first == pytest.approx(times[0])


def test_a_router_counts_what_the_api_servers_still_hold() -> None:
    """Two responses submitted at one instant to two idle replicas land on different ones: while
    the first is still in its API server, its replica already counts it (a real router counts the
    requests it sent); before this, both went to the first replica and the second waited out its
    prefill (the azure study's code-completion violations, issue 36)."""
    from wispsim.sim.generation import Generation
    from wispsim.sim.router import CentralRouter

    class Idle(_Engine):
        def outstanding_tokens(self) -> int:
            return len(self.got) * 1000  # what it was handed

    env = simpy.Environment()
    engines = [Idle(env), Idle(env)]
    host = _host()
    router = CentralRouter([GenerationFront(env, e, host, 0.0) for e in engines], "least-work")  # type: ignore[arg-type,list-item]
    for rid in range(2):
        router.submit(Generation(rid, 2048, 13, env.event()))
    assert router.replicas[0].outstanding_tokens() == 2048 + 13  # held, not yet handed
    env.run()
    assert [len(e.got) for e in engines] == [1, 1]
    assert all(not api.held for api in router.replicas)  # type: ignore[attr-defined]


def _run(tmp_path: Path, **server: Any) -> Any:
    prof = write_profile(tmp_path / "p.yaml")
    srv = {"host_cpu": "on", "host_cpu_speed": SPEED, "scheduler": "wisp", "kv_policy": "admission", **server}
    over = deterministic_overrides(
        str(prof),
        devices={"count": 16, "classes": [8.0], "start_spread_s": 0.5},
        server=srv,
        workload={"duration_s": 4.0, "warmup_s": 0.5},
    )
    path = tmp_path / "sc.yaml"
    path.write_text(yaml.safe_dump(over))
    return simulate(resolve_server(load_scenario(str(path))))


@pytest.mark.parametrize("overlapped", [False, True])
def test_every_batch_takes_its_gpu_time_and_its_engine_cpu(tmp_path: Path, overlapped: bool) -> None:
    res = _run(tmp_path, async_scheduling=overlapped)
    h = _host(overlapped)
    b = res.batches
    assert len(b) > 20
    for row in b.itertuples():  # every round re-submitted: a new request hashing its sequence
        n = int(row.size)
        cpu = h.engine(n, n, 0, int(row.n_linear + row.n_cached))
        assert row.latency == pytest.approx(h.step_time(row.t_hat, cpu), rel=1e-9)


def test_a_resident_session_opens_once_and_resumes_every_later_round(tmp_path: Path) -> None:
    res = _run(tmp_path, verifier="resident")
    h = _host()
    opened = 0
    for row in res.batches.itertuples():
        n = int(row.size)
        # what is left after the step, the requests and the hashed new tokens is arrivals and
        # resumed sessions: solve for how many rounds opened a session
        rest = row.latency - row.t_hat - (h.step + h.request * n + h.token * int(row.n_linear))
        arrivals = (rest - h.session * n) / (h.arrival - h.session)
        assert arrivals == pytest.approx(round(arrivals), abs=1e-6) and 0 <= round(arrivals) <= n
        opened += round(arrivals)
    rounds = res.rounds
    assert len(rounds) == res.batches["size"].sum()  # every verified round is on record
    # one round opened each response's session (its KV stays pinned: no round is cold again)
    assert opened == rounds.response.nunique() == rounds.cold.sum()
    assert rounds.groupby("response").size().max() == 3  # a 7-token output, 2 drafts a round


def test_api_servers_cap_the_rounds_a_replica_serves(tmp_path: Path) -> None:
    """At a hundredth of the measuring host's speed a round costs the API server ~0.56 s: one
    process serves under 2 rounds a second, four serve about four times as many."""
    one = _run(tmp_path, host_cpu_speed=0.01, api_server_count=1)
    four = _run(tmp_path, host_cpu_speed=0.01, api_server_count=4)
    service = host_cpu(0.01).api(False, ids=16)
    assert len(one.rounds) <= (4.5 + 1) / service + 1
    assert len(four.rounds) > 2.5 * len(one.rounds)


@pytest.mark.parametrize("server", [{"kv_policy": "lru"}, {"prefix_cache": False}])
def test_a_resident_verifier_refuses_what_would_drop_its_kv(server: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as err:
        load_scenario(
            overrides={
                "policy": "custom",
                "server": {"verifier": "resident", "kv_policy": "admission", **server},
            }
        )
    assert "server.verifier.kind" in str(err.value) and "kv_policy: admission" in str(err.value)


def test_a_resident_round_forwards_no_block_tail(tmp_path: Path) -> None:
    """Block-granular reuse makes a re-submitted round forward its prefix's tail again; a
    resident session forwards its drafts only (prefix_reuse is the re-submitted rounds')."""
    resub = _run(tmp_path, prefix_reuse="block", block_size=16)
    res = _run(tmp_path, prefix_reuse="block", block_size=16, verifier="resident")
    warm = lambda r: r[~r.cold]  # noqa: E731
    assert (warm(res.rounds).l_new == warm(res.rounds).k).all()  # its drafts (the last round drafts 1)
    assert warm(resub.rounds).l_new.mean() > 4


def test_a_bare_on_or_off_reads_as_the_mode_not_a_boolean() -> None:
    """``--set server.host.cpu=on`` parses as YAML, where a bare on/off is a boolean."""
    assert load_scenario(overrides={"server": {"host_cpu": True}}).server.host.cpu == "on"
    assert load_scenario(overrides={"server": {"host_cpu": False}}).server.host.cpu == "off"
    with pytest.raises(ConfigError, match=r"server\.host\.cpu: got 'sometimes'; allowed: auto, on, off"):
        load_scenario(overrides={"server": {"host_cpu": "sometimes"}})


def test_a_resident_round_costs_the_api_server_what_its_transport_measured() -> None:
    """server.host.transport (the verifier's build): a resident round's API-server CPU is the
    measured ``session`` over HTTP and ``grpc_session`` over gRPC (benchmarks/vllm/transport_cost.py);
    a re-submitted round is vLLM's OpenAI server's ``request`` either way it is asked."""
    terms = measured_terms()["api_server_ms"]
    http, grpc = host_cpu(1.0, transport="http"), host_cpu(1.0, transport="grpc")
    assert http.api(True) == pytest.approx(terms["session"] / 1e3)
    assert grpc.api(True) == pytest.approx(terms["grpc_session"] / 1e3)
    assert http.api(False) == grpc.api(False) == pytest.approx(terms["request"] / 1e3)
    # a scenario's build reaches the host its replicas run on
    sc = load_scenario(overrides={"server": {"build": "wisp-grpc", "host": {"cpu": "on"}}})
    assert for_server(sc.server, load_profile(sc.server.profile).host).api(True) == pytest.approx(
        grpc.api(True) / (load_profile(sc.server.profile).host.cpu_speed or 1.0)
    )
