"""How long does a capacity answer take, this tree against an earlier one, in one alternating run?

Runs ``wispsim sweep --policy wisp --classes 2,4,6,8`` (the README's first command) -- and with
``--compare`` the 4-policy ``wispsim compare`` -- as a user runs them (a subprocess, a fresh
``--out``, ``--jobs 2``), once on this checkout and once on ``--baseline`` (a git revision,
checked out into a temporary worktree and run from there), taking turns so that a slow period of
the machine hits both alike. Prints each run's wall and CPU time (the command and its workers),
the simulations it ran, and its capacities with their 95% intervals, then the speed-up and
whether every capacity of this tree lies inside the baseline's interval.

    python benchmarks/bench_sweep.py [--baseline 478e6eb] [--reps 1] [--compare] [--modes] [--native]

``--modes`` also times this tree with ``--stop horizon`` and with ``--search exact``: what each
of the two mechanisms (sequential stopping, the search that ends at the knee) buys on its own.
``--native`` also times this tree on its pure Python (``WISPSIM_PURE=1``), for a checkout with
the optional mypyc build in place (``scripts/compile.py``); the baseline runs pure.
Both trees run from their bytecode, compiled once before the first run (as pip compiles an
installed package), whatever ``PYTHONDONTWRITEBYTECODE`` says here: no timed run compiles sources.
Speed is measured here, never asserted by a test.
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
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["sweep", "--policy", "wisp", "--classes", "2,4,6,8", "--jobs", "2"]
COMPARE = [
    "compare",
    "--policies",
    "wisp,centralized,centralized-sd,sled",
    "--classes",
    "2,4,6,8",
    "--jobs",
    "2",
]


@dataclass
class Timed:
    tree: str
    what: str
    wall: float
    cpu: float
    simulations: int
    capacity: pd.DataFrame


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _simulations(folder: Path) -> int:
    """Simulated (N, seed) runs the searches asked for: the points named in curve.csv, each with its
    seeds (points/ may also hold a point a spare worker simulated ahead that no search asked for)."""
    curve = pd.read_csv(folder / "curve.csv")
    if "point" in curve:
        metas = [folder / "points" / key / "meta.json" for key in set(curve.point)]
    else:  # an older tree's curve names no point (and it simulated nothing ahead)
        metas = list((folder / "points").glob("*/meta.json"))
    n = 0
    for meta in metas:
        m = json.loads(meta.read_text())
        n += len(m.get("seeds", [m.get("seed")]))
    return n


def run(tree: str, src: Path, args: list[str], what: str, pure: bool = False) -> Timed:
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp:
        out = Path(tmp) / "out"
        # as an installed package runs: from its bytecode (each tree compiled once, in main)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env |= {"PYTHONPATH": str(src), **({"WISPSIM_PURE": "1"} if pure else {})}
        cmd = [sys.executable, "-m", "wispsim.cli.main", *args, "--out", str(out)]
        cpu0, t0 = _children_cpu(), time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=src)
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if proc.returncode != 0:
            sys.exit(f"{tree}: wispsim {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        cap = pd.read_csv(out / "capacity.csv")
        return Timed(tree, what, wall, cpu, _simulations(out), cap)


def _cells(cap: pd.DataFrame) -> str:
    return ", ".join(
        f"{r.policy} {r['class']}: {int(r.capacity)} [{int(r.ci_low)}, {int(r.ci_high)}]"
        for _, r in cap.iterrows()
    )


def _line(t: Timed) -> None:
    print(
        f"  {t.tree:>26} {t.what:<8} {t.wall:7.1f} s wall {t.cpu:7.1f} s CPU "
        f"{t.simulations:4d} simulations  {_cells(t.capacity)}",
        flush=True,
    )


def _inside(new: pd.DataFrame, old: pd.DataFrame) -> list[str]:
    """Capacities of ``new`` outside ``old``'s intervals, as text."""
    key = ["policy", "class"]
    m = new.merge(old, on=key, suffixes=("", "_old"))
    bad = m[(m.capacity < m.ci_low_old) | (m.capacity > m.ci_high_old)]
    return [f"{r.policy} {r['class']}: {int(r.capacity)} not in [{int(r.ci_low_old)}, {int(r.ci_high_old)}]"
            for _, r in bad.iterrows()]  # fmt: skip


def worktree(rev: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
                   check=True, capture_output=True)  # fmt: skip
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--baseline", default="478e6eb", help="git revision to compare with (default: before issue 44)"
    )
    ap.add_argument("--reps", type=int, default=1, help="alternating repetitions")
    ap.add_argument("--compare", action="store_true", help="also time the 4-policy compare")
    ap.add_argument("--modes", action="store_true", help="also time --stop horizon and --search exact")
    ap.add_argument("--native", action="store_true", help="also time this tree with WISPSIM_PURE=1")
    args = ap.parse_args()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    this = head.stdout.strip() + ("+changes" if dirty else "")
    built = subprocess.run([sys.executable, "-c", "import wispsim.native as n; print(n.used()[0])"],
                           capture_output=True, text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    pure_tree = f"{this} pure"
    this += " compiled" if built == "compiled" else ""
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    jobs: list[tuple[str, list[str]]] = [("sweep", SWEEP)]
    if args.compare:
        jobs.append(("compare", COMPARE))
    results: list[Timed] = []
    with tempfile.TemporaryDirectory(prefix="bench_sweep_tree_") as tmp:
        base = worktree(args.baseline, Path(tmp) / "base")
        for tree in (base, ROOT):  # bytecode, as pip writes it at install: no run compiles its sources
            compile_all = [sys.executable, "-m", "compileall", "-q", str(tree / "wispsim")]
            subprocess.run(compile_all, capture_output=True)
        try:
            for _ in range(args.reps):
                for what, cmd in jobs:
                    trees = [(args.baseline, base, False), (this, ROOT, False)]
                    trees += [(pure_tree, ROOT, True)] if args.native else []
                    for tree, src, pure in trees:
                        t = run(tree, src, cmd, what, pure)
                        results.append(t)
                        _line(t)
                if args.modes:
                    for label, extra in [
                        ("--stop horizon", ["--stop", "horizon"]),
                        ("--search exact", ["--search", "exact"]),
                    ]:
                        t = run(f"{this} {label}", ROOT, SWEEP + extra, "sweep")
                        results.append(t)
                        _line(t)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True
            )
    print()
    for what, _ in jobs:
        old = [r for r in results if r.what == what and r.tree == args.baseline]
        new = [r for r in results if r.what == what and r.tree == this]
        ow, nw = min(r.wall for r in old), min(r.wall for r in new)
        best = f"best of {args.reps}"
        print(f"{what}: {args.baseline} {ow:.1f} s, {this} {nw:.1f} s wall ({best}): {ow / nw:.1f}x faster")
        pure = [r for r in results if r.what == what and r.tree == pure_tree]
        if pure:
            pw = min(r.wall for r in pure)
            print(f"  {pure_tree} {pw:.1f} s wall: {ow / pw:.1f}x; compiled/pure {nw / pw:.2f}")
        outside = [b for r in new for b in _inside(r.capacity, old[0].capacity)]
        print(
            "  every capacity inside the baseline's 95% interval"
            if not outside
            else "  outside: " + "; ".join(outside)
        )


if __name__ == "__main__":
    main()
