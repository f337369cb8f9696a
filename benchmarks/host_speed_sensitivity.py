"""How much of a held-out regime's error could the serving host's CPU speed explain?

Simulates the public runs of the given groups (``experiments/data/public/runs.csv``) with the
shipped calibration but ``host_cpu_speed`` set to each given value, and prints the median
absolute and signed errors of mean TPOT, mean TTFT and output throughput. A diagnostic, not a
fit: nothing is written, and a speed chosen on held-out runs would not be held out.

    python benchmarks/host_speed_sensitivity.py --groups gpustack-qwen3-14b-a100,gpustack-qwen3-32b-a100 \\
        --speeds 4.36,3,2,1.5,1,0.7
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from wispsim.study import public

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "experiments" / "data" / "public"
METRICS = ("tpot_mean_ms", "ttft_mean_ms", "output_throughput_tok_s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", required=True, help="comma-separated run groups (runs.csv's group)")
    ap.add_argument("--speeds", default="4.36,2,1,0.7", help="host_cpu_speed values to try")
    args = ap.parse_args()
    runs = pd.read_csv(FOLDER / "runs.csv")
    groups = args.groups.split(",")
    sel = runs[runs.group.isin(groups)]
    if sel.empty:
        raise SystemExit(f"--groups: no run in {', '.join(groups)}; groups are runs.csv's 'group' column")
    shipped = yaml.safe_load((ROOT / "wispsim" / "data" / "roofline.yaml").read_text())["vllm"]
    base = {"overhead_ms": shipped["overhead_ms"]}
    print(f"{len(sel)} runs; shipped host_cpu_speed {shipped['host_cpu_speed']}")
    for speed in (float(s) for s in args.speeds.split(",")):
        errs: dict[str, list[float]] = {m: [] for m in METRICS}
        for _, row in sel.iterrows():
            sim = public.simulate_run(row, str(FOLDER), {**base, "host_cpu_speed": speed})
            for m in METRICS:
                if row[m] and row[m] > 0:
                    errs[m].append(100.0 * (sim[m] / row[m] - 1.0))
        cells = [f"{m} {np.median(np.abs(v)):.1f}% ({np.median(v):+.1f})" for m, v in errs.items() if v]
        print(f"host_cpu_speed {speed:g}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
