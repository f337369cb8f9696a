"""Add the public A100 runs (experiments/data/public/candidates, found 2026-11-26) to runs.csv.

Two sources, both vLLM V1 serving one model on one A100 80GB, both never used by any fit here:

- gpustack/gpustack @ 47277d79f4a5bae12a2d25e9ecbed2a2177a5f2d (Apache-2.0),
  docs/performance-lab/qwen3-{14b,32b}/a100.md: vLLM 0.11.0 defaults, `vllm bench serve` with every
  request sent at once (ShareGPT and random datasets);
- dennislee22/vLLM-benchmarking @ b474d1e053c35c9aef8c02aae4efbc0d8675f033 (no licence: only the
  figures are shipped, with the citation), README.md and log/: Qwen2-7B-Instruct on vLLM 0.10.1.1,
  random 1,024 in / 1,024 out, 1 to 1,000 prompts at once, at gpu_memory_utilization 0.25 and 0.5
  (the logs give the KV cache: 93,872 and 464,848 tokens).

Only the rows graded "high" (complete command lines, GPU stated) are taken. Run once:
    python scripts/data/add_public_a100.py
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from wispsim.analysis.token_latency import TOKEN_LATENCY_COLUMNS

DIR = Path(__file__).resolve().parents[2] / "experiments" / "data" / "public"
# the figures copied: vllm bench serve's latencies (as analysis.token_latency names them) and throughputs
FIGURES = [c for c in TOKEN_LATENCY_COLUMNS if c != "output_throughput_tps"] + [
    "output_throughput_tok_s",
    "request_throughput",
    "duration_s",
]
ARCH = {"Qwen/Qwen3-14B": "qwen3-14b", "Qwen/Qwen3-32B": "qwen3-32b", "Qwen/Qwen2-7B-Instruct": "qwen2-7b"}


def _int(text: object) -> float | None:
    m = re.match(r"\s*([0-9.]+)", str(text))
    return float(m.group(1)) if m else None


def main() -> None:
    cand = pd.read_csv(DIR / "candidates" / "runs_candidates.csv")
    cand = cand[(cand.trust == "high") & cand.model.isin(ARCH) & (cand.tp == 1)]
    runs = pd.read_csv(DIR / "runs.csv")
    if runs.run_id.isin(cand.run_id).any():
        print("already added")
        return
    rows = []
    for c in cand.itertuples():
        dennis = "dennislee" in c.source_repo
        group = re.sub(r"-n\d+$", "", c.run_id) if dennis else f"gpustack-{ARCH[c.model]}-a100"
        rows.append(
            {
                "run_id": c.run_id,
                "source": c.source_repo,
                "commit": c.commit,
                "file": c.file_path,
                "group": group,
                "model": c.model,
                "arch": ARCH[c.model],
                "gpu": "a100-80gb",
                "tp": 1,
                "dtype": "bfloat16",
                "engine": "vllm",
                "engine_version": c.engine_version,
                "max_num_batched_tokens": _int(c.max_num_batched_tokens) or 2048,
                "max_num_seqs": _int(c.max_num_seqs) or 256,
                "chunked_prefill": True,
                # dennislee's logs show 40-55% prefix-cache hits: the same seeded prompts were sent again
                # by each larger run to a server that kept its cache; the simulation runs each alone
                # (no hits), so it is pessimistic there (README)
                "prefix_caching": False,
                "gpu_memory_utilization": float(_int(c.gpu_memory_utilization) or 0.9),
                "block_size": 16,
                "max_model_len": _int(c.max_model_len),
                "dataset": c.dataset,
                "concurrency": c.max_concurrency,
                "request_rate": c.request_rate,
                "num_prompts": c.num_prompts,
                "input_len_mean": c.input_len_mean,
                "output_len_mean": c.output_len_mean,
                "spec_method": "none",
                **{k: getattr(c, k) for k in FIGURES},
                "num_failed": (c.num_prompts - c.completed) if pd.notna(c.completed) else 0,
                "notes": f"{c.licence}; {c.notes}",
            }
        )
    new = pd.DataFrame(rows)
    pd.concat([runs, new], ignore_index=True).to_csv(DIR / "runs.csv", index=False)
    mem = pd.read_csv(DIR / "memory.csv")
    kv = []
    for g, d in new[new.source.str.contains("dennislee")].groupby("group"):
        tokens = 93872 if d.gpu_memory_utilization.iloc[0] == 0.25 else 464848
        kv.append(
            {
                "group": g,
                "gpu": "a100-80gb",
                "tp": 1,
                "model": "Qwen/Qwen2-7B-Instruct",
                "dtype": "bfloat16",
                "kv_tokens": tokens,
                "gpu_memory_utilization": d.gpu_memory_utilization.iloc[0],
                "source_line": f"GPU KV cache size: {tokens:,} tokens",
                "file": d.file.iloc[0],
            }
        )
    pd.concat([mem, pd.DataFrame(kv)], ignore_index=True).to_csv(DIR / "memory.csv", index=False)
    print(f"added {len(new)} runs in {new.group.nunique()} groups")


if __name__ == "__main__":
    main()
