"""vLLM V0's engine loop on centralized serving (``server.engine.use_v1: false``,
``enable_chunked_prefill``, ``num_scheduler_steps``), timed by hand with the fake latency model of
test_centralized.py: 10 ms a step plus 1 ms per new token (N_linear)."""

from __future__ import annotations

from itertools import count

import pytest
import simpy

from tests.sim.test_centralized import submit
from tests.support import FakeLatency
from wispsim.errors import ConfigError
from wispsim.model.host_cpu import HostCPU
from wispsim.model.latency import Pricing
from wispsim.sim.centralized import CentralizedServer
from wispsim.sim.generation import Generation
from wispsim.sim.records import BatchRecord


def server(
    *, chunked: bool = True, v0: bool = False, steps: int = 1, step_tokens: int = 2048, block_size: int = 16,
    host: HostCPU | None = None,
) -> tuple[simpy.Environment, CentralizedServer, FakeLatency, list[BatchRecord]]:  # fmt: skip
    env = simpy.Environment()
    lat = FakeLatency()
    batches: list[BatchRecord] = []
    srv = CentralizedServer(
        env, 1000, block_size, 8, step_tokens, Pricing(lat, host), batches, count(),
        chunked=chunked, v0=v0, scheduler_steps=steps,
    )  # fmt: skip
    return env, srv, lat, batches


def test_v0_without_chunked_prefill_runs_a_prefill_alone_and_stalls_the_decodes() -> None:
    # the arrivals of test_centralized's join test: A (10 in, 5 out) at 0, B (20 in, 1 out) at 15 ms.
    # V1 would run B's prefill beside A's decode (31 ms); V0 runs it alone first (30 ms), then A's
    env, srv, lat, batches = server(chunked=False, v0=True)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=10, output=5, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=20, output=1, at=0.015, finished=finished)
    env.run(until=1.0)
    assert lat.calls[:3] == [(10, 100, 0), (20, 400, 0), (1, 11, 10)]
    assert [b.size for b in batches[:3]] == [1, 1, 1]
    assert finished[1] == pytest.approx(0.050)
    assert finished[0] == pytest.approx(0.050 + 4 * 0.011)  # A's 4 decodes after the stall


def test_v1_without_chunked_prefill_prefills_whole_prompts_beside_the_decodes() -> None:
    env, srv, lat, _ = server(chunked=False, step_tokens=64)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=50, output=2, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=50, output=1, at=0.0, finished=finished)
    env.run(until=1.0)
    # step 1: A's 50 tokens; B's would not fit whole (14 left of 64), so it is not chunked but waits;
    # step 2: A's decode (1 on 50) beside B's whole prompt
    assert lat.calls[:2] == [(50, 2500, 0), (51, 51 + 2500, 50)]


def test_without_chunked_prefill_a_request_beyond_the_step_budget_is_refused_by_name() -> None:
    env, srv, _, _ = server(chunked=False, step_tokens=64)
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens.*without chunked prefill"):
        srv.submit(Generation(0, 60, 5, env.event()))


def test_multi_step_runs_decodes_in_runs_admits_between_them_and_frees_at_the_runs_end() -> None:
    # V0, 4 steps a run, blocks of 4 tokens. A (10 in, 6 out) at 0; B (10 in, 2 out) arrives at 25 ms,
    # during A's first run, and waits for it to end.
    env, srv, _, batches = server(chunked=False, v0=True, steps=4, block_size=4)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=10, output=6, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=10, output=2, at=0.025, finished=finished)
    env.run(until=0.1)
    assert srv.memory.used > 0  # both ended at 96 ms, but their run goes on: nothing given back yet
    env.run(until=1.0)
    sizes = [b.size for b in batches]
    # a prefill-only step is a run of one step (20 ms); A's decodes run 4 steps (11 ms each, to 64 ms);
    # then B's prefill (20 ms, to 84 ms), then a run of both (12 ms a step): its first step gives
    # A's 6th token and B's 2nd (96 ms) and the three others compute them as padding (to 132 ms)
    assert sizes == [1, 1, 1, 1, 1, 1, 2, 2, 2, 2]
    assert batches[5].t_dispatch == pytest.approx(0.064)
    assert finished == {0: pytest.approx(0.096), 1: pytest.approx(0.096)}
    assert batches[-1].t_end == pytest.approx(0.132)
    # the run's KV is held from its start: A's context of 10 plus 4 tokens is 4 blocks (a single
    # step would hold 3)
    assert batches[1].blocks_used == 4
    assert srv.memory.free == srv.memory.total_blocks


def test_multi_step_charges_the_engine_cores_cpu_once_a_run() -> None:
    host = HostCPU(step=0.005, request=0.0, arrival=0.0, session=0.0, token=0.0, api_request=0.0,
                   api_session=0.0, api_ids=0.0, api_text=0.0)  # fmt: skip
    env, srv, _, batches = server(chunked=False, v0=True, steps=4, host=host)
    submit(env, srv, 0, prompt=10, output=9, at=0.0, finished={})
    env.run(until=1.0)
    # prefill (a run of one), then two runs of four decodes: the scheduler runs once a run
    assert [b.cpu_s for b in batches] == [0.005, 0.005, 0.0, 0.0, 0.0, 0.005, 0.0, 0.0, 0.0]


def test_multi_step_with_chunked_prefill_continues_the_prompts_whose_prefill_ended() -> None:
    env, srv, lat, batches = server(v0=True, steps=3, step_tokens=64)
    finished: dict[int, float] = {}
    submit(env, srv, 0, prompt=30, output=3, at=0.0, finished=finished)
    submit(env, srv, 1, prompt=100, output=2, at=0.0, finished=finished)
    env.run(until=1.0)
    # run 1: A's whole prompt and a 34-token chunk of B; then A decodes alone for the run's other
    # two steps (B's prefill has not ended: it waits for the next run)
    assert [b.size for b in batches[:3]] == [2, 1, 1]
    assert finished[0] == pytest.approx(batches[2].t_end)
    # run 2 is one step: a 64-token chunk of B, which nothing decodes after; run 3 ends B's prompt
    # (2 tokens, its first token), decodes its second in the next step and pads the third
    assert [c[0] for c in lat.calls[3:]] == [64, 2, 1, 1]
    assert finished[1] == pytest.approx(batches[-2].t_end)


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["server.engine.num_scheduler_steps=0"], "server.engine.num_scheduler_steps"),
        (["server.engine.use_v1=true", "server.engine.num_scheduler_steps=8"],
         "server.engine.num_scheduler_steps"),
        (["server.engine.num_scheduler_steps=8", "server.engine.async_scheduling=true"],
         "server.engine.async_scheduling"),
        (["server.engine.use_v1=maybe"], "server.engine.use_v1"),
        # a verifier's batches are priced as V1 verifies them
        (["server.engine.num_scheduler_steps=8"], "server.engine.num_scheduler_steps"),
        (["server.engine.enable_chunked_prefill=false"], "server.engine.enable_chunked_prefill"),
        # centralized: vLLM runs speculative decoding single-step, and without chunked prefill the
        # longest request (the default workload's 2,048 + 1,024 tokens) must fit a step
        (["policy=centralized-sd", "server.engine.num_scheduler_steps=8",
          "server.engine.max_num_batched_tokens=4096"], "server.engine.num_scheduler_steps"),
        (["policy=centralized", "server.engine.use_v1=false"], "server.engine.max_num_batched_tokens"),
    ],
)  # fmt: skip
def test_v0_settings_the_model_cannot_honour_are_refused_by_name(sets: list[str], field: str) -> None:
    from wispsim.config.parse import parse_set
    from wispsim.sim.scenarios import load_scenario

    with pytest.raises(ConfigError) as err:
        load_scenario(overrides=parse_set(sets), source="--set")
    assert field in str(err.value)


def test_v0_settings_resolve_as_vllm_defaults_them() -> None:
    from wispsim.config.parse import parse_set
    from wispsim.sim.scenarios import load_scenario

    def engine(*sets: str):  # type: ignore[no-untyped-def]
        return load_scenario(
            overrides=parse_set(["policy=centralized", *sets]), consistency=False
        ).server.engine

    v1 = engine()
    assert (v1.v0, v1.chunked_prefill) == (False, True)
    multi = engine("server.engine.num_scheduler_steps=8")  # vLLM fell back to V0 for multi-step
    assert (multi.v0, multi.chunked_prefill) == (True, False)
    v0_chunked = engine("server.engine.use_v1=false", "server.engine.enable_chunked_prefill=true")
    assert (v0_chunked.v0, v0_chunked.chunked_prefill) == (True, True)


def test_a_run_that_streams_at_its_end_sends_its_tokens_as_one_chunk() -> None:
    """``multi_step_stream_outputs: false`` (vLLM 0.6.0's multi-step): a run's tokens leave the
    engine at its end, one chunk per request, and a request that ended mid-run is done then."""
    times: dict[str, list[list[float]]] = {}
    for name, stream in (("steps", True), ("run", False)):
        env = simpy.Environment()
        srv = CentralizedServer(
            env, 1000, 16, 8, 2048, Pricing(FakeLatency(), None), [], count(), chunked=False, v0=True,
            scheduler_steps=4, stream_steps=stream, chunk_times={},
        )  # fmt: skip
        finished: dict[int, float] = {}
        submit(env, srv, 0, prompt=10, output=6, at=0.0, finished=finished)
        env.run(until=1.0)
        assert srv.chunk_times is not None
        times[name] = [srv.chunk_times[0], [finished[0]]]
    # prefill (20 ms, the first token), then a run of 4 decodes (11 ms each) and one more run
    # whose first step gives the 6th token
    assert times["steps"][0] == pytest.approx([0.020, 0.031, 0.042, 0.053, 0.064, 0.075])
    assert times["steps"][1] == pytest.approx([0.075])
    assert times["run"][0] == pytest.approx([0.020, 0.064, 0.108])  # one chunk a run, at its end
    assert times["run"][1] == pytest.approx([0.108])  # done when its run's tokens stream
