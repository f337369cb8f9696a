"""Add the second set of public runs (experiments/data/public/candidates/runs_candidates_2.csv,
found 2026-11-27; NOTES_2.md there says where each comes from) to runs.csv, all held out.

Taken: rows graded high or medium (and the RTX 4090 rows, graded low: the only GeForce Ada card
found; no vLLM version, TTFT and throughput only) whose model the cost model prices (gpt-oss-120b
and -20b with their MXFP4 experts, DeepSeek-R1-0528 on the DeepSeek-V3 architecture with its fp8 weights,
Qwen2.5-0.5B, Mistral-7B v0.3) on a GPU of wispsim/data/gpus.yaml (A100 80GB SXM, H100 80GB SXM,
H200, L4, B200, RTX 4090),
with one tensor-parallel size (no DP/EP/PP layouts). Left out, and why: GLM-4.5/4.6 (no verified
config.json here), DeepSeek-V3.2 (sparse attention, not modelled), vision-language models, MI100
(CDNA 1: no kernel efficiencies for the generation).

The L4 sweep does not state its prompt count: it is simulated with 10 x concurrency prompts (at
least 50), a steady state at that concurrency. Async scheduling is on only where the row states it.
Run once:
    python scripts/data/add_public_2026.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from wispsim.analysis.token_latency import TOKEN_LATENCY_COLUMNS

DIR = Path(__file__).resolve().parents[2] / "experiments" / "data" / "public"
ARCH = {
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3",
    "Qwen/Qwen2.5-0.5B-Instruct": "qwen2.5-0.5b",
    "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b",
}
GPU = {
    "a100-sxm4-80gb": "a100-80gb",
    "h100-sxm5-80gb": "h100-80gb",
    "h200-sxm-141gb": "h200",
    "l4-24gb": "l4",
    "b200-180gb": "b200",
    "rtx-4090-24gb": "rtx-4090",
}
# the figures copied: vllm bench serve's latencies (as analysis.token_latency names them) and throughputs
FIGURES = [c for c in TOKEN_LATENCY_COLUMNS if c != "output_throughput_tps"] + [
    "output_throughput_tok_s",
    "request_throughput",
    "duration_s",
]


def _num(text: object) -> float | None:
    m = re.match(r"\s*([0-9.]+|inf)", str(text))
    return float(m.group(1)) if m else None


def _group(run_id: str) -> str:
    """Runs of one server launch share a group (their KV capacity; memory.csv)."""
    return re.sub(r"-(sharegpt|random)(-bs4)?(-\d+-\d+)?", "", run_id)


def main() -> None:
    cand = pd.read_csv(DIR / "candidates" / "runs_candidates_2.csv")
    tp = pd.to_numeric(cand.tp, errors="coerce")
    trusted = cand.trust.isin(["high", "medium"]) | (cand.gpu == "rtx-4090-24gb")
    keep = trusted & cand.model.isin(ARCH) & cand.gpu.isin(GPU) & tp.notna()
    cand = cand[keep].assign(tp=tp[keep].astype(int))
    runs = pd.read_csv(DIR / "runs.csv")
    cand = cand[~cand.run_id.isin(runs.run_id)]  # what an earlier run of this script added stays
    if cand.empty:
        print("already added")
        return
    rows = []
    for c in cand.itertuples():
        conc = _num(c.max_concurrency)
        prompts = _num(c.num_prompts) or max(10 * (conc or 5), 50)
        fp8 = "fp8" in str(c.dtype).lower() and ARCH[c.model] == "deepseek-v3"
        rows.append(
            {
                "run_id": c.run_id,
                "source": c.source_repo,
                "commit": c.commit,
                "file": c.file_path,
                "group": _group(c.run_id),
                "model": c.model,
                "arch": ARCH[c.model],
                "gpu": GPU[c.gpu],
                "tp": c.tp,
                "dtype": "fp8" if fp8 else "bfloat16",
                "engine": "vllm",
                "engine_version": c.engine_version,
                "max_num_batched_tokens": _num(c.max_num_batched_tokens),
                "max_num_seqs": _num(c.max_num_seqs),
                "chunked_prefill": True,
                "prefix_caching": str(c.enable_prefix_caching).lower().startswith("true"),
                "gpu_memory_utilization": _num(c.gpu_memory_utilization) or 0.9,
                "block_size": 16,
                "max_model_len": _num(c.max_model_len),
                "dataset": c.dataset,
                "concurrency": conc,
                "request_rate": _num(c.request_rate),
                "num_prompts": prompts,
                "input_len_mean": _num(c.input_len_mean),
                "output_len_mean": _num(c.output_len_mean),
                "spec_method": "none",
                **{k: getattr(c, k) for k in FIGURES},
                "num_failed": (prompts - c.completed) if pd.notna(c.completed) else 0,
                "notes": (
                    f"{c.licence}; trust {c.trust}; "
                    + ("async_scheduling=True; " if str(c.async_scheduling).startswith("True") else "")
                    + f"{c.notes}"
                ),
            }
        )
    new = pd.DataFrame(rows)
    pd.concat([runs, new], ignore_index=True).to_csv(DIR / "runs.csv", index=False)
    print(f"added {len(new)} runs in {new.group.nunique()} groups: {new.gpu.value_counts().to_dict()}")


if __name__ == "__main__":
    main()
