"""NCCL all-reduce by message size and GPU count, fitted on Vidur's public measurements (issue 45).

``experiments/data/gpu/vidur/all_reduce.csv`` holds NCCL all-reduce medians on one node (A100 and
H100 DGX boards, whose GPUs meet at NVSwitches; 2, 4 and 8 GPUs; messages of 2 KB-64 MB). Where the
message is large enough for bandwidth to bind (4 MB and more), a ring all-reduce of ``B`` bytes over
``n`` GPUs moves ``2 (n - 1) / n x B`` bytes through each GPU's link, so::

    t = latency + 2 (n - 1) / n x B / (link_gbs x efficiency)

is fitted per board and GPU count (least squares): ``latency`` is NCCL's fixed cost at that size
(its protocol and launch), ``efficiency`` the fraction of the datasheet link bandwidth (gpus.yaml
``link_gbs``) its ring reaches (nccl-tests' "bus bandwidth" over the datasheet). Below 4 MB the
medians are launch-bound and noisy (7-60 us) and vLLM does not use NCCL there anyway (its custom
all-reduce: ``wispsim/data/interconnects.yaml``).

    python -m wispsim.study.allreduce_fit [--write]

prints the fit and, with ``--write``, stores it as the ``nccl`` entries of the two NVLink kinds in
``wispsim/data/interconnects.yaml``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from wispsim.paths import data_dir
from wispsim.study.gpu_kernels import experiments_gpu_dir
from wispsim.tabular import numeric_column, read_table

# which interconnect kind each measured board is, and its datasheet link bandwidth (GB/s, one way)
BOARDS = {"a100_dgx": ("nvlink3", 300.0), "h100_dgx": ("nvlink4", 450.0)}
MIN_BYTES = 4 * 2**20


def fit(path: Path | None = None) -> pd.DataFrame:
    """Per board and GPU count: NCCL's latency (us) and link efficiency, and the fit's largest
    relative error over the messages it used."""
    path = path or experiments_gpu_dir() / "vidur" / "all_reduce.csv"
    d = read_table(path, kind="csv", columns=("setup", "num_workers", "bytes", "median_ms"))
    for c in ("num_workers", "bytes", "median_ms"):
        d[c] = numeric_column(d, c, str(path), lo=0)
    rows = []
    for (setup, n), g in d[d["setup"].isin(BOARDS) & (d["bytes"] >= MIN_BYTES)].groupby(
        ["setup", "num_workers"]
    ):
        kind, link = BOARDS[str(setup)]
        x = g["bytes"].to_numpy(float) * 2 * (n - 1) / n
        y = g["median_ms"].to_numpy(float) / 1e3
        (latency, per_byte), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(x), x]), y, rcond=None)
        err = np.abs((latency + per_byte * x) / y - 1)
        rows.append({"setup": setup, "interconnect": kind, "gpus": int(n), "messages": len(g),
                     "latency_us": 1e6 * latency, "efficiency": 1 / per_byte / (link * 1e9),
                     "max_error": float(err.max())})  # fmt: skip
    return pd.DataFrame(rows)


def write(table: pd.DataFrame) -> Path:
    """Store the fit as the ``nccl`` entries of ``interconnects.yaml`` (the rest kept as it is)."""
    path = data_dir() / "interconnects.yaml"
    text = path.read_text()
    header = "".join(ln for ln in text.splitlines(keepends=True) if ln.startswith("#"))
    data = yaml.safe_load(text)
    for kind, g in table.groupby("interconnect"):
        data[kind]["nccl"] = {
            int(r.gpus): {
                "latency_us": round(float(r.latency_us), 1),
                "efficiency": round(float(r.efficiency), 3),
            }
            for r in g.itertuples()
        }
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=100))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="store the fit in wispsim/data/interconnects.yaml")
    args = ap.parse_args(argv)
    table = fit()
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.write:
        print(f"wrote {write(table)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
