"""Add vLLM 0.6.0 (V0, multi-step) runs on an A100 and four H100s to runs.csv, all held out (issue 45).

Source: SGLang's reproduction of its v0.3.0 release comparison, repository sgl-project/sglang
(Apache-2.0), ``benchmark/benchmark_vllm_060/README.md`` at
120affb9613cc3f5bcd055ec09c7621d3ced0ebc: vLLM's rows only.

- Server: ``python -m vllm.entrypoints.openai.api_server --model meta-llama/Llama-3.1-8B-Instruct
  --disable-log-requests --num-scheduler-steps 10 --max_model_len 4096`` on one "A100 80G", and
  Llama-3.1-70B-Instruct with ``--tensor 4`` on four "H100 80G", vLLM 0.6.0 (``pip install
  vllm==0.6.0``), ``gpu_memory_utilization`` at its default 0.9 (the README says so).
- Client: ``python3 -m sglang.bench_serving --backend vllm --dataset-name sharegpt`` with
  ``--num-prompts 1200 --request-rate 4``, ``--num-prompts 2400 --request-rate 8`` (Poisson) and
  ``--num-prompts 5000`` (all at once).
- Figures: the online rows give medians only (E2E, TTFT, TPOT, ITL); the all-at-once rows give
  request and output throughput only.

Assumed, and said in each row's notes: V0's defaults where a flag is absent -- chunked prefill off
(V0 turned it on by default only above 32k tokens of context), ``max_num_batched_tokens`` the model
length, ``max_num_seqs`` 256, no prefix caching. vLLM 0.6.0 predates streaming from multi-step
runs (vLLM pull request #8335; on by default from 0.6.3, #9047), so a run's tokens
left at its end; ``wispsim.study.public`` reads that from the version. Lengths: sglang's ShareGPT
sampler filters as vLLM's does (prompts of 4-1,024 tokens, at most 2,048 with the output); the
output mean is the source's own all-at-once run's (output over request throughput: 194.3 and 194.4
tokens), the input mean 215.2 tokens (215,196 over 1,000 ShareGPT prompts with the same tokenizer,
Llama 3's, in vLLM pull request #8335's benchmark). Run once:

    python scripts/data/add_public_sglang_v0.py
"""

from __future__ import annotations

from runs_csv import add_runs

REPO, COMMIT = "sgl-project/sglang", "120affb9613cc3f5bcd055ec09c7621d3ced0ebc"
FILE = "benchmark/benchmark_vllm_060/README.md"
INPUT_MEAN = 215.2  # vLLM PR #8335: 215,196 input tokens over 1,000 ShareGPT prompts (Llama 3)
# group tail, model, arch, gpu, tp, (output tok/s, req/s) of the all-at-once run,
# [(rate, prompts, median E2E, TTFT, TPOT, ITL ms)]
SERVERS = [
    ("llama-3.1-8b-a100", "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b", "a100-80gb", 1,
     (4132.37, 21.27),
     [(4, 1200, 1691.97, 100.48, 14.14, 129.32), (8, 2400, 2137.16, 120.39, 17.09, 158.63)]),
    ("llama-3.1-70b-4xh100", "meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b", "h100-80gb", 4,
     (3700.64, 19.04),
     [(4, 1200, 2915.60, 179.15, 23.58, 231.23), (8, 2400, 3752.38, 207.12, 29.15, 275.32)]),
]  # fmt: skip
NOTES = (
    "Apache-2.0; vLLM 0.6.0 (V0) api_server --num-scheduler-steps 10 --max_model_len 4096 (0.6.0 "
    "predates --multi-step-stream-outputs: a multi-step run streamed its tokens at its end); assumed V0 "
    "defaults: chunked prefill off, max_num_batched_tokens = max_model_len, max_num_seqs 256, no prefix "
    "caching, gpu_memory_utilization 0.9 (stated); client sglang.bench_serving --backend vllm "
    "--dataset-name sharegpt; "
    "output mean from the all-at-once run (output / request throughput), input mean 215.2 (vLLM PR #8335's "
    "ShareGPT sample, the same tokenizer and filter)"
)


def rows() -> list[dict[str, object]]:
    out = []
    for tail, model, arch, gpu, tp, (tok_s, req_s), online in SERVERS:
        group = f"sgl-vllm060-{tail}"
        common = {
            "source": REPO, "commit": COMMIT, "file": FILE, "group": group, "model": model, "arch": arch,
            "gpu": gpu, "tp": tp, "dtype": "bfloat16", "engine": "vllm", "engine_version": "0.6.0",
            "max_num_batched_tokens": 4096, "max_num_seqs": 256, "chunked_prefill": False,
            "prefix_caching": False, "gpu_memory_utilization": 0.9, "block_size": 16, "max_model_len": 4096,
            "dataset": "sharegpt (sglang.bench_serving)", "input_len_mean": INPUT_MEAN,
            "output_len_mean": round(tok_s / req_s, 1), "spec_method": "none", "num_scheduler_steps": 10,
        }  # fmt: skip
        for rate, prompts, e2e, ttft, tpot, itl in online:
            out.append(
                common
                | {
                    "run_id": f"{group}-r{rate}",
                    "request_rate": float(rate),
                    "num_prompts": prompts,
                    "ttft_median_ms": ttft,
                    "tpot_median_ms": tpot,
                    "itl_median_ms": itl,
                    "e2e_median_ms": e2e,
                    "notes": NOTES + "; Poisson arrivals, medians only",
                }
            )
        out.append(
            common
            | {
                "run_id": f"{group}-inf",
                "request_rate": float("inf"),
                "num_prompts": 5000,
                "output_throughput_tok_s": tok_s,
                "request_throughput": req_s,
                "notes": NOTES + "; all at once, throughputs only",
            }
        )
    return out


def main() -> None:
    add_runs(rows(), "vLLM 0.6.0 runs")


if __name__ == "__main__":
    main()
