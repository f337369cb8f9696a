"""``wispsim bench``: vLLM's benchmark flags against a simulated server, its JSON keys, bad input,
a user's own model and GPU, and agreement with ``wispsim run`` of the same centralized workload."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.cli.test_cli import wispsim

# vllm bench serve --save-result keys (vllm/benchmarks/serve.py), all four latency families
KEYS = [
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrency",
] + [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std", "p99")]


def test_bench_prints_vllms_table_and_saves_its_keys(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = wispsim(
        "bench",
        "--model",
        "llama-2-7b",
        "--gpu",
        "h100-80gb",
        "--num-prompts",
        "40",
        "--request-rate",
        "4",
        "--random-input-len",
        "300",
        "--random-output-len",
        "40",
        "--random-prefix-len",
        "100",
        "--save-result",
        "--result-filename",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    assert "Serving Benchmark Result" in p.stdout and "Mean TTFT (ms):" in p.stdout
    r = json.loads(out.read_text())
    for k in KEYS:
        assert k in r, k
    assert r["completed"] == 40 and r["total_output_tokens"] == 40 * 40
    assert r["total_input_tokens"] == 40 * 400  # the shared prefix sits before every input
    assert r["mean_tpot_ms"] > 0 and r["p99_ttft_ms"] >= r["median_ttft_ms"]
    assert (
        r["server"]["max_num_batched_tokens"] == 8192 and r["server"]["max_num_seqs"] == 1024
    )  # vLLM, 80 GB
    assert r["provenance"]["commit"]


def test_vllms_defaults_follow_the_gpus_memory() -> None:
    from wispsim.study.bench import vllm_defaults

    assert vllm_defaults(80, "NVIDIA A100 80GB SXM") == (2048, 256)  # vLLM keeps A100s small
    assert vllm_defaults(80, "NVIDIA H100 80GB SXM") == (8192, 1024)
    assert vllm_defaults(167.6, "NVIDIA B200") == (16384, 1024)
    assert vllm_defaults(44.7, "NVIDIA L40S") == (2048, 256)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--request-rate", "fast"], "--request-rate"),
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--num-prompts", "0"], "--num-prompts"),
        (
            ["--model", "llama-2-7b", "--gpu", "h100-80gb", "--random-range-ratio", "1.5"],
            "--random-range-ratio",
        ),
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--burstiness", "0"], "--burstiness"),
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--dtype", "int3"], "--dtype"),
        (["--model", "gpt-oss-20b", "--gpu", "h100-80gb", "--dtype", "fp8"], "quantized with mxfp4 already"),
        (["--model", "no-such", "--gpu", "h100-80gb"], "--model"),
        (["--model", "llama-2-7b", "--gpu", "no-such-gpu"], "unknown GPU"),
        (["--model", "llama-2-7b"], "--model/--gpu"),
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--dataset-path", "nope.csv"], "--dataset-path"),
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--quantization", "awq"], "--quantization"),
        (["--model", "gpt-oss-20b", "--gpu", "h100-80gb", "-q", "fp8"], "allowed: mxfp4"),
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--kv-cache-dtype", "fp4"], "--kv-cache-dtype"),
        (["--profile", "a100-qwen3-32b", "--kv-cache-dtype", "fp8"], "--profile"),
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--seed", "-1"], "--seed"),
        (["--model", "llama-2-7b", "--gpu", "h100-80gb", "--enforce-eager"], "eager mode (no CUDA graphs)"),
        # vLLM's scheduler refuses both at start-up
        (
            ["--model", "qwen3-14b", "--gpu", "h100-80gb", "--max-num-batched-tokens", "10"],
            "max_num_seqs (1024)",
        ),
        (
            [
                "--model",
                "qwen3-14b",
                "--gpu",
                "h100-80gb",
                "--no-enable-chunked-prefill",
                "--max-num-seqs",
                "8",
                "--max-num-batched-tokens",
                "1000",
            ],
            "smaller than max_model_len (40960) without chunked prefill",
        ),
        (
            ["--model", "llama-2-7b", "--gpu", "h100-80gb", "--save-result", "--result-dir", "/proc"],
            "virtual",
        ),
    ],
)
def test_bad_flags_are_one_line_with_exit_code_2(tmp_path: Path, args: list[str], expected: str) -> None:
    p = wispsim("bench", *args, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert expected in p.stderr and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_a_users_config_json_and_gpu_file(tmp_path: Path) -> None:
    """A model nobody shipped (its config.json folder) on a card nobody listed (a GPU file), through
    bench and through `profile derive --arch PATH --gpu FILE`, whose output loads again."""
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 2048,
                "num_hidden_layers": 16,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 8192,
                "vocab_size": 128256,
                "rope_scaling": None,
                "architectures": ["LlamaForCausalLM"],
            }
        )
    )
    gpu = tmp_path / "cards.yaml"
    gpu.write_text(
        "my-card:\n  name: My PCIe card\n  generation: ada\n  memory_gib: 44\n  hbm_bandwidth_gbs: 900\n"
        "  bf16_tflops: 360\n  fp8_tflops: null\n  interconnect: pcie4\n  link_gbs: 32\n"
    )
    p = wispsim(
        "bench",
        "--model",
        str(folder),
        "--gpu",
        str(gpu),
        "-tp",
        "2",
        "--num-prompts",
        "20",
        "--save-result",
        "--result-filename",
        str(tmp_path / "r.json"),
    )
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "r.json").read_text())["completed"] == 20
    prof = tmp_path / "mine.yaml"
    p = wispsim(
        "profile",
        "derive",
        "--arch",
        str(folder / "config.json"),
        "--gpu",
        str(gpu),
        "--count",
        "2",
        "--out",
        str(prof),
    )
    assert p.returncode == 0, p.stderr
    p = wispsim("bench", "--profile", str(prof), "--num-prompts", "10")
    assert p.returncode == 0, p.stderr
    gpu.write_text(gpu.read_text().replace("interconnect: pcie4", "interconnect: carrier-pigeon"))
    p = wispsim("bench", "--model", str(folder), "--gpu", str(gpu))
    assert p.returncode == 2 and "my-card.interconnect" in p.stderr and "pcie4" in p.stderr


def _h100_7b(tmp_path: Path) -> Path:
    """A physical Llama-2-7B profile on one H100, derived into ``tmp_path``."""
    prof = tmp_path / "h100-7b.yaml"
    args = ["--arch", "llama-2-7b", "--gpu", "h100-80gb", "--out", str(prof)]
    assert wispsim("profile", "derive", *args).returncode == 0
    return prof


def _centralized_run(tmp_path: Path, prof: Path, name: str) -> list[str]:
    """`wispsim run` of tmp_path/req.csv's requests under centralized serving on ``prof``."""
    arrivals = f"requests:{tmp_path / 'req.csv'}"
    out = str(tmp_path / name)
    return [
        "run",
        "--policy",
        "centralized",
        "--arrivals",
        arrivals,
        "--set",
        f"server.profile={prof}",
        "--out",
        out,
    ]


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_run_and_bench_of_one_open_loop_workload_agree(tmp_path: Path) -> None:
    """The same requests at the same times on the same profile: `wispsim run --policy centralized`
    and `wispsim bench --dataset-path`. Per-token latency is the server's alone and agrees; TTFT
    differs by the path in front of the engine (run: the device's network; bench: the API server,
    the profile's front end), which the two commands model differently (docs/profiles.md)."""
    rng = np.random.default_rng(1)
    t = np.cumsum(rng.exponential(0.5, 60))
    pd.DataFrame({"time_s": t - t[0], "prompt_tokens": 400, "output_tokens": 64}).to_csv(
        tmp_path / "req.csv", index=False
    )
    prof = _h100_7b(tmp_path)
    p = wispsim(*_centralized_run(tmp_path, prof, "run"))
    assert p.returncode == 0, p.stderr
    r = pd.read_parquet(tmp_path / "run" / "responses.parquet")
    run_tpot = float(((r.t_end - r.t_first) / (r.output_len - 1)).mean() * 1e3)
    run_ttft = float((r.t_first - r.t_start).mean() * 1e3)
    p = wispsim(
        "bench",
        "--profile",
        str(prof),
        "--dataset-path",
        str(tmp_path / "req.csv"),
        "--no-enable-prefix-caching",
        "--no-async-scheduling",
        "--save-result",
        "--result-filename",
        str(tmp_path / "b.json"),
    )
    assert p.returncode == 0, p.stderr
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["completed"] == len(r) == 60
    assert b["mean_tpot_ms"] == pytest.approx(run_tpot, rel=0.03)
    assert b["mean_ttft_ms"] == pytest.approx(run_ttft, rel=0.35)


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_vllm_serving_fields_change_a_centralized_run(tmp_path: Path) -> None:
    """server.host.frontend delays every first token by the profile's front end; a shared system prompt
    (workload.shared_prefix_tokens) is prefilled once, then read from the prefix cache."""
    rng = np.random.default_rng(2)
    t = np.cumsum(rng.exponential(0.5, 40))
    pd.DataFrame({"time_s": t - t[0], "prompt_tokens": 600, "output_tokens": 32}).to_csv(
        tmp_path / "req.csv", index=False
    )
    prof = _h100_7b(tmp_path)
    frontend_ms = yaml.safe_load(prof.read_text())["roofline"]["overhead_ms"]["frontend"]

    def run(name: str, *sets: str) -> tuple[float, float]:
        args = _centralized_run(tmp_path, prof, name)
        for s in sets:
            args += ["--set", s]
        p = wispsim(*args)
        assert p.returncode == 0, p.stderr
        r = pd.read_parquet(tmp_path / name / "responses.parquet")
        b = pd.read_parquet(tmp_path / name / "batches.parquet")
        return float((r.t_first - r.t_start).mean() * 1e3), float(b.n_linear.sum())

    ttft, work = run("base")
    ttft_fe, _ = run("frontend", "server.host.frontend=true")
    assert ttft_fe - ttft == pytest.approx(frontend_ms, rel=0.1)
    _, work_shared = run("shared", "workload.shared_prefix_tokens=512")
    assert work - work_shared == pytest.approx(39 * 512, rel=0.02)  # all but the first read it from cache


def test_bench_reproduces_a_public_run_from_its_own_command_line(tmp_path: Path) -> None:
    """A calibration run of the public study (the Qwen3-32B sweep at concurrency 4 on an H100 SXM5
    94GB), given to `wispsim bench` as its `vllm bench serve` / `vllm serve` flags, gives the figures
    the public study simulates for it: one driver, two entrances."""
    from wispsim.study import public

    folder = str(public.data_dir())
    row = public.load_runs(folder).set_index("run_id", drop=False).loc["ruiz-qwen3-32b-nospec-c4"]
    # the source publishes mean lengths (InstructCoder prompts, 200 output tokens with ignore_eos)
    p = wispsim(
        "bench",
        "--model",
        "Qwen/Qwen3-32B",
        "--gpu",
        "h100-94gb-sxm",
        "--dataset-name",
        "random",
        "--random-input-len",
        str(round(row.input_len_mean)),
        "--random-output-len",
        str(round(row.output_len_mean)),
        "--num-prompts",
        str(int(row.num_prompts)),
        "--request-rate",
        "4",
        "--max-concurrency",
        "4",
        "--max-num-seqs",
        "1024",
        "--max-num-batched-tokens",
        "8192",
        "--no-enable-prefix-caching",
        "--async-scheduling",
        "--save-result",
        "--result-filename",
        str(tmp_path / "r.json"),
    )
    assert p.returncode == 0, p.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    study = public.simulate_run(row, folder)
    assert r["median_tpot_ms"] == pytest.approx(study["tpot_median_ms"], rel=1e-6)
    assert r["median_ttft_ms"] == pytest.approx(study["ttft_median_ms"], rel=1e-6)
    assert r["output_throughput"] == pytest.approx(study["output_throughput_tok_s"], rel=1e-6)
    assert r["median_tpot_ms"] == pytest.approx(row.tpot_median_ms, rel=0.10)  # and the real run


def test_vllms_quantization_and_kv_cache_dtype_flags() -> None:
    """``--quantization fp8`` of an unquantized checkpoint is vLLM's online fp8: weights at a byte,
    W8A8 at the fp8 peak on an H100, FP8 Marlin (converted, 0.9 of a dense GEMM) on an A100; a
    quantized checkpoint's own method is a no-op; ``--kv-cache-dtype fp8`` halves a token's KV."""
    from wispsim.runs.bench_profile import profile_of

    def prof(gpu: str, q: str | None = None, kv: str = "auto", model: str = "qwen3-32b"):  # type: ignore[no-untyped-def]
        return profile_of(model, gpu, 1, "auto", None, quantization=q, kv_cache_dtype=kv)

    plain, fp8 = prof("h100-80gb"), prof("h100-80gb", "fp8")
    assert fp8.estimator.quant_rate == pytest.approx(1979 / 989)
    assert fp8.estimator.weight_bytes_read(1) < 0.55 * plain.estimator.weight_bytes_read(1)
    assert fp8.kv_capacity_tokens(0.9, 1.5) > 1.5 * plain.kv_capacity_tokens(0.9, 1.5)  # freed weights
    a100 = prof("a100-80gb", "fp8").estimator
    assert a100.quant_rate == 1.0 and a100.dequant_eff == pytest.approx(0.9)
    oss = prof("h100-80gb", "mxfp4", model="gpt-oss-20b")
    assert oss.estimator.arch == prof("h100-80gb", model="gpt-oss-20b").estimator.arch
    kv8 = prof("h100-80gb", kv="fp8_e4m3")
    assert kv8.estimator.kv_bytes == pytest.approx(plain.estimator.kv_bytes / 2)


@pytest.mark.slow  # 4-8 s on a slow host: the full suite runs it, the quick lane keeps its kin
def test_a_v0_benchmark_says_how_its_engine_ran() -> None:
    common = ("bench", "--model", "qwen3-14b", "--gpu", "h100-80gb", "--num-prompts", "20")
    v0 = wispsim(*common, "--num-scheduler-steps", "4", "--multi-step-stream-outputs", "False")
    assert v0.returncode == 0, v0.stderr
    said = " ".join(v0.stdout.split())  # (the console wraps at 80 columns)
    assert "engine: vLLM V0, chunked prefill off, 4 scheduler steps a run, streamed at each run's end" in said
    v1 = wispsim(*common)
    assert v1.returncode == 0 and "engine: vLLM V0" not in v1.stdout
    bad = wispsim(*common, "--num-scheduler-steps", "4", "--async-scheduling")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--async-scheduling" in bad.stderr
