"""Record the same prompts with ``--engine hf`` and ``--engine vllm`` (greedy) and compare.

    python scripts/compare_trace_engines.py --draft DRAFT --target TARGET \
        --prompts traces/prompts/code.jsonl --limit 8 --max-new-tokens 96 --work compare/

Both traces go to ``--work`` (``hf.parquet``, ``vllm.parquet``; resumable like any recording).
Positions are matched by (sample, position) where both engines committed the same token (the
responses agree up to there). Printed and written to ``WORK/report.json``: how often the
responses' tokens and the greedy-agreement flags match, the largest absolute difference of each
column vLLM computes exactly, and the mean absolute and mean relative error of the columns it
approximates from the draft's top K (see ``wispsim/measure/trace/vllm_record.py``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.measure.trace import record_trace, record_trace_vllm
from wispsim.measure.trace.vllm_record import APPROXIMATED, EXACT
from wispsim.provenance import module_versions


def compare(hf: pd.DataFrame, vl: pd.DataFrame) -> dict[str, Any]:
    """The figures of the module docs, from the two traces' rows."""
    both = hf.merge(vl, on=["sample_id", "position"], suffixes=("_hf", "_vl"))
    same = both.token_id_hf == both.token_id_vl
    # a response diverges for good at its first differing token: keep the positions before it
    before = same.astype(int).groupby(both.sample_id).cummin().astype(bool)
    m = both[before]
    report: dict[str, Any] = {
        "positions_hf": len(hf),
        "positions_vllm": len(vl),
        "positions_compared": len(m),
        "token_match_rate": float(same.mean()) if len(both) else float("nan"),
        "greedy_agree_match_rate": float((m.greedy_agree_hf == m.greedy_agree_vl).mean()),
        "accept_match_rate": float((m.accept_hf == m.accept_vl).mean()),
        "exact_max_abs_diff": {},
        "approximated": {},
    }
    for col in EXACT.split(","):
        a, b = m[f"{col}_hf"].astype(float), m[f"{col}_vl"].astype(float)
        report["exact_max_abs_diff"][col] = float(np.abs(a - b).max())
    for col in APPROXIMATED.split(","):
        a, b = m[f"{col}_hf"].astype(float), m[f"{col}_vl"].astype(float)
        report["approximated"][col] = {
            "mean_abs_error": float(np.abs(a - b).mean()),
            "mean_relative_error": float((np.abs(a - b) / np.maximum(np.abs(a), 1e-12)).mean()),
            "mean_signed_error": float((b - a).mean()),
            "corr": float(np.corrcoef(a, b)[0, 1]) if len(m) > 1 else float("nan"),
        }
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--work", type=Path, default=Path("compare-trace-engines"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    common: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "limit": args.limit}
    seconds = {}
    for engine, record in (("hf", record_trace), ("vllm", record_trace_vllm)):
        extra: dict[str, Any] = {"top_k": args.top_k} if engine == "vllm" else {}
        t0 = time.perf_counter()
        record(args.draft, args.target, args.prompts, args.work / f"{engine}.parquet", **common, **extra)
        seconds[engine] = round(time.perf_counter() - t0, 1)
    hf = pd.read_parquet(args.work / "hf.parquet")
    vl = pd.read_parquet(args.work / "vllm.parquet")
    report = {
        "command": " ".join(["python", *sys.argv]),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": {"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()},
        "versions": module_versions(("torch", "transformers", "vllm", "numpy")),
        "draft": args.draft,
        "target": args.target,
        "prompts": str(args.prompts),
        "limit": args.limit,
        "max_new_tokens": args.max_new_tokens,
        "top_k": args.top_k,
        "record_seconds": seconds,  # vllm includes starting its engines (unless resumed)
        **compare(hf, vl),
    }
    (args.work / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"positions compared: {report['positions_compared']} (hf {len(hf)}, vllm {len(vl)})")
    print(f"token match rate:         {report['token_match_rate']:.4f}")
    print(f"greedy_agree match rate:  {report['greedy_agree_match_rate']:.4f}")
    print("exact columns, max |hf - vllm|:")
    for col, d in report["exact_max_abs_diff"].items():
        print(f"  {col:26s} {d:.3g}")
    print(f"approximated columns (top {args.top_k}):")
    for col, d in report["approximated"].items():
        print(
            f"  {col:10s} mean abs {d['mean_abs_error']:.4g}  mean rel {d['mean_relative_error']:.4g}"
            f"  mean signed {d['mean_signed_error']:+.4g}  corr {d['corr']:.4f}"
        )
    print(f"report: {args.work / 'report.json'}")


if __name__ == "__main__":  # vLLM starts engine processes: the spawn guard
    main()
