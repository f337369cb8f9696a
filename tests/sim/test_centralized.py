"""Centralized serving with continuous batching (SPEC 3.3), driven by a fake latency model.

The fake model takes 10 ms per step plus 1 ms per new token (N_linear), so step times are easy
to add up by hand; it records the aggregates it was asked about.
"""

from __future__ import annotations

from itertools import count

import pytest
import simpy

from tests.support import FakeLatency
from wispsim.model.latency import Pricing
from wispsim.sim.centralized import CentralizedServer
from wispsim.sim.generation import Generation
from wispsim.sim.records import BatchRecord


def server(
    total_blocks: int = 1000,
    block_size: int = 16,
    max_running: int = 8,
    step_tokens: int = 2048,
    static: bool = False,
) -> tuple[simpy.Environment, CentralizedServer, FakeLatency, list[BatchRecord]]:
    env = simpy.Environment()
    lat = FakeLatency()
    batches: list[BatchRecord] = []
    srv = CentralizedServer(
        env,
        total_blocks,
        block_size,
        max_running,
        step_tokens,
        Pricing(lat, None),
        batches,
        count(),
        static=static,
    )
    return env, srv, lat, batches


def submit(
    env: simpy.Environment,
    srv: CentralizedServer,
    rid: int,
    prompt: int,
    output: int,
    at: float,
    finished: dict[int, float],
) -> None:
    def proc():  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        done = env.event()
        srv.submit(Generation(rid, prompt, output, done))
        yield done
        finished[rid] = env.now

    env.process(proc())


def test_first_step_is_the_prefill_and_emits_the_first_token() -> None:
    env, srv, lat, batches = server()
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=100, output=1, at=0.0, finished=finished)
    env.run(until=1.0)
    # step 1 prefills the whole prompt: N_linear = 100, N_interactions = 100*100, N_cached = 0;
    # 10 ms + 100 ms = 0.110 s, and the first (here: only) token comes out of that step
    assert lat.calls == [(100, 10_000, 0)]
    assert finished == {0: pytest.approx(0.110)}
    b = batches[0]
    assert (b.kind, b.t_dispatch, b.t_end, b.size) == ("step", 0.0, pytest.approx(0.110), 1)
    # admission reserved blocks for prompt + 1 token: ceil(101 / 16) = 7
    assert b.blocks_used == 7


def test_decode_steps_after_prefill() -> None:
    env, srv, lat, _ = server()
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=100, output=3, at=0.0, finished=finished)
    env.run(until=0.115)
    assert srv.batcher.running[0].generated == 1  # the first token exists right after step 1 (t = 0.110)
    env.run(until=1.0)
    # step 2 decodes token 2 on a 100-token context: (1, 101*1, 100), 11 ms
    # step 3 decodes token 3 on 101 tokens:          (1, 102*1, 101), 11 ms
    assert lat.calls == [(100, 10_000, 0), (1, 101, 100), (1, 102, 101)]
    assert finished == {0: pytest.approx(0.110 + 0.011 + 0.011)}
    assert srv.memory.free == srv.memory.total_blocks  # everything released


def test_chunked_prefill() -> None:
    env, srv, lat, _ = server(step_tokens=64)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=100, output=2, at=0.0, finished=finished)
    env.run(until=1.0)
    # step 1: chunk of 64 (64*64 interactions), 74 ms, no token yet
    # step 2: the remaining 36 on 64 cached ((36+64)*36 = 3600), 46 ms -> first token at 0.120
    # step 3: decode on 100 tokens, 11 ms -> done at 0.131
    assert lat.calls == [(64, 4096, 0), (36, 3600, 64), (1, 101, 100)]
    assert finished == {0: pytest.approx(0.131)}


def test_new_request_joins_a_running_decode_batch() -> None:
    env, srv, lat, batches = server()
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=10, output=5, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=20, output=1, at=0.015, finished=finished)
    env.run(until=1.0)
    # step 1 (t=0): A's prefill, 10 + 10 = 20 ms. B arrives during it.
    # step 2 (t=0.020): A decodes (1 new on 10 cached) and B prefills 20:
    #   N_linear = 21, N_interactions = 11*1 + 20*20 = 411, N_cached = 10 -> 31 ms
    assert lat.calls[:2] == [(10, 100, 0), (21, 411, 10)]
    assert batches[1].t_dispatch == pytest.approx(0.020)
    assert batches[1].size == 2
    assert finished[1] == pytest.approx(0.051)  # B's only token comes out of step 2
    # A: 3 more decodes of 11 ms each after step 2
    assert finished[0] == pytest.approx(0.051 + 3 * 0.011)


def test_static_batching_keeps_a_late_request_out_until_the_batch_ends() -> None:
    """``server.engine.batching: static`` (issue 46): the same arrivals as above, but B waits for
    A's batch to end (A's 5 tokens), and runs alone after it."""
    env, srv, _, batches = server(static=True)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=10, output=5, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=20, output=1, at=0.015, finished=finished)
    env.run(until=1.0)
    # A alone: prefill 20 ms, then 4 decodes of 11 ms; B's prefill (10 + 20 ms) only after
    assert [b.size for b in batches] == [1, 1, 1, 1, 1, 1]
    assert finished[0] == pytest.approx(0.020 + 4 * 0.011)
    assert finished[1] == pytest.approx(finished[0] + 0.030)
    assert srv.memory.free == srv.memory.total_blocks


def test_static_batching_decodes_a_finished_row_as_padding() -> None:
    env, srv, _, batches = server(static=True)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=10, output=4, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=10, output=1, at=0.0, finished=finished)
    env.run(until=1.0)
    # both prefill in step 1 (B's only token); A's 3 decodes still carry B's row (size 2)
    assert [b.size for b in batches] == [2, 2, 2, 2]
    assert finished[1] < finished[0]


def test_running_limit_makes_requests_wait() -> None:
    env, srv, lat, _ = server(max_running=1)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=10, output=2, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=10, output=1, at=0.0, finished=finished)
    env.run(until=1.0)
    # A: prefill 20 ms + one decode 11 ms = 0.031; only then B's prefill: 20 ms -> 0.051
    assert lat.calls == [(10, 100, 0), (1, 11, 10), (10, 100, 0)]
    assert finished == {0: pytest.approx(0.031), 1: pytest.approx(0.051)}


def test_memory_pressure_preempts_the_newest_and_recomputes() -> None:
    # 5 blocks of 4 tokens. A and B (prompt 6, output 10) are admitted with 2 blocks each
    # (ceil(7/4)). After three tokens each, A's context of 8 needs a 3rd block for token 9: the
    # last free block. B needs one too: none left, B is the newest -> preempted (its 2 blocks
    # freed) and later recomputed as a 6 + 3 = 9 token prefill once A is done.
    env, srv, lat, batches = server(total_blocks=5, block_size=4)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=6, output=10, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=6, output=10, at=0.0, finished=finished)
    env.run(until=5.0)
    assert srv.preemptions == 1
    assert set(finished) == {0, 1}
    assert finished[0] < finished[1]
    sizes = [b.size for b in batches]
    assert sizes[:3] == [2, 2, 2]  # joint prefill + 2 joint decodes
    assert lat.calls[3] == (1, 9, 8)  # step 4: A alone, decoding on 8 tokens
    recompute = [c for c in lat.calls if c == (9, 81, 0)]
    assert len(recompute) == 1  # B's prompt + its 3 generated tokens, prefilled again
    assert all(b.blocks_used <= 5 for b in batches)
    assert srv.memory.free == 5
