"""Replay a study's capacity searches over its stored points: what a change to the search costs.

Every capacity a study stores came from a :class:`~wispsim.study.capacity_search.CapacitySearch`
over points kept under ``experiments/data/STUDY/points/``. This runs the search of *this* tree
again, from each search's stored first estimate, answering every N it asks for from the stored
point (its pooled statistics and the rule's verdict, as the sweep computed them), and prints what
it evaluated, the CPU seconds those points took when they were simulated, and how its capacities
sit against the stored ones and their 95% intervals. A search that asks for an N nothing stored
stops there and is counted as such (run the study to simulate it). Nothing is simulated, so a
change to the search rule (the knee rule, the cuts, the step-out) is weighed in seconds::

    python benchmarks/replay_search.py experiments/data/capacity            # the totals
    python benchmarks/replay_search.py experiments/data/capacity --verbose  # every search

Used for issue 44's search rules (benchmarks/README.md). A study whose searches were seeded with
extra N values (``also``: the acceptance and regimes studies' light-load points) replays without
them, so its searches may ask for N that were never stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wispsim.study.capacity_search import CapacitySearch, PointStats, pooled_stats  # noqa: E402

Key = tuple[str, str, str]  # (sweep folder, policy, group)


def stored(study: Path) -> tuple[dict[Key, dict[int, tuple[PointStats, float]]], dict[Key, pd.Series]]:
    """Per search: its stored points (N -> pooled statistics with the rule's verdict, CPU
    seconds), and its stored capacity row."""
    points: dict[Key, dict[int, tuple[PointStats, float]]] = {}
    rows: dict[Key, pd.Series] = {}
    for folder in sorted(p.parent for p in study.rglob("capacity.csv")):
        if not (folder / "curve.csv").is_file():
            continue
        where = str(folder.relative_to(study)) if folder != study else "."
        for _, row in pd.read_csv(folder / "capacity.csv", dtype={"class": str}).iterrows():
            rows[(where, str(row.policy), str(row["class"]))] = row
        curve = pd.read_csv(folder / "curve.csv", dtype={"group": str})
        for (pol, group, n, key), _ in curve.groupby(["policy", "group", "devices", "point"]):
            meta = json.loads((study / "points" / str(key) / "meta.json").read_text())
            stats = pooled_stats(int(n), pd.read_csv(study / "points" / str(key) / "devices.csv"))
            stats.stop = str(meta["stop"])
            points.setdefault((where, str(pol), str(group)), {})[int(n)] = (stats, float(meta["wall_s"]))
    return points, rows


def replay(
    pts: dict[int, tuple[PointStats, float]], estimate: int, epsilon: float
) -> tuple[list[int], int | None]:
    """The N values the search evaluates, and the first it asks for that nothing stored (None: none)."""
    search = CapacitySearch(epsilon, estimate=estimate)
    seen: list[int] = []
    while todo := search.next_devices():
        for n in todo:
            if n not in pts:
                return seen, n
            search.evaluated[n] = pts[n][0]
            seen.append(n)
    return seen, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path, help="a study's data folder, e.g. experiments/data/capacity")
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--verbose", action="store_true", help="print every search")
    args = ap.parse_args()
    if not (args.study / "points").is_dir():
        sys.exit(f"{args.study}: no points/ folder (run the study first: its points are not shipped)")
    points, rows = stored(args.study)
    used = cpu = stored_cpu = 0.0
    moved, outside, missing = [], [], []
    for key, pts in sorted(points.items()):
        row = rows[key]
        seen, needs = replay(pts, int(row.estimate), args.epsilon)
        used += len(seen)
        cpu += sum(pts[n][1] for n in seen)
        stored_cpu += sum(w for _, w in pts.values())
        if needs is not None:
            missing.append(f"{'/'.join(key)} needs N={needs}")
            continue
        search = CapacitySearch(args.epsilon, estimate=int(row.estimate))
        for n in seen:
            search.evaluated[n] = pts[n][0]
        cap, (lo, hi) = search.capacity, search.interval()
        if cap != int(row.capacity):
            moved.append(key)
            if not int(row.ci_low) <= cap <= int(row.ci_high):
                outside.append(f"{'/'.join(key)}: {cap} [{lo}, {hi}] against {int(row.capacity)} "
                               f"[{int(row.ci_low)}, {int(row.ci_high)}]")  # fmt: skip
        if args.verbose:
            trail = ", ".join(f"{n} ({pts[n][0].violation:.1%} {pts[n][0].stop[0]})" for n in seen)
            print(f"{'/'.join(key)}: {cap} [{lo}, {hi}] (stored {int(row.capacity)} "
                  f"[{int(row.ci_low)}, {int(row.ci_high)}]) from {trail}")  # fmt: skip
    total = sum(len(p) for p in points.values())
    print(
        f"{len(points)} searches: {int(used)} points evaluated of {total} stored, {cpu:.0f} s of CPU "
        f"when simulated (all stored: {stored_cpu:.0f} s); {len(moved)} capacities moved, "
        f"{len(outside)} outside the stored 95% interval; {len(missing)} asked for N not stored"
    )
    for line in outside + missing:
        print("  " + line)


if __name__ == "__main__":
    main()
