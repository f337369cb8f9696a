"""``wispsim.runs.bench``: the benchmark command's one function and its checks, called directly
(the command itself: tests/cli/test_bench.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wispsim.errors import ConfigError
from wispsim.runs.bench import Client, Server, check, random_lengths, rate_of, run_bench
from wispsim.runs.bench_profile import arch_of, profile_of


def test_a_model_is_a_shipped_arch_a_config_json_or_a_hub_id(tmp_path: Path) -> None:
    assert arch_of("qwen3-32b").name == "qwen3-32b"
    assert arch_of("Qwen/Qwen3-32B").name == "qwen3-32b"
    cfg = tmp_path / "mine" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({**_qwen_like(), "model_type": "qwen2"}))
    assert arch_of(str(cfg.parent)).name == "mine" and arch_of(str(cfg)).hidden_size == 512
    for bad, words in (("nope-7b", "unknown model"), (str(tmp_path), "no config.json")):
        with pytest.raises(ConfigError, match=words):
            arch_of(bad)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        arch_of(str(broken))


def _qwen_like() -> dict[str, object]:
    return {
        "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
        "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 4096,
    }  # fmt: skip


def test_the_profile_comes_from_the_model_and_gpu_or_is_named() -> None:
    prof = profile_of("qwen3-32b", "a100-80gb", 1, "auto", None)
    assert prof.gpu_count == 1 and prof.estimator.form == "roofline"
    assert profile_of(None, None, 1, "auto", "a100-qwen3-32b").name == "a100-qwen3-32b"
    with pytest.raises(ConfigError, match="not both"):
        profile_of("qwen3-32b", None, 1, "auto", "a100-qwen3-32b")
    with pytest.raises(ConfigError, match="--model and --gpu"):
        profile_of("qwen3-32b", None, 1, "auto", None)
    with pytest.raises(ConfigError, match="--dtype"):
        profile_of("qwen3-32b", "a100-80gb", 1, "int3", None)


def test_rates_and_lengths_as_vllm_draws_them() -> None:
    assert rate_of("inf") is None and rate_of(" INF ") is None and rate_of("2.5") == 2.5
    for bad in ("0", "-1", "nan", "fast"):
        with pytest.raises(ConfigError, match="--request-rate"):
            rate_of(bad)
    x = random_lengths(np.random.default_rng(0), 100, 0.5, 1000)
    assert x.min() >= 50 and x.max() <= 150 and len(set(x.tolist())) > 50


def test_bad_flags_are_refused_before_any_work() -> None:
    good_c, good_s = Client(), Server()
    check(good_c, good_s)
    for client, server, words in (
        (Client(num_prompts=0), good_s, "--num-prompts"),
        (Client(random_range_ratio=1.0), good_s, "--random-range-ratio"),
        (Client(burstiness=0), good_s, "--burstiness"),
        (Client(max_concurrency=0), good_s, "--max-concurrency"),
        (Client(dataset_name="sharegpt"), good_s, "--dataset-name"),
        (good_c, Server(gpu_memory_utilization=1.5), "--gpu-memory-utilization"),
        (good_c, Server(max_num_seqs=0), "--max-num-seqs"),
        (good_c, Server(num_scheduler_steps=0), "--num-scheduler-steps"),
        (good_c, Server(async_scheduling=True, num_scheduler_steps=8), "--async-scheduling"),
    ):
        with pytest.raises(ConfigError, match=words):
            check(client, server)


def test_a_run_reports_vllms_keys_the_servers_flags_and_honours_set() -> None:
    prof = profile_of("qwen3-14b", "h100-80gb", 1, "auto", None)
    client = Client(num_prompts=60, request_rate="10", random_input_len=400, random_output_len=40)
    result, res = run_bench(prof, client, Server())
    assert result["completed"] == 60 and result["num_prompts"] == 60 and result["request_rate"] == 10.0
    assert result["server"]["max_num_seqs"] == 1024 and result["server"]["max_num_batched_tokens"] == 8192
    assert all(math.isfinite(result[k]) for k in ("mean_ttft_ms", "p99_itl_ms", "output_throughput"))
    assert set(result["ttft_parts_mean_ms"]) == {"frontend", "step_wait", "queue", "prefill"}
    # a scenario field beyond vLLM's flags, honoured as a run honours it
    off, _ = run_bench(prof, client, Server(), ["server.host.frontend=false"])
    assert off["ttft_parts_mean_ms"]["frontend"] < result["ttft_parts_mean_ms"]["frontend"]
    assert off["set"] == ["server.host.frontend=false"]
    with pytest.raises(ConfigError, match=r"server\.bogus"):
        run_bench(prof, client, Server(), ["server.bogus=1"])
    assert isinstance(res.responses, pd.DataFrame) and len(res.responses) == 60


def test_vllm_v0s_scheduling_runs_from_its_flags_and_shows_in_the_itl() -> None:
    """``--num-scheduler-steps`` runs V0 (no async scheduling, no chunked prefill: a prompt's
    prefill stalls the decodes, and prefills gather at the runs' ends), which the P99 ITL shows;
    ``--set server.engine.use_v1=false`` runs V0 single-step. The result file says how it ran."""
    prof = profile_of("qwen3-14b", "h100-80gb", 1, "auto", None)
    client = Client(num_prompts=200, max_concurrency=32, random_input_len=400, random_output_len=60,
                    random_range_ratio=0.9)  # fmt: skip
    v1, _ = run_bench(prof, client, Server())
    v0, _ = run_bench(prof, client, Server(max_num_batched_tokens=8192), ["server.engine.use_v1=false"])
    multi, _ = run_bench(prof, client, Server(max_num_batched_tokens=8192, num_scheduler_steps=8))
    assert (v1["server"]["vllm_use_v1"], v1["server"]["async_scheduling"]) == (True, True)
    want = {"vllm_use_v1": False, "async_scheduling": False, "enable_chunked_prefill": False,
            "num_scheduler_steps": 8}  # fmt: skip
    assert {k: multi["server"][k] for k in want} == want
    assert v0["server"]["vllm_use_v1"] is False and v0["server"]["num_scheduler_steps"] == 1
    assert v1["p99_itl_ms"] < v0["p99_itl_ms"] < multi["p99_itl_ms"]
    assert multi["mean_ttft_ms"] > v0["mean_ttft_ms"]  # a request waits for the run under way
    # the budget must hold a whole request without chunked prefill (vLLM: >= max_model_len)
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        run_bench(prof, Client(num_prompts=5, random_input_len=9000), Server(num_scheduler_steps=8))


def test_a_dataset_replays_its_times_and_lengths(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    pd.DataFrame(
        {"time_s": [0.0, 0.5, 1.0], "prompt_tokens": [100, 200, 300], "output_tokens": [5, 6, 7]}
    ).to_csv(path, index=False)
    prof = profile_of("qwen3-14b", "h100-80gb", 1, "auto", None)
    result, res = run_bench(prof, Client(dataset_path=path), Server())
    assert result["completed"] == 3 and result["total_output_tokens"] == 18
    assert res.responses.t_start.tolist() == pytest.approx([0.0, 0.5, 1.0])


def test_calibrate_reads_the_engine_generation_a_result_file_ran_on(tmp_path: Path) -> None:
    """A bench result of a V0 run (its ``server`` keys) is re-run on V0 by ``profile calibrate``;
    a file without them runs on vLLM's defaults (V1, async scheduling)."""
    import json

    from wispsim.study.calibrate import read_result

    prof = profile_of("qwen3-14b", "h100-80gb", 1, "auto", None)
    client = Client(num_prompts=20, max_concurrency=4, random_input_len=200, random_output_len=20)
    result, _ = run_bench(prof, client, Server(max_num_batched_tokens=8192, num_scheduler_steps=4))
    (tmp_path / "v0.json").write_text(json.dumps(result))
    run = read_result(tmp_path / "v0.json", {}).run
    assert (run.num_scheduler_steps, run.use_v1, run.async_scheduling, run.enable_chunked_prefill) == (
        4,
        False,
        False,
        False,
    )
    plain = {k: v for k, v in result.items() if k != "server"}
    (tmp_path / "v1.json").write_text(json.dumps(plain))
    run = read_result(tmp_path / "v1.json", {"max_num_seqs": 256, "max_num_batched_tokens": 8192}).run
    assert (run.num_scheduler_steps, run.use_v1, run.async_scheduling) == (1, None, None)


def test_max_model_len_bounds_the_requests_and_sizes_an_unchunked_step_as_vllm_does() -> None:
    """``--max-model-len`` (the CLI defaults it to the model's max_position_embeddings): a request
    longer is refused, as vLLM refuses it; without chunked prefill, and no
    ``--max-num-batched-tokens``, a step holds max(max_model_len, 2048) tokens, and V0 takes its
    own defaults (256 sequences, 2,048 tokens chunked): vLLM's SchedulerConfig."""
    prof = profile_of("qwen3-14b", "h100-80gb", 1, "auto", None)
    client = Client(num_prompts=10, random_input_len=400, random_output_len=20)
    v0, _ = run_bench(prof, client, Server(num_scheduler_steps=4, max_model_len=4096))
    assert (v0["server"]["max_num_batched_tokens"], v0["server"]["max_model_len"]) == (4096, 4096)
    assert v0["server"]["max_num_seqs"] == 256  # V0's default, where V1 takes 1,024 on an H100
    chunked_v0, _ = run_bench(
        prof, client, Server(max_model_len=4096, enable_chunked_prefill=True), ["server.engine.use_v1=false"]
    )
    assert (chunked_v0["server"]["max_num_batched_tokens"], chunked_v0["server"]["max_num_seqs"]) == (
        2048,
        256,
    )
    v1, _ = run_bench(prof, client, Server(max_model_len=4096))
    assert v1["server"]["max_num_batched_tokens"] == 8192  # chunked: vLLM's default for the GPU
    off, _ = run_bench(
        prof, client, Server(max_model_len=4096), ["server.engine.enable_chunked_prefill=false"]
    )
    assert off["server"]["max_num_batched_tokens"] == 4096  # a --set counts as the flag does
    with pytest.raises(ConfigError, match="--max-model-len"):
        run_bench(prof, client, Server(max_model_len=300))
