"""What every serving path writes, for telling whether a refactor changed any shipped output.

``run``: runs a fixed set of small commands -- ``wispsim run`` for every policy and the server
options that change a run (resident verifier, host CPU, async scheduling, the front end, a shared
prefix, several replicas), ``wispsim replay`` of a log under every policy, ``wispsim bench`` in a few
settings and a small ``sweep`` -- into a folder. ``compare A B``: every table the two folders share,
cell by cell (Parquet and CSV read as tables; JSON with dates and wall times left out), and which
files one has and the other lacks. Used before and after a change (issue 43: "shipped outputs are
byte-identical except what a fix changes")::

    python benchmarks/ab_outputs.py run /tmp/before      # on the old tree
    python benchmarks/ab_outputs.py run /tmp/after       # on the new one
    python benchmarks/ab_outputs.py compare /tmp/before /tmp/after

About 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

QUICK = ["--set", "workload.warmup_s=5", "--set", "workload.duration_s=30"]
RUNS = {
    "wisp": ["--policy", "wisp", "--devices", "20", "--classes", "4"],
    "fcfs": ["--policy", "fcfs", "--devices", "20", "--classes", "4"],
    "sled": ["--policy", "sled", "--devices", "10", "--classes", "2"],
    "wisp-lru": ["--policy", "wisp-lru", "--devices", "20", "--classes", "4"],
    "wisp-resident": ["--policy", "wisp", "--devices", "20", "--classes", "4",
                      "--set", "server.verifier.kind=resident"],
    "wisp-host": ["--policy", "wisp", "--devices", "20", "--classes", "4", "--set", "server.host.cpu=on",
                  "--set", "server.engine.async_scheduling=true", "--set", "server.host.api_server_count=2"],
    "wisp-replicas": ["--policy", "wisp", "--devices", "40", "--classes", "4", "--set", "server.replicas=2"],
    "centralized": ["--policy", "centralized", "--devices", "40", "--classes", "4"],
    "centralized-front": ["--policy", "centralized", "--devices", "40", "--classes", "4",
                          "--set", "server.host.frontend=true", "--set", "workload.shared_prefix_tokens=100",
                          "--set", "server.engine.async_scheduling=true"],
    "centralized-host": ["--policy", "centralized", "--devices", "40", "--classes", "4",
                         "--set", "server.host.cpu=on", "--set", "server.profile=h100-qwen3-32b"],
    "centralized-sd": ["--policy", "centralized-sd", "--devices", "40", "--classes", "4"],
    "centralized-replicas": ["--policy", "centralized", "--devices", "60", "--classes", "4",
                             "--set", "server.replicas=2"],
}  # fmt: skip
REPLAYS = ["wisp", "fcfs", "sled", "centralized", "centralized-sd"]
BENCHES = {
    "bench-a100": ["--model", "qwen3-32b", "--gpu", "a100-80gb", "--num-prompts", "200"],
    "bench-h100-rate": ["--model", "qwen3-14b", "--gpu", "h100-80gb", "--num-prompts", "300",
                        "--request-rate", "8", "--random-prefix-len", "100"],
    "bench-sync-conc": ["--model", "qwen3-32b", "--gpu", "h100-80gb", "--num-prompts", "200",
                        "--max-concurrency", "16", "--no-async-scheduling", "--no-enable-prefix-caching"],
}  # fmt: skip
SWEEP = ["--policy", "wisp", "--classes", "8", "--devices", "20:60:20", "--seeds", "1", "--jobs", "1"]
VOLATILE = {  # what differs from run to run whatever the code
    "commit",
    "provenance",
    "log",
    "date",
    "wall_s",
    "wall_time_s",
    "seconds",
    "elapsed_s",
    "started",
    "finished",
    "command",
    "out",
}


def wispsim(*args: str) -> None:
    cmd = [sys.executable, "-m", "wispsim.cli", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAILED ({r.returncode}): wispsim {' '.join(args)}\n  {r.stderr.strip().splitlines()[-1:]}")


def run(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, args in RUNS.items():
        log = ["--log", str(out / f"{name}.log.parquet")] if name == "wisp" else []
        wispsim("run", *args, *QUICK, "--seed", "1", "--out", str(out / name), *log)
    for policy in REPLAYS:
        wispsim(
            "replay",
            str(out / "wisp.log.parquet"),
            "--policy",
            policy,
            "--out",
            str(out / f"replay-{policy}"),
        )
    for name, args in BENCHES.items():
        wispsim("bench", *args, "--save-result", "--result-filename", str(out / f"{name}.json"))
    wispsim("sweep", *SWEEP, *QUICK, "--out", str(out / "sweep"))


def table(path: Path) -> pd.DataFrame | None:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    return None


def strip(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: strip(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [strip(v) for v in doc]
    return doc


def compare(a: Path, b: Path) -> int:
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    differ = 0
    for rel in sorted(files_a ^ files_b):
        print(f"only in {'A' if rel in files_a else 'B'}: {rel}")
        differ += 1
    for rel in sorted(files_a & files_b):
        pa, pb = a / rel, b / rel
        ta, tb = table(pa), table(pb)
        if ta is not None and tb is not None:
            cols = [c for c in ta.columns if c not in VOLATILE]
            if list(ta.columns) != list(tb.columns):
                print(f"columns differ: {rel}: {sorted(set(ta.columns) ^ set(tb.columns))}")
                differ += 1
                cols = [c for c in cols if c in tb.columns]
            try:
                pd.testing.assert_frame_equal(ta[cols], tb[cols], check_dtype=False)
            except AssertionError as e:
                print(f"differs: {rel}: {str(e).splitlines()[0]} {' '.join(str(e).split())[:300]}")
                differ += 1
        elif rel.suffix == ".json":
            if strip(json.loads(pa.read_text())) != strip(json.loads(pb.read_text())):
                print(f"differs: {rel}")
                differ += 1
        elif rel.suffix in (".yaml", ".txt") and pa.read_bytes() != pb.read_bytes():
            print(f"differs: {rel}")
            differ += 1
    print(f"{differ} difference(s) in {len(files_a & files_b)} shared files")
    return differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run")
    r.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.what == "run":
        run(args.out)
    else:
        sys.exit(1 if compare(args.a, args.b) else 0)


if __name__ == "__main__":
    main()
