"""Real against simulated for the scale validation (issue 30), with the real side's uncertainty.

For each policy and N, pooled over the seeds run: the violation rate of the measured responses,
real and simulated, with a bootstrap interval of the real rate over devices and seeds (a device's
responses are resampled together, within its seed), and WISP minus FCFS at the same N, real and
simulated, with its interval. Simulated sides: the recorded profile (`seed*/`) and, where it was
run, the deployed profile (`seed*-deployed/`). Writes summary.csv and wisp_vs_fcfs.csv here.

    python experiments/data/validation-scale/summarize.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
B = 2000  # bootstrap resamples


def responses(folder: Path, side: str) -> pd.DataFrame:
    """Measured responses of every point under ``folder`` (real or sim), tagged with policy and N."""
    rows = []
    for f in sorted(folder.glob(f"points/*/*/n*/{side}_responses.parquet")):
        r = pd.read_parquet(f, columns=["device", "violated", "measured"])
        r = r[r.measured]
        rows.append(r.assign(policy=f.parent.parent.name, devices=int(f.parent.name[1:]), seed=folder.name))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


def boot(r: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap violation rates of ``r``: devices resampled with their responses, per seed."""
    groups = [g.groupby("device").violated.agg(["sum", "count"]).to_numpy() for _, g in r.groupby("seed")]
    out = np.empty(B)
    for i in range(B):
        v = n = 0.0
        for g in groups:
            pick = g[rng.integers(0, len(g), len(g))]
            v += pick[:, 0].sum()
            n += pick[:, 1].sum()
        out[i] = v / n if n else np.nan
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    seeds = sorted(p for p in HERE.glob("seed*") if p.is_dir() and "-" not in p.name)
    real = pd.concat([responses(s, "real") for s in seeds], ignore_index=True)
    sims = {"recorded": pd.concat([responses(s, "sim") for s in seeds], ignore_index=True)}
    dep = [HERE / f"{s.name}-deployed" for s in seeds if (HERE / f"{s.name}-deployed").is_dir()]
    if dep:
        sims["deployed"] = pd.concat([responses(d, "sim").assign(seed=d.name[:5]) for d in dep])
    rows, draws = [], {}
    for (pol, n), r in real.groupby(["policy", "devices"]):
        draws[pol, n] = boot(r, rng)
        row = {"policy": pol, "devices": n, "seeds": r.seed.nunique(), "responses": len(r),
               "violation_real": r.violated.mean(),
               "real_lo": np.nanpercentile(draws[pol, n], 2.5), "real_hi": np.nanpercentile(draws[pol, n], 97.5)}  # fmt: skip
        for name, s in sims.items():
            m = s[(s.policy == pol) & (s.devices == n)]
            row[f"violation_sim_{name}"] = m.violated.mean() if len(m) else np.nan
            # a miss: outside the real interval widened by the target (0.05)
            row[f"miss_{name}"] = not (row["real_lo"] - 0.05 <= row[f"violation_sim_{name}"] <= row["real_hi"] + 0.05)
        rows.append(row)
    summary = pd.DataFrame(rows)
    summary.to_csv(HERE / "summary.csv", index=False)
    diff = []
    for n in sorted(real.devices.unique()):
        if ("wisp", n) not in draws or ("fcfs", n) not in draws:
            continue
        d = draws["wisp", n] - draws["fcfs", n]
        get = summary.set_index(["policy", "devices"])
        row = {"devices": n, "real": get.loc[("wisp", n), "violation_real"] - get.loc[("fcfs", n), "violation_real"],
               "real_lo": np.nanpercentile(d, 2.5), "real_hi": np.nanpercentile(d, 97.5)}  # fmt: skip
        for name in sims:
            row[f"sim_{name}"] = (
                get.loc[("wisp", n), f"violation_sim_{name}"] - get.loc[("fcfs", n), f"violation_sim_{name}"]
            )
        diff.append(row)
    pd.DataFrame(diff).to_csv(HERE / "wisp_vs_fcfs.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.round(3).to_string(index=False))
        print(pd.DataFrame(diff).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
