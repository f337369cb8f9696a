"""Add AMD Instinct MI300X runs of vLLM's older (V0) engine to runs.csv, all held out (issue 45).

Source: lhl's llm-tracker notes, repository AUGMXNT/llm-tracker.info-vault (no licence file: only
the figures used are shipped here, with the citation). Files and commits:

- ``_TOORG/vLLM MI300X vs H100.md`` at 78b51b82ccbb7c3f6d100dd3d050385e79da4482 (2024-12-26):
  Llama-3.1-70B-Instruct on 4 of 8 MI300X (Hot Aisle), ``vllm serve -tp 4
  --gpu_memory_utilization=0.98 --num-scheduler-steps 20`` (then ``--max-num-seqs 4096``),
  ``benchmark_serving.py --backend openai-chat --dataset-name sharegpt --num-prompts 1024`` at
  the concurrencies each result block prints (128, 256, 512);
- ``vLLM Benchmark serving.md`` at 60f89995656d5bf8bf03db7f256ea1d19f082cb6 (2024-12-19): the same
  client at ``--max-concurrency 128`` against ``-tp 8 --num-scheduler-steps 12
  --gpu_memory_utilization=0.96 --max-num-seqs 2048``, and one TP 2 instance at concurrency 32.

Left out: the TP 2 + PP 4 run (pipeline parallelism is not modelled), the speculative-decoding
runs, and the fp8 runs (their checkpoint is not named). The vLLM version is not stated: a source
build (``~/vllm-rocm``) of December 2024 whose flags (``--num-scheduler-steps``,
``--speculative_model``) exist only in the V0 engine, recorded as ``0.6 (inferred)``. V0's defaults
are taken where a flag is absent: ``max_num_seqs`` 256, no prefix caching; chunked prefill is
recorded as off (V0's multi-step scheduler ran whole prompts), so ``max_num_batched_tokens`` is
the model length. ShareGPT lengths: 220,902 input tokens over 1,024 prompts, the generated tokens
each run prints. Run once:

    python scripts/data/add_public_amd.py
"""

from __future__ import annotations

from runs_csv import add_runs

REPO = "AUGMXNT/llm-tracker.info-vault"
SWEEP = ("78b51b82ccbb7c3f6d100dd3d050385e79da4482", "_TOORG/vLLM MI300X vs H100.md")
SERVING = ("60f89995656d5bf8bf03db7f256ea1d19f082cb6", "vLLM Benchmark serving.md")
FIGURES = (
    "duration_s", "request_throughput", "output_throughput_tok_s", "generated",
    "ttft_mean_ms", "ttft_median_ms", "ttft_p99_ms", "tpot_mean_ms", "tpot_median_ms", "tpot_p99_ms",
    "itl_mean_ms", "itl_median_ms", "itl_p99_ms",
)  # fmt: skip
# run id tail, (commit, file), tp, scheduler steps, gpu memory utilization, max_num_seqs, concurrency, figures
RUNS = [
    ("tp4-c128", SWEEP, 4, 20, 0.98, 256, 128,
     (95.88, 10.68, 1998.36, 191594, 1156.72, 804.28, 4097.30, 50.05, 51.27, 76.24, 50.95, 33.46, 560.38)),
    ("tp4-c256", SWEEP, 4, 20, 0.98, 256, 256,
     (84.43, 12.13, 2269.09, 191585, 2621.59, 1455.22, 7408.13, 92.84, 84.74, 241.76, 81.05, 46.74, 1180.43)),
    ("tp4-c512", SWEEP, 4, 20, 0.98, 256, 512,
     (84.19, 12.16, 2275.44, 191574, 16126.02, 19532.95, 26480.88,
      93.01, 84.16, 250.88, 80.65, 42.97, 992.18)),
    ("tp4-max-num-seqs-4096-c128", SWEEP, 4, 20, 0.98, 4096, 128,
     (96.39, 10.62, 1992.04, 192022, 1060.39, 813.15, 3973.97, 55.43, 51.67, 120.38, 51.73, 33.44, 557.99)),
    ("tp4-max-num-seqs-4096-c256", SWEEP, 4, 20, 0.98, 4096, 256,
     (84.40, 12.13, 2268.00, 191426, 2472.82, 1426.22, 7257.70, 95.16, 85.84, 329.28, 81.81, 42.56, 979.78)),
    ("tp4-max-num-seqs-4096-c512", SWEEP, 4, 20, 0.98, 4096, 512,
     (75.04, 13.65, 2560.09, 192098, 6944.99, 3276.44, 13433.17,
      175.03, 136.59, 1090.07, 117.71, 41.52, 1728.53)),
    ("tp8-c128", SERVING, 8, 12, 0.96, 2048, 128,
     (63.81, 16.05, 2993.85, 191043, 564.63, 363.05, 2301.28, 36.10, 36.02, 73.00, 35.30, 21.43, 276.44)),
    ("tp2-c32", SERVING, 2, 12, 0.96, 2048, 32,
     (286.06, 3.58, 671.54, 192103, 420.74, 383.36, 1625.62, 42.82, 43.05, 58.85, 43.94, 33.32, 256.37)),
]  # fmt: skip
PROMPTS, INPUT_TOKENS, MAX_MODEL_LEN = 1024, 220_902, 131_072


def rows() -> list[dict[str, object]]:
    out = []
    for tail, (commit, file), tp, steps, util, seqs, conc, figures in RUNS:
        f = dict(zip(FIGURES, figures, strict=True))
        generated = f.pop("generated")
        run_id = f"lhl-llama-3.1-70b-mi300x-{tail}"
        out.append(
            {
                "run_id": run_id,
                "source": REPO,
                "commit": commit,
                "file": file,
                "group": run_id.rsplit("-c", 1)[0],
                "model": "meta-llama/Llama-3.1-70B-Instruct",
                "arch": "llama-3.1-70b",
                "gpu": "mi300x",
                "tp": tp,
                "dtype": "bfloat16",
                "engine": "vllm",
                "engine_version": "0.6 (inferred)",
                "max_num_batched_tokens": MAX_MODEL_LEN,
                "max_num_seqs": seqs,
                "chunked_prefill": False,
                "prefix_caching": False,
                "gpu_memory_utilization": util,
                "block_size": 16,
                "max_model_len": MAX_MODEL_LEN,
                "dataset": "sharegpt (ShareGPT_V3_unfiltered_cleaned_split.json)",
                "concurrency": conc,
                "request_rate": float("inf"),
                "num_prompts": PROMPTS,
                "input_len_mean": round(INPUT_TOKENS / PROMPTS, 2),
                "output_len_mean": round(generated / PROMPTS, 2),
                "spec_method": "none",
                "num_scheduler_steps": steps,
                **f,
                "num_failed": 0,
                "notes": (
                    "no licence file: figures only, cited; vLLM V0 (source build, 2024-12; "
                    f"--num-scheduler-steps {steps}: tokens stream in bursts of {steps} steps, which "
                    "the ITL median and P99 show); VLLM_USE_TRITON_FLASH_ATTN=0; openai-chat endpoint; "
                    "chunked prefill and max_num_batched_tokens assumed (V0 defaults under multi-step)"
                ),
            }
        )
    return out


def main() -> None:
    add_runs(rows(), "MI300X runs")


if __name__ == "__main__":
    main()
