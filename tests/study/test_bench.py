"""The ``vllm bench serve`` driver (wispsim.study.bench) and the public-runs study around it:
exact figures on a one-request benchmark, vLLM's async scheduling, prefix-cache hits of repeated
prompts, and one-line errors for a bad study spec."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from wispsim.errors import ConfigError
from wispsim.model.archs import load_arch, load_gpu
from wispsim.model.physical import physical_profile
from wispsim.model.profiles import parse_profile
from wispsim.study import public
from wispsim.study.bench import BenchRun, bench

PARAMS = {
    "efficiency": {"bandwidth": 0.8, "compute": 0.7, "attention": 0.7},
    "overhead_ms": {"step": 0.5, "request": 0.01, "arrival": 2.0, "allreduce": 0.008, "frontend": 10.0},
    "host_cpu_speed": None,  # the engine alone: no host-CPU model beside it
}


@pytest.fixture(scope="module")
def profile():  # type: ignore[no-untyped-def]
    data = physical_profile(load_arch("qwen3-32b"), load_gpu("h100-80gb"), params=PARAMS, noise_sigma=0.0)
    return parse_profile(data, "test")


def test_one_request_alone_has_exact_figures(profile) -> None:  # type: ignore[no-untyped-def]
    """Concurrency 1, one prompt: TTFT is the front end plus the prefill step, TPOT the mean of
    the decode steps that follow, throughput the output over the benchmark's duration."""
    est = profile.estimator
    res = bench(profile, BenchRun(num_prompts=1, input_lens=[100], output_lens=[5], concurrency=1))
    f = res.figures()
    prefill = est.batch(100, 100 * 100, 0, 1, 1, n_logits=1)  # a logit row at its last token
    decodes = [est.batch(1, 100 + k + 1, 100 + k, 1, 0) for k in range(4)]
    assert f["ttft_median_ms"] == pytest.approx((0.010 + prefill) * 1e3)
    assert f["tpot_median_ms"] == pytest.approx(sum(decodes) / 4 * 1e3)
    assert f["e2e_median_ms"] == pytest.approx((0.010 + prefill + sum(decodes)) * 1e3)
    assert f["output_throughput_tok_s"] == pytest.approx(5 / (0.010 + prefill + sum(decodes)))


def test_with_the_host_cpu_a_step_pays_the_engine_core_and_a_prompt_its_tokenization() -> None:
    """A profile calibrated beside the host-CPU model (``roofline.host_cpu_speed``): one prompt
    alone waits the front end's latency and its tokenization in the API server, every step takes
    its GPU time plus the engine core's CPU (no async scheduling), the first hashing the prompt,
    and every chunk reaches the client once the API server has read the step's message and
    written it (the same delay on each, so TPOT is the steps')."""
    from wispsim.model.host_cpu import host_cpu

    data = physical_profile(
        load_arch("qwen3-32b"),
        load_gpu("h100-80gb"),
        params={**PARAMS, "host_cpu_speed": 2.0},
        noise_sigma=0.0,
    )
    prof = parse_profile(data, "test")
    est, host = prof.estimator, host_cpu(2.0)
    res = bench(prof, BenchRun(num_prompts=1, input_lens=[100], output_lens=[5], concurrency=1))
    prefill = est.batch(100, 100 * 100, 0, 1, 1, n_logits=1) + host.engine(1, 1, 0, 100)
    decodes = [est.batch(1, 100 + k + 1, 100 + k, 1, 0) + host.engine(1, 0, 0, 0) for k in range(4)]
    front = 0.010 + host.api(False, text=100)
    stream = host.api_step + host.output(1) + host.api_chunk
    assert stream > 0
    assert res.responses.frontend_s.iloc[0] == pytest.approx(front)
    f = res.figures()
    assert f["ttft_median_ms"] == pytest.approx((front + prefill + stream) * 1e3)
    assert f["tpot_median_ms"] == pytest.approx(sum(decodes) / 4 * 1e3)
    assert f["e2e_median_ms"] == pytest.approx((front + prefill + sum(decodes) + stream) * 1e3)
    # under async scheduling the engine core's CPU hides behind the GPU's work
    asyn = bench(
        prof, BenchRun(num_prompts=1, input_lens=[100], output_lens=[5], concurrency=1, async_scheduling=True)
    )
    gpu_decodes = [est.batch(1, 100 + k + 1, 100 + k, 1, 0) for k in range(4)]
    assert asyn.figures()["tpot_median_ms"] == pytest.approx(sum(gpu_decodes) / 4 * 1e3)


def test_async_scheduling_makes_a_request_arriving_mid_step_wait_a_step_longer(profile) -> None:  # type: ignore[no-untyped-def]
    """With async scheduling the step after the running one is already formed: a request that
    arrives while the engine is busy joins the step after next; an idle engine takes it at once."""
    run = BenchRun(num_prompts=2, input_lens=[100], output_lens=[50], concurrency=2, request_rate=50.0)
    sync = bench(profile, run).responses
    from dataclasses import replace

    asyn = bench(profile, replace(run, async_scheduling=True)).responses
    first = lambda r: (r.t_first - r.t_start).to_numpy()  # noqa: E731
    assert first(asyn)[0] == pytest.approx(first(sync)[0])  # engine idle: no difference
    assert first(asyn)[1] > first(sync)[1]  # arrived mid-step: one more step


def test_ttft_by_its_parts_adds_up_and_async_scheduling_is_the_step_wait(profile) -> None:  # type: ignore[no-untyped-def]
    """Each request's TTFT is front end + wait for the next step it can join + queueing + its
    prefill chunks; a lone request (an idle engine) waits for no step, and async scheduling makes
    a request arriving mid-step wait longer for its step, nothing else."""
    from dataclasses import replace

    run = BenchRun(num_prompts=40, input_lens=[300], output_lens=[40], request_rate=20.0, seed=3)
    for r in (run, replace(run, async_scheduling=True)):
        res = bench(profile, r)
        rs = res.responses
        parts = rs.frontend_s + rs.step_wait_s + rs.queue_s + rs.prefill_s
        assert parts.to_numpy() == pytest.approx((rs.t_first - rs.t_start).to_numpy(), abs=1e-9)
        assert (rs[["frontend_s", "step_wait_s", "queue_s", "prefill_s"]] >= -1e-12).all().all()
        assert rs.frontend_s.to_numpy() == pytest.approx(0.010)
    sync = bench(profile, run).figures()
    asyn = bench(profile, replace(run, async_scheduling=True)).figures()
    assert asyn["ttft_step_wait_mean_ms"] > sync["ttft_step_wait_mean_ms"]
    lone = bench(profile, BenchRun(num_prompts=1, input_lens=[300], output_lens=[4])).responses
    assert lone.step_wait_s.iloc[0] == 0 and lone.queue_s.iloc[0] == 0


def test_prefix_hits_are_whole_blocks_of_repeated_prompts() -> None:
    """The server's prefix cache (one rule for every client): a repeated prompt is cached whole,
    a seen group's shared prefix in whole blocks, the last token always computed."""
    from wispsim.sim.generation import Generation, PromptCache

    def gen(prompt_id: int) -> Generation:  # 2 prompts per group, 40 tokens shared
        return Generation(0, 80, 8, None, None, prompt_id, prompt_id // 2, 40)  # type: ignore[arg-type]

    cache = PromptCache(16, True)
    # prompts 0,1 (group 0), 2,3 (group 1), then 0 again
    assert [cache.hit(gen(p)) for p in (0, 1, 2, 3, 0)] == [0, 32, 0, 32, 64]
    off = PromptCache(16, False)
    assert [off.hit(gen(0)), off.hit(gen(0))] == [0, 0]


def test_a_public_run_simulates_its_figures() -> None:
    folder = str(public.data_dir())
    runs = public.load_runs(folder)
    row = runs[runs.run_id == "ruiz-qwen3-32b-nospec-c1"].iloc[0]
    sim = public.simulate_run(row, folder)
    assert set(public.METRICS) <= set(sim)
    # physics: a decode step of a 64 GB model on a 2.4 TB/s part costs at least 26.7 ms
    assert sim["tpot_median_ms"] > 64e9 / 2400e9 * 1e3
    table = public.compare(runs[runs.run_id == row.run_id], folder, None, [row.run_id])
    assert set(table.set) == {"calibration"} and (table.ape_pct >= 0).all()
    assert list(public.summary(table).columns) == ["set", "family", "median", "mean", "count"]


def test_a_study_spec_naming_an_unknown_run_is_one_line() -> None:
    from wispsim.study.experiments.public_study import _selected

    runs = pd.DataFrame({"run_id": ["a"], "gpu": ["h100-80gb"], "spec_method": ["none"], "group": ["g"]})
    with pytest.raises(ConfigError, match="calibration: unknown run 'b'") as err:
        _selected(runs, {"name": "public", "calibration": ["b"]})
    assert "\n" not in str(err.value)


def test_a_run_without_a_logged_kv_cache_gets_what_vllm_would_leave() -> None:
    """No `kv_tokens`: the capacity is what the GPU's memory leaves after the weights and vLLM's
    start-up profile at the run's own max_num_seqs (1,024 seqs hold ~4 GiB more than 64)."""
    from wispsim.model.profiles import load_profile
    from wispsim.study.bench import BenchRun, bench_scenario

    prof = load_profile("h100-qwen3-32b")
    run = BenchRun(num_prompts=4, input_lens=[100], output_lens=[10], max_num_seqs=64, block_size=16)
    few = bench_scenario(prof, run).capacities[0]
    many = bench_scenario(prof, replace(run, max_num_seqs=1024)).capacities[0]
    assert many < few - 14_000  # ~4.2 GiB over 256 KiB per token: ~17k tokens
    logged = bench_scenario(prof, replace(run, kv_tokens=10_000)).capacities[0]
    assert logged == 10_000
