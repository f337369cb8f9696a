"""First-token times and the token latencies ``vllm bench serve`` reports (TTFT, TPOT, ITL, E2E,
output throughput), on tiny deterministic scenarios (``support.deterministic_overrides``: no
noise, no jitter, prompt 16, output 7, links of 5 ms and 1e6 bytes/s) and a hand-made table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from wispsim.analysis.metrics import summarize
from wispsim.analysis.token_latency import TOKEN_LATENCY_COLUMNS, pooled_quantile, token_latency
from wispsim.sim.scenarios import resolve_server
from wispsim.sim.simulation import simulate

approx = pytest.approx
DOWN1 = 0.005 + (64 + 4) / 1e6  # one token down: 68 B


def test_centralized_ttft_and_tpot_come_from_the_steps(det_scenario) -> None:
    # One device: step 1 prefills the prompt and gives the first token, steps 2-7 decode one token
    # each. TTFT = end of step 1 - start + one token's downlink; TPOT = the mean decode step.
    res = simulate(resolve_server(det_scenario(policy="centralized", devices={"count": 1})))
    steps = res.batches.iloc[:7]
    assert steps.n_linear.tolist() == [16, 1, 1, 1, 1, 1, 1]
    r = res.responses.iloc[0]
    assert (r.t_start, r.output_len, r.rounds, r.measured, r.censored) == (0.0, 7, 7, True, False)
    ttft = steps.t_end.iloc[0] - r.t_start + DOWN1
    assert r.t_first == approx(ttft, abs=1e-12)
    assert r.t_end == approx(steps.t_end.iloc[6] + DOWN1, abs=1e-12)
    tpot = steps.latency.iloc[1:].mean()
    got = token_latency(res.responses, res.window)
    assert got["ttft_mean_ms"] == got["ttft_median_ms"] == got["ttft_p99_ms"] == approx(ttft * 1000)
    for name in ("tpot", "itl"):  # every token after the first is its own chunk
        for stat in ("mean", "median", "p99"):
            assert got[f"{name}_{stat}_ms"] == approx(tpot * 1000)
    assert got["e2e_mean_ms"] == approx((r.t_end - r.t_start) * 1000)
    # summary.csv carries the same figures after its old columns
    row = summarize(res).iloc[-1]
    assert [row[c] for c in TOKEN_LATENCY_COLUMNS] == approx([got[c] for c in TOKEN_LATENCY_COLUMNS])


def test_centralized_first_token_comes_from_the_step_that_ends_the_prefill(det_scenario) -> None:
    # chunks of 10 tokens: the 16-token prompt takes steps 1 and 2; the first token is step 2's
    res = simulate(
        resolve_server(
            det_scenario(policy="centralized", devices={"count": 1}, server={"prefill_chunk_tokens": 10})
        )
    )
    assert res.batches.n_linear.iloc[:3].tolist() == [10, 6, 1]
    r = res.responses.iloc[0]
    assert r.t_first == approx(res.batches.t_end.iloc[1] + DOWN1, abs=1e-12)


def test_centralized_single_token_response_has_ttft_equal_to_e2e(det_scenario) -> None:
    one = {"value": 1, "min": 1, "max": 1}
    res = simulate(resolve_server(det_scenario(policy="centralized", workload={"output_tokens": one})))
    r = res.responses[res.responses.measured]
    assert (r.t_first == r.t_end).all()
    got = token_latency(res.responses, res.window)
    assert math.isnan(got["tpot_mean_ms"]) and math.isnan(got["itl_mean_ms"])  # no gaps
    assert got["ttft_mean_ms"] == approx(got["e2e_mean_ms"])


def test_speculative_first_token_is_the_first_rounds_verdict(det_scenario) -> None:
    # test_simulation's two devices: rounds end at 0.064468, 0.125488 and 0.166314
    res = simulate(resolve_server(det_scenario(workload={"duration_s": 0.5})))
    first = res.rounds[res.rounds["round"] == 0].set_index("response").t_end
    resp = res.responses.set_index("response")
    done = resp[~resp.censored]
    assert len(done) >= 4
    assert done.t_first.to_numpy() == approx(first[done.index].to_numpy(), abs=0)
    assert done.t_first.iloc[:2].tolist() == approx([0.064468] * 2)
    assert (done.rounds == 3).all()
    got = token_latency(res.responses, res.window)
    m = done[done.measured]
    assert got["ttft_mean_ms"] == approx((m.t_first - m.t_start).mean() * 1000)
    # two gaps per response, (0.166314 - 0.064468) / 2 each in the first ones
    gap = (m.t_end - m.t_first) / 2
    assert gap.iloc[:2].tolist() == approx([(0.166314 - 0.064468) / 2] * 2)
    assert got["itl_median_ms"] == approx(gap.median() * 1000)
    assert got["itl_mean_ms"] == approx(gap.mean() * 1000)
    assert got["tpot_mean_ms"] == approx(((m.t_end - m.t_first) / 6).mean() * 1000)


@pytest.mark.parametrize("duration, came", [(0.5, True), (0.2, False)])
def test_censored_response_keeps_its_first_token_if_it_came(det_scenario, duration, came) -> None:
    # class 50 tok/s: 7 tokens are due at 0.14 s, but links of 200 ms bring the first verdict at
    # about 0.44 s and the last at about 1.3 s, so the watchdog censors both responses at the
    # window's end: after their first token at 0.5 s, before it at 0.2 s (NaN)
    slow = {"lan": {"latency_ms": 200.0}}
    res = simulate(
        resolve_server(
            det_scenario(
                devices={"classes": [50.0]},
                network={"link_types": slow},
                workload={"duration_s": duration},
            )
        )
    )
    r = res.responses[res.responses.measured]
    assert r.censored.all() and len(r) == 2
    first = res.rounds[res.rounds["round"] == 0].set_index("response").t_end
    if came:
        assert r.t_first.tolist() == first[r.response].tolist()
        assert (first > 0.2).all() and (first < 0.5).all()
    else:  # the run ended before any verdict came back
        assert first.empty and r.t_first.isna().all()
    assert math.isnan(token_latency(res.responses, res.window)["ttft_mean_ms"])  # finished only


def test_token_latency_of_a_hand_made_table() -> None:
    nan = math.nan
    table = pd.DataFrame(
        {
            "t_start": [0.0, 1.0, 2.0, 3.0, 0.5, 4.0, 5.0],
            "t_first": [0.1, 1.3, 2.2, 3.1, 0.6, nan, nan],
            "t_end": [1.1, 2.3, 2.2, 4.1, 9.5, nan, 9.0],
            "output_len": [11, 5, 1, 21, 4, 3, 8],
            "rounds": [5, 3, 1, 21, 2, 0, 4],
            "measured": [True, True, True, True, False, True, True],
            "censored": [False, False, False, False, False, True, False],
        }
    )
    # measured finished: rows 0-3 and 6 (row 6: no first-token time); row 4 is not measured,
    # row 5 is censored
    got = token_latency(table, (0.0, 10.0))
    assert set(got) == set(TOKEN_LATENCY_COLUMNS)
    ttft = np.array([0.1, 0.3, 0.2, 0.1])
    assert got["ttft_mean_ms"] == approx(ttft.mean() * 1000)
    assert got["ttft_median_ms"] == approx(np.median(ttft) * 1000)
    assert got["ttft_p99_ms"] == approx(np.percentile(ttft, 99) * 1000)
    tpot = np.array([1.0 / 10, 1.0 / 4, 1.0 / 20])  # rows 0, 1, 3 (row 2 has one token)
    assert got["tpot_mean_ms"] == approx(tpot.mean() * 1000)
    assert got["tpot_median_ms"] == approx(100.0)
    # ITL: row 0 has 4 gaps of 0.25, row 1 2 gaps of 0.5, row 3 20 gaps of 0.05
    pool = np.repeat([0.25, 0.5, 0.05], [4, 2, 20])
    assert got["itl_mean_ms"] == approx(pool.mean() * 1000) == approx((1.0 + 1.0 + 1.0) / 26 * 1000)
    assert got["itl_median_ms"] == approx(50.0)
    assert got["itl_p99_ms"] == approx(np.percentile(pool, 99) * 1000)
    e2e = np.array([1.1, 1.3, 0.2, 1.1, 4.0])
    assert got["e2e_mean_ms"] == approx(e2e.mean() * 1000)
    assert got["e2e_p99_ms"] == approx(np.percentile(e2e, 99) * 1000)
    # throughput: every response that ended inside the window, measured or not
    assert got["output_throughput_tps"] == approx((11 + 5 + 1 + 21 + 4 + 8) / 10.0)
    assert got == token_latency(table, (0.0, 10.0))


def test_token_latency_of_no_responses_is_nan() -> None:
    empty = pd.DataFrame(
        {c: pd.Series(dtype=float) for c in ("t_start", "t_first", "t_end", "output_len", "rounds")}
        | {"measured": pd.Series(dtype=bool), "censored": pd.Series(dtype=bool)}
    )
    got = token_latency(empty, (0.0, 1.0))
    assert all(math.isnan(got[c]) for c in TOKEN_LATENCY_COLUMNS if c.endswith("_ms"))
    assert got["output_throughput_tps"] == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_pooled_quantile_is_the_quantile_of_the_pool(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = rng.random(30)
    weights = rng.integers(1, 9, 30)
    pool = np.repeat(values, weights)
    for q in (0.0, 0.3, 0.5, 0.9, 0.99, 1.0):
        assert pooled_quantile(values, weights, q) == approx(np.quantile(pool, q), rel=1e-12)


def test_swarm_first_token_is_the_first_streamed_line() -> None:
    """The real centralized server streams one line per step that gave tokens: ``done`` succeeds
    with when the first one arrived (the device adds the downlink time, as in the simulator)."""
    import asyncio
    import json
    import time
    from contextlib import asynccontextmanager

    import simpy

    from wispsim.serve.swarm import RemoteCentral

    class Stream:
        status_code = 200

        async def aiter_lines(self):  # type: ignore[no-untyped-def]
            for n in (1, 2, 3):
                await asyncio.sleep(0.01)
                yield json.dumps({"t": 100.0 + n, "tokens": n})

    class Http:
        @asynccontextmanager
        async def stream(self, method: str, path: str, json: object):  # type: ignore[no-untyped-def]
            yield Stream()

    class Client:
        http = Http()
        url = "fake"

    class Env(simpy.Environment):  # the parts of WallClock that RemoteCentral uses
        origin = time.monotonic()
        posted: list = []  # noqa: RUF012

        def post(self, fn) -> None:  # type: ignore[no-untyped-def]
            self.posted.append(fn)

    env = Env()
    remote = RemoteCentral(env, Client(), 0.0, 1000, 0)  # type: ignore[arg-type]
    done = env.event()
    asyncio.run(remote._generate(0, 4, 3, done))
    (fn,) = env.posted
    fn()  # the reply is settled when the stream ended, on the environment's clock
    env.run()
    assert [a[1] for a in remote.arrivals] == [1, 2, 3]
    first, chunks = done.value[:2]
    assert first == remote.arrivals[0][2] < remote.arrivals[-1][2]
    assert chunks == 3  # counted as the response's output tokens, as the swarm always has
