"""Re-time a deployment's logged batches on the engine alone, to see what the deployment added.

`wispsim serve` logs every verification batch it ran with the tokens vLLM forwarded and read
from its cache, and the batch's wall time under the real load (the swarm, the HTTP server and
the engine sharing the machine). This script turns a sample of those batches into a profile plan
(``plan``), which `wispsim profile record --engine vllm` times on an otherwise idle engine, and
then compares the two timings batch by batch (``compare``):

    python scripts/retime_deployment.py plan profiles/data/NAME.csv --sample 60 --out retime.plan.csv
    wispsim profile record --plan retime.plan.csv --out retime.csv --engine vllm \
        --arch smollm2-135m --random-weights --dtype float32 --kv-cache-gib 2
    python scripts/retime_deployment.py compare profiles/data/NAME.csv retime.csv PROFILE

``NAME.csv`` is the measurement file `wispsim profile fit FOLDER` writes from a deployment's
batch log. ``compare`` prints, per batch size, the median of deployed / isolated wall time and of
each against the estimate of ``PROFILE`` (the offline profile).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

PLAN_COLUMNS = ["config_id", "split", "category", "seed", "batch_size", "l_new", "l_cached",
                "n_linear", "n_interactions", "n_cached", "max_l_total"]  # fmt: skip


def plan(data: str, sample: int, out: str, seed: int) -> None:
    df = pd.read_csv(data, dtype={"l_new": str, "l_cached": str, "config_id": str})
    take = df.sample(n=min(sample, len(df)), random_state=seed).sort_values("config_id")
    take = take.assign(seed=seed, split="test", category="deployment-retime")
    take[PLAN_COLUMNS].to_csv(out, index=False)
    print(f"{len(take)} of {len(df)} logged batches -> {out}")


def compare(data: str, retimed: str, profile: str) -> None:
    from wispsim.model.profiles import load_profile

    est = load_profile(profile).estimator
    dep = pd.read_csv(data, dtype={"config_id": str}).set_index("config_id")
    iso = pd.read_csv(retimed, dtype={"config_id": str})
    iso = iso[iso.status == "ok"].set_index("config_id")
    both = iso.join(dep[["latency_s"]].rename(columns={"latency_s": "deployed_s"}), how="inner")
    both["estimate_s"] = [
        est.batch(int(r.n_linear), int(r.n_interactions), int(r.n_cached), int(r.batch_size))
        for r in both.itertuples()
    ]
    both["deployed/isolated"] = both.deployed_s / both.latency_s
    both["isolated/estimate"] = both.latency_s / both.estimate_s
    both["deployed/estimate"] = both.deployed_s / both.estimate_s
    cols = ["deployed/isolated", "isolated/estimate", "deployed/estimate"]
    table = both.groupby("batch_size")[cols].median()
    table.insert(0, "batches", both.groupby("batch_size").size())
    table.loc["all"] = [len(both), *(float(np.median(both[c])) for c in cols)]
    print(table.round(3).to_string())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("data")
    p.add_argument("--sample", type=int, default=60)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("compare")
    c.add_argument("data")
    c.add_argument("retimed")
    c.add_argument("profile")
    a = ap.parse_args()
    if a.cmd == "plan":
        plan(a.data, a.sample, a.out, a.seed)
    else:
        compare(a.data, a.retimed, a.profile)


if __name__ == "__main__":
    main()
