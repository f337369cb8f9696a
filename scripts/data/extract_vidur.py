"""Extract the figures wispsim uses from Vidur's public profiling data (microsoft/vidur, MIT).

Vidur (Agrawal et al., MLSys 2024) ships per-operation GPU timings of real models' layers measured
with vLLM-style kernels (``data/profiling/compute/<gpu>/<model>/mlp.csv``: the median time of each
linear layer at each token count and tensor-parallel degree) and NCCL all-reduce timings
(``data/profiling/network/<setup>/all_reduce.csv``). This script reads them from a snapshot's git
objects and writes the columns wispsim fits (``experiments/data/gpu/vidur/``); only figures are
shipped, with the citation.

    python scripts/data/extract_vidur.py /path/to/vidur.git COMMIT
"""

from __future__ import annotations

import io
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd

OPS = {"attn_pre_proj": "qkv", "attn_post_proj": "o", "mlp_up_proj": "gate_up", "mlp_down_proj": "down"}
# the elementwise kernels of a layer (RMSNorm twice, rotary embedding, SiLU-and-multiply, residual add)
ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
TOKENS = {1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096}
OUT = Path(__file__).resolve().parents[2] / "experiments" / "data" / "gpu" / "vidur"


def show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", repo, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def main(repo: str, commit: str) -> None:
    files = subprocess.run(
        ["git", "--git-dir", repo, "ls-tree", "-r", "--name-only", commit, "data/profiling"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    rows = []
    elem = []
    for f in files:
        parts = f.split("/")
        if parts[2] != "compute" or parts[-1] != "mlp.csv":
            continue
        gpu, model = parts[3], "/".join(parts[4:-1])
        d = pd.read_csv(io.StringIO(show(repo, commit, f)))
        d = d[d.num_tokens.isin(TOKENS)]
        # some token counts were profiled twice (2,048 and 4,096): one row each, the medians' median
        d = d.groupby(["num_tokens", "num_tensor_parallel_workers"], as_index=False).median(numeric_only=True)
        for op, name in OPS.items():
            col = f"time_stats.{op}.median"
            if col not in d:
                continue
            part = d[
                [
                    "num_tokens",
                    "num_tensor_parallel_workers",
                    "n_embd",
                    "n_expanded_embd",
                    "n_head",
                    "n_kv_head",
                    "use_gated_mlp",
                    col,
                ]
            ].rename(columns={col: "median_ms", "num_tensor_parallel_workers": "tp"})
            part.insert(0, "op", name)
            part.insert(0, "model", model)
            part.insert(0, "gpu", gpu)
            rows.append(part)
        ew = [f"time_stats.{o}.median" for o in ELEMENTWISE]
        if not set(ew) <= set(d.columns):  # a parallel-block model (Phi-2): not a Llama layer
            continue
        part = d[["num_tokens", "num_tensor_parallel_workers", "n_embd", "n_expanded_embd"]].copy()
        part["seconds"] = d[ew].sum(axis=1) / 1e3
        part = part.rename(columns={"num_tokens": "n", "num_tensor_parallel_workers": "tp"})
        part.insert(0, "model", model)
        part.insert(0, "gpu", gpu)
        elem.append(part)
    gemm = pd.concat(rows).sort_values(["gpu", "model", "tp", "op", "num_tokens"])
    ar = []
    for f in files:
        parts = f.split("/")
        if parts[2] == "network" and parts[-1] == "all_reduce.csv":
            d = pd.read_csv(io.StringIO(show(repo, commit, f)))
            d = d[d.collective == "all_reduce"]
            d = d.groupby(["num_workers", "devices_per_node", "size"], as_index=False)[
                "time_stats.all_reduce.median"
            ].median()
            d = d.rename(columns={"time_stats.all_reduce.median": "median_ms", "size": "bytes"})
            d.insert(0, "setup", parts[3])
            ar.append(d)
    OUT.mkdir(parents=True, exist_ok=True)
    gemm.to_csv(OUT / "gemm.csv", index=False)
    pd.concat(elem).sort_values(["gpu", "model", "tp", "n"]).to_csv(OUT / "elementwise.csv", index=False)
    ar = pd.concat(ar)
    ar = ar[(ar.num_workers == ar.devices_per_node) & (ar.bytes <= 64 * 2**20)]  # one node, up to 64 MiB
    sizes = sorted(set(ar.bytes))
    near = {min(sizes, key=lambda s: abs(math.log(s / 2**e))) for e in range(11, 27)}  # ~powers of two
    ar[ar.bytes.isin(near)].to_csv(OUT / "all_reduce.csv", index=False)
    print(f"{len(gemm)} GEMM rows, {sum(map(len, ar))} all-reduce rows -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
