"""Real against simulated for the scale validation (issue 30), with the real side's uncertainty.

Every real run folder here (``seed0``, ``seed1``, ``seed0b``, ``seed0c``, ``seed1b``,
``pressure-seed0``, ``pressure-seed1``) holds points ``points/REGIME/POLICY/nN``; the folder's
simulated side priced the verifier with the recorded profile (``recorded``), and ``FOLDER-deployed``
re-simulated the same real points with the profile fitted on the deployment of that host
(``deployed``; see README.md), and ``FOLDER-deployed-before`` (host A) did so before the simulated
scheduler planned with the real server's profile (``before``). For each regime, policy, N and figure
(violation rate, goodput,
speed p10/p50, queue and verify p50/p90, batch size, cold share) the real value is the mean over
the seeds of each seed's value (as ``wispsim validate`` computes it), and its 95% interval comes
from a bootstrap over devices within each seed (a device's responses and rounds resampled
together), shifted onto that value. Needs each point's ``real_log.parquet`` (the rounds; not
shipped, ~1.3 MB a point). Writes here:

- ``errors.csv``: regime, policy, devices, metric, real, real_lo, real_hi, variant, sim, target,
  miss (a miss: the simulated value outside the real interval widened by the target: 0.05 on
  violation, 5% on goodput and verify p50; the other figures have no target and are judged on the
  plain interval);
- ``capacity.csv``: the largest N whose violation rate stays within epsilon (0.05), interpolated
  linearly between grid points (and from N = 0, violation 0, below the grid), real with its
  bootstrap interval and simulated (a miss: outside the interval widened by 10%);
- ``wisp_vs_fcfs.csv``: WISP's violation rate minus FCFS's at the same N, real with its interval
  and simulated;
- ``drift.csv``: the reference point (wisp, compute, N = 32, seed 0) each time it ran;
- ``speed_index.csv``: per real point in run order, logged batch time over a fixed yardstick's
  estimate (the host's speed as the engine saw it);
- ``violation_vs_n.png``: violation rate against N per regime and policy, real (with intervals)
  and simulated.

    python experiments/data/validation-scale/summarize.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
B = int(__import__("os").environ.get("BOOT", 1000))  # bootstrap resamples
EPSILON = 0.05
METRICS = (
    "violation_rate",
    "goodput_tps",
    "speed_p10",
    "speed_p50",
    "queue_p50_ms",
    "queue_p90_ms",
    "verify_p50_ms",
    "verify_p90_ms",
    "mean_batch_size",
    "cold_round_share",
)
TARGETS = {"violation_rate": ("abs", 0.05), "goodput_tps": ("rel", 0.05), "verify_p50_ms": ("rel", 0.05)}
POLICIES = ("wisp", "wisp-lru", "fcfs", "sled", "centralized")
# simulated sides: the folder's own (recorded profile), FOLDER-deployed (the host's deployed profile,
# planning with the profile the real server planned with), FOLDER-deployed-before (host A only: the
# deployed profile before server.planning_profile existed, the scheduler planning with it too),
# FOLDER-own (the profile fitted on that run's own batch log: own.py)
VARIANTS = {"recorded": "", "deployed": "-deployed", "before": "-deployed-before", "own": "-own"}


def is_real(p: Path) -> bool:
    """A folder of real runs (not a re-simulation of one: FOLDER-deployed*, FOLDER-own)."""
    return (p / "manifest.json").is_file() and "-deployed" not in p.name and not p.name.endswith("-own")


def real_folders() -> list[Path]:
    """The study's real folders (the reference points, ref-*, are drift.csv's)."""
    return sorted(p for p in HERE.iterdir() if is_real(p) and not p.name.startswith("ref-"))


def device_arrays(pt: Path) -> tuple[dict[str, float], list[dict[str, np.ndarray]]] | None:
    """The point's real figures (``done.json``) and, per device, what the bootstrap needs
    (centralized serving has no rounds: its goodput is the output of responses ending in the window)."""
    if not (pt / "real_responses.parquet").is_file():
        return None
    done = json.loads((pt / "done.json").read_text())
    sc = yaml.safe_load((pt / "scenario.yaml").read_text())
    w0 = sc["workload"]["warmup_s"]
    w1 = w0 + sc["workload"]["duration_s"]
    every = pd.read_parquet(pt / "real_responses.parquet")
    resp = every[every.measured]
    if (pt / "real_log.parquet").is_file():
        log = pd.read_parquet(pt / "real_log.parquet")
        batches = pd.read_parquet(pt / "real_batches.parquet", columns=["batch", "size"])
        log = log.merge(batches, on="batch", how="left")
        t0 = log.t_start.min() if "t_start" in log else 0.0
        rounds = log[log.measured]
        in_win = log[(log.t_end - t0 >= w0) & (log.t_end - t0 < w1)] if len(log) else log
    else:
        rounds = in_win = None
        t0 = every.t_start.min()
    devs = []
    for d in sorted(set(resp.device) | (set(rounds.device) if rounds is not None else set())):
        r = resp[resp.device == d]
        row = {"violated": r.violated.to_numpy(float), "speed": r.speed.to_numpy(float),
               "cold": np.array([r.cold_rounds.sum(), r.rounds.sum()], float)}  # fmt: skip
        if rounds is not None:
            q, g = rounds[rounds.device == d], in_win[in_win.device == d]
            row |= {"queue": q.queue_s.to_numpy(float) * 1e3, "verify": q.verify_s.to_numpy(float) * 1e3,
                    "size": q["size"].to_numpy(float), "committed": float(g.committed.sum())}  # fmt: skip
        else:
            e = every[every.device == d]
            ended = e[(e.t_end - t0 >= w0) & (e.t_end - t0 < w1)]
            row |= {"queue": np.empty(0), "verify": np.empty(0), "size": np.empty(0),
                    "committed": float(ended.output_len.sum())}  # fmt: skip
        devs.append(row)
    return {"span": w1 - w0, **done["real"]}, devs


def proxy(devs: list[dict[str, np.ndarray]], pick: np.ndarray, span: float) -> dict[str, float]:
    """The figures recomputed from the picked devices (the bootstrap's statistic)."""

    def cat(key: str) -> np.ndarray:
        return np.concatenate([devs[i][key] for i in pick]) if len(pick) else np.empty(0)

    def q(a: np.ndarray, p: float) -> float:
        return float(np.quantile(a, p)) if len(a) else np.nan

    v, s, qu, ve, sz = cat("violated"), cat("speed"), cat("queue"), cat("verify"), cat("size")
    cold = sum(devs[i]["cold"] for i in pick)
    return {
        "violation_rate": v.mean() if len(v) else np.nan,
        "goodput_tps": sum(devs[i]["committed"] for i in pick) / span,
        "speed_p10": q(s, 0.1),
        "speed_p50": q(s, 0.5),
        "queue_p50_ms": q(qu, 0.5),
        "queue_p90_ms": q(qu, 0.9),
        "verify_p50_ms": q(ve, 0.5),
        "verify_p90_ms": q(ve, 0.9),
        "mean_batch_size": sz.mean() if len(sz) else np.nan,
        "cold_round_share": cold[0] / cold[1] if cold[1] else np.nan,
    }


def boot_point(pt: Path, rng: np.random.Generator) -> tuple[dict[str, float], pd.DataFrame] | None:
    """(real figures, B bootstrap draws of each figure shifted onto them) for one real point."""
    got = device_arrays(pt)
    if got is None:
        return None
    real, devs = got
    full = proxy(devs, np.arange(len(devs)), real["span"])
    draws = pd.DataFrame([proxy(devs, rng.integers(0, len(devs), len(devs)), real["span"]) for _ in range(B)])
    for m in METRICS:
        draws[m] = draws[m] - full[m] + real[m]
    return real, draws


def sim_value(folder: Path, rel: Path, metric: str) -> float:
    f = folder / rel / "done.json"
    return float(json.loads(f.read_text())["sim"][metric]) if f.is_file() else np.nan


def collect(rng: np.random.Generator) -> tuple[pd.DataFrame, dict]:
    """One row per (regime, policy, N, seed): real figures, simulated ones per variant; and the
    bootstrap draws of each row."""
    rows, draws = [], {}
    for folder in real_folders():
        for done in sorted(folder.glob("points/*/*/n*/done.json")):
            pt = done.parent
            rel = pt.relative_to(folder)
            regime, policy, n = rel.parts[1], rel.parts[2], int(rel.parts[3][1:])
            seed = int(yaml.safe_load((pt / "scenario.yaml").read_text()).get("seed", 0))
            got = boot_point(pt, rng)
            if got is None:
                continue
            real, d = got
            key = (regime, policy, n, seed)
            draws[key] = d
            row = {"regime": regime, "policy": policy, "devices": n, "seed": seed, "folder": folder.name}
            for m in METRICS:
                row[m] = real[m]
                for variant, suffix in VARIANTS.items():
                    row[f"{m}:{variant}"] = sim_value(HERE / f"{folder.name}{suffix}", rel, m)
            rows.append(row)
    return pd.DataFrame(rows), draws


def pooled(per_seed: pd.DataFrame, draws: dict) -> tuple[pd.DataFrame, dict]:
    """Mean over seeds, real and simulated; pooled draws (mean over seeds of each draw)."""
    rows, pdraws = [], {}
    for (regime, policy, n), g in per_seed.groupby(["regime", "policy", "devices"], sort=False):
        d = sum(draws[regime, policy, n, s] for s in g.seed) / len(g)
        pdraws[regime, policy, n] = d
        row = {"regime": regime, "policy": policy, "devices": n, "seeds": len(g)}
        for c in per_seed.columns:
            if c.split(":")[0] in METRICS:
                row[c] = g[c].mean()
        rows.append(row)
    return pd.DataFrame(rows), pdraws


def is_miss(metric: str, sim: float, lo: float, hi: float) -> bool | None:
    if np.isnan(sim) or np.isnan(lo):
        return None
    kind, tol = TARGETS.get(metric, ("abs", 0.0))
    if kind == "rel":
        lo, hi = lo * (1 - tol), hi * (1 + tol)
    else:
        lo, hi = lo - tol, hi + tol
    return not (lo <= sim <= hi)


def capacity(ns: list[int], v: np.ndarray) -> float:
    """Largest N with violation <= epsilon, linear between grid points (below the grid: between
    no devices, no violations, and the first point; the grid's top N when every point is within)."""
    if np.isnan(v).any():
        return np.nan
    for i, (n, x) in enumerate(zip(ns, v, strict=True)):
        if x > EPSILON:
            n0, x0 = (ns[i - 1], v[i - 1]) if i else (0, 0.0)
            return n0 + (EPSILON - x0) / (x - x0) * (n - n0)
    return float(ns[-1])


def main() -> None:
    rng = np.random.default_rng(0)
    per_seed, draws = collect(rng)
    pool, pdraws = pooled(per_seed, draws)
    err = []
    for _, r in pool.iterrows():
        d = pdraws[r.regime, r.policy, r.devices]
        for m in METRICS:
            lo, hi = np.nanpercentile(d[m], [2.5, 97.5])
            for variant in VARIANTS:
                sim = r[f"{m}:{variant}"]
                err.append(
                    {
                        "regime": r.regime,
                        "policy": r.policy,
                        "devices": r.devices,
                        "seeds": r.seeds,
                        "metric": m,
                        "real": r[m],
                        "real_lo": lo,
                        "real_hi": hi,
                        "variant": variant,
                        "sim": sim,
                        "target": TARGETS.get(m, ("", 0.0))[1],
                        "miss": is_miss(m, sim, lo, hi),
                    }
                )
    errors = pd.DataFrame(err)
    errors.to_csv(HERE / "errors.csv", index=False)
    caps = []
    for (regime, policy), g in pool.groupby(["regime", "policy"], sort=False):
        g = g.sort_values("devices")
        ns = [int(n) for n in g.devices]
        curve = np.stack([pdraws[regime, policy, n].violation_rate.to_numpy() for n in ns], axis=1)
        cb = np.array([capacity(ns, c) for c in curve])
        lo, hi = np.nanpercentile(cb, [2.5, 97.5]) if np.isfinite(cb).any() else (np.nan, np.nan)
        row = {
            "regime": regime,
            "policy": policy,
            "grid": "/".join(map(str, ns)),
            "capacity_real": capacity(ns, g.violation_rate.to_numpy()),
            "real_lo": lo,
            "real_hi": hi,
        }
        for variant in VARIANTS:
            c = capacity(ns, g[f"violation_rate:{variant}"].to_numpy())
            row[f"capacity_{variant}"] = c
            row[f"miss_{variant}"] = None if np.isnan(c) or np.isnan(lo) else not (lo * 0.9 <= c <= hi * 1.1)
        caps.append(row)
    pd.DataFrame(caps).to_csv(HERE / "capacity.csv", index=False)
    diff = []
    for (regime, n), g in pool.groupby(["regime", "devices"]):
        if {"wisp", "fcfs"} - set(g.policy):
            continue
        w, f = (g[g.policy == p].iloc[0] for p in ("wisp", "fcfs"))
        d = pdraws[regime, "wisp", n].violation_rate - pdraws[regime, "fcfs", n].violation_rate
        lo, hi = np.nanpercentile(d, [2.5, 97.5])
        diff.append(
            {
                "regime": regime,
                "devices": n,
                "real": w.violation_rate - f.violation_rate,
                "real_lo": lo,
                "real_hi": hi,
                **{f"sim_{v}": w[f"violation_rate:{v}"] - f[f"violation_rate:{v}"] for v in VARIANTS},
            }
        )
    pd.DataFrame(diff).to_csv(HERE / "wisp_vs_fcfs.csv", index=False)
    figure(pool, pdraws)
    drift()
    speed_index()
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 500):
        v = (
            errors[errors.metric == "violation_rate"]
            .pivot_table(
                index=["regime", "policy", "devices", "real", "real_lo", "real_hi"],
                columns="variant",
                values="sim",
            )
            .reset_index()
        )
        print(v.round(3).to_string(index=False))
        print(pd.DataFrame(caps).round(1).to_string(index=False))
        print(pd.DataFrame(diff).round(3).to_string(index=False))
        miss = errors.dropna(subset=["miss"]).groupby(["variant", "metric"]).miss.agg(["sum", "count"])
        print(miss.to_string())


def drift() -> None:
    """The same point (wisp, compute, N = 32, seed 0) each time it ran: host A's first run, and
    host B's reference runs before and after the rest of its runs."""
    rows = []
    for folder, label in (
        ("seed0", "host A, first runs"),
        ("ref-start", "host B, before its runs"),
        ("ref-end", "host B, after its runs"),
    ):
        f = HERE / folder / "points/compute/wisp/n32/done.json"
        if f.is_file():
            r = json.loads(f.read_text())["real"]
            rows.append(
                {
                    "run": label,
                    "folder": folder,
                    "violation": round(r["violation_rate"], 3),
                    "goodput": round(r["goodput_tps"], 1),
                    "verify p50 ms": round(r["verify_p50_ms"], 1),
                    "queue p50 ms": round(r["queue_p50_ms"], 1),
                    "batch": round(r["mean_batch_size"], 2),
                }
            )
    pd.DataFrame(rows).to_csv(HERE / "drift.csv", index=False)


def speed_index() -> None:
    """The engine's speed at every real point, in run order: the median over the point's batches
    of the logged batch time over a fixed yardstick's estimate of it (the recorded profile for
    verification batches, host B's steps profile for centralized engine steps). Same yardstick
    everywhere, so the index moves only with the host (and the batches' shapes)."""
    from wispsim.model.profiles import load_profile

    yard = {
        "verify": load_profile("cpu-vllm-mini-inproc").estimator,
        "step": load_profile("cpu-vllm-mini-steps-hostb").estimator,
    }
    rows = []
    for folder in sorted(p for p in HERE.iterdir() if is_real(p)):
        man = json.loads((folder / "manifest.json").read_text())
        order = 0
        for regime in man["regimes"]:
            for policy in man["policies"]:
                for n in man["devices"]:
                    f = folder / "points" / regime / policy / f"n{n}" / "server_batches.parquet"
                    if not f.is_file():
                        continue
                    b = pd.read_parquet(f)
                    kind = "step" if policy.startswith("centralized") else "verify"
                    est = yard[kind]
                    t = np.array(
                        [
                            est.batch(r.n_linear, r.n_interactions, r.n_cached, r.size, r.size)
                            for r in b.itertuples()
                        ]
                    )
                    ratio = b.latency.to_numpy() / t
                    order += 1
                    rows.append(
                        {
                            "folder": folder.name,
                            "started": man["date"],
                            "order": order,
                            "regime": regime,
                            "policy": policy,
                            "devices": n,
                            "yardstick": kind,
                            "batches": len(b),
                            "index_p50": round(float(np.median(ratio)), 3),
                            "index_p25": round(float(np.quantile(ratio, 0.25)), 3),
                            "index_p75": round(float(np.quantile(ratio, 0.75)), 3),
                        }
                    )
    pd.DataFrame(rows).sort_values(["started", "order"]).to_csv(HERE / "speed_index.csv", index=False)


def figure(pool: pd.DataFrame, pdraws: dict) -> None:
    """``violation_vs_n.png``: wispsim's validation figure, the real band being the bootstrap
    interval and each simulated side a line (the recorded profile as ``sim``)."""
    from wispsim.plots import validation_plot

    rows = []
    for r in pool.to_dict("records"):
        v = pdraws[r["regime"], r["policy"], r["devices"]].violation_rate
        sims = {"sim": r["violation_rate:recorded"]}
        sims |= {f"sim:{s} profile": r[f"violation_rate:{s}"] for s in ("deployed", "own")}
        key = {"regime": r["regime"], "policy": r["policy"], "devices": r["devices"]}
        rows.append({**key, "metric": "violation_rate", "real": r["violation_rate"], **sims})
        rows.append({**key, "metric": "violation_lo", "real": np.nanpercentile(v, 2.5)})
        rows.append({**key, "metric": "violation_hi", "real": np.nanpercentile(v, 97.5)})
    table = pd.DataFrame(rows).assign(sim=lambda t: t.sim.astype(float))
    validation_plot(
        table, HERE / "violation_vs_n.png", interval="95% bootstrap", sim_label="simulated, recorded profile"
    )


if __name__ == "__main__":
    main()
