"""Peak memory of one simulation as the fleet and the measurement window grow.

Each configuration runs in a fresh child process (so peak RSS is its own): the 7-group mixed fleet
of ``scenarios/fleet-2000.yaml`` scaled to N devices on N/100 replicas (affinity router, policy
wisp), a ``--window`` measurement window, then ``summarize`` and ``replica_summary`` of its
records, as ``wispsim run`` does. It prints rounds, wall time and the child's peak RSS.

    python benchmarks/bench_memory.py                  # N = 500, 2,000, 10,000 x window 30, 120 s
    python benchmarks/bench_memory.py --devices 2000 --windows 30
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def one(devices: int, window: float, policy: str) -> dict[str, object]:
    """Run one configuration in this process and return its figures."""
    from wispsim.analysis.metrics import replica_summary, summarize
    from wispsim.model.fleet import fleet_size
    from wispsim.sim.scenarios import load_scenario, resolve_server
    from wispsim.sim.simulation import simulate

    data = yaml.safe_load((ROOT / "scenarios" / "fleet-2000.yaml").read_text())
    groups = data["devices"]["groups"]
    total = sum(g["count"] for g in groups)
    counts = [g["count"] * devices // total for g in groups]
    for i in range(devices - sum(counts)):  # remainders to the first groups
        counts[i % len(counts)] += 1
    for g, c in zip(groups, counts, strict=True):
        g["count"] = c
    replicas = max(1, devices // 100)
    data |= {"policy": policy, "server": {"replicas": replicas}, "workload": {"duration_s": window}}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(data, f)
    sc = load_scenario(f.name)
    os.unlink(f.name)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    res = simulate(resolve_server(sc), devices=fleet_size(sc))
    sim_s = time.perf_counter() - t0
    summary = summarize(res)
    replica_summary(res)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spilled = getattr(getattr(res, "round_records", None), "spilled", False)
    return {
        "devices": res.devices,
        "replicas": replicas,
        "window_s": window,
        "sim_end_s": res.sim_end,
        "rounds": len(res.round_records) if hasattr(res, "round_records") else len(res.rounds),
        "sim_wall_s": sim_s,
        "total_wall_s": time.perf_counter() - t0,
        "base_rss_mb": base / 1024,
        "peak_rss_mb": peak / 1024,
        "spilled": bool(spilled),
        "violation": float(summary.violation_rate.iloc[-1]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="500,2000,10000", help="comma-separated fleet sizes")
    ap.add_argument("--windows", default="30,120", help="comma-separated measurement windows (s)")
    ap.add_argument("--policy", default="wisp")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # N,window: run in this process, print JSON
    args = ap.parse_args()
    if args.one:
        n, w = args.one.split(",")
        print(json.dumps(one(int(n), float(w), args.policy)))
        return
    cols = ("devices", "replicas", "window s", "simulated s", "rounds", "sim wall s", "peak RSS MB")
    cols = (*cols, "bytes/round")
    print("| " + " | ".join((*cols, "spilled")) + " |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for w in (float(x) for x in args.windows.split(",")):
        for n in (int(x) for x in args.devices.split(",")):
            print(f"  running N={n:,}, window {w:g} s ...", file=sys.stderr, flush=True)
            out = subprocess.run(
                [sys.executable, __file__, "--one", f"{n},{w}", "--policy", args.policy],
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode:
                print(f"| {n:,} | | {w:g} | failed: {out.stderr.strip().splitlines()[-1:]} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            per = (r["peak_rss_mb"] - r["base_rss_mb"]) * 2**20 / max(1, r["rounds"])
            print(
                f"| {r['devices']:,} | {r['replicas']} | {w:g} | {r['sim_end_s']:.0f} | {r['rounds']:,} | "
                f"{r['sim_wall_s']:.1f} | {r['peak_rss_mb']:,.0f} | {per:,.0f} | "
                f"{'yes' if r['spilled'] else 'no'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
