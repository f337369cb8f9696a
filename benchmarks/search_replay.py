"""What would a capacity search cost from another start? Replay it on a dense grid of real points.

A sweep's wall time is its points' CPU (the searches' choices) spread over the workers. This
script simulates every N in a band around each class's knee once (``--gather``, the default
scenario's WISP sweep, 3 seeds, the sequential rule, as ``wispsim sweep`` runs each point), then
drives the real :class:`~wispsim.study.capacity_search.CapacitySearch` over those points from
estimates off by a factor (``--factors``), and prints for each the N values it evaluated, the
capacity and interval, the points' CPU and the wall time two FIFO workers would take (each
search's next wave queued when its last one is back, as ``capacity_sweep`` does).

    python benchmarks/search_replay.py --gather grid.jsonl   # ~4 min on 2 cores, 377 points
    python benchmarks/search_replay.py --grid grid.jsonl [--factors 0.92,0.96,1,1.04,1.08,1.12]

Speed is measured here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import wispsim
from wispsim.study.capacity_search import CapacitySearch, PointStats, pooled_stats
from wispsim.study.lookahead import guess_next
from wispsim.study.points import Point, compute_point
from wispsim.study.stopping import Stopping

# N gathered per class: a band around the default sweep's knees (216, 124, 94, 78)
BANDS = {2.0: range(150, 300), 4.0: range(85, 175), 6.0: range(60, 135), 8.0: range(50, 112)}


def _one(arg: tuple[int, float]) -> dict[str, object]:
    n, slo = arg
    sc = wispsim.load_scenario()
    point = Point(sc.with_devices(n, (slo,)), n, (0, 1, 2), Stopping(sc.epsilon))
    t = time.perf_counter()
    out = compute_point(point)
    wall = time.perf_counter() - t
    st = pooled_stats(n, out.counts)
    return {"n": n, "c": slo, "wall": wall, "stop": out.stop.how, "v": st.violation, "lo": st.ci_low,
            "hi": st.ci_high, "resp": st.responses, "per_class": st.per_class}  # fmt: skip


def gather(path: Path, jobs: int) -> None:
    todo = [(n, c) for c, band in BANDS.items() for n in band]
    with ProcessPoolExecutor(jobs) as pool, path.open("w") as f:
        for i, row in enumerate(pool.map(_one, todo), 1):
            f.write(json.dumps(row) + "\n")
            print(f"\r{i}/{len(todo)} points", end="", flush=True)
    print()


def replay(
    table: dict[tuple[float, int], dict], slo: float, estimate: int, guesses: list[bool] | None = None
) -> tuple[CapacitySearch, list]:
    """Drive the search from ``estimate`` over the gathered points; its waves of (N, wall).
    ``guesses``: for each wave after which the search asked for more, whether the guess of a spare
    worker (:func:`wispsim.study.lookahead.guess_next`, made while the wave was in flight; only
    where it made one) was the next wave's first N."""
    s = CapacitySearch(0.05, estimate=estimate)
    waves = []
    guess: list[int] = []
    while xs := s.next_devices():
        if guesses is not None and guess:
            guesses.append(guess[0] == xs[0])
        guess = guess_next(s, set(xs))
        wave = []
        for x in xs:
            r = table.get((slo, x))
            if r is None:
                raise SystemExit(f"N = {x} at {slo:g} tok/s is outside the gathered grid: widen BANDS")
            p = PointStats(x, r["v"], r["lo"], r["hi"], r["per_class"], r["resp"])
            p.stop = r["stop"]
            s.evaluated[x] = p
            wave.append((x, r["wall"]))
        waves.append(wave)
    return s, waves


def fifo_wall(chains: list[list[list[tuple[int, float]]]], workers: int = 2) -> float:
    """When two FIFO workers finish the searches' chains of waves (a wave queued when the
    search's previous wave is back)."""
    ready = [(0.0, i, 0) for i in range(len(chains))]  # (time, search, wave)
    heapq.heapify(ready)
    queue: collections.deque[tuple[int, int, float]] = collections.deque()
    busy: list[tuple[float, int, int]] = []
    left: dict[tuple[int, int], int] = {}
    now, idle, end = 0.0, workers, 0.0
    while ready or queue or busy:
        while ready and ready[0][0] <= now:
            _, i, w = heapq.heappop(ready)
            if w < len(chains[i]):
                left[(i, w)] = len(chains[i][w])
                queue.extend((i, w, wall) for _, wall in chains[i][w])
        while idle and queue:
            i, w, wall = queue.popleft()
            idle -= 1
            heapq.heappush(busy, (now + wall, i, w))
        now = min(ready[0][0] if ready else math.inf, busy[0][0] if busy else math.inf)
        if now == math.inf:
            break
        while busy and busy[0][0] <= now:
            t, i, w = heapq.heappop(busy)
            idle, end = idle + 1, max(end, t)
            left[(i, w)] -= 1
            if not left[(i, w)]:
                heapq.heappush(ready, (now, i, w + 1))
    return end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gather", type=Path, help="simulate the grid into this JSON-lines file")
    ap.add_argument("--grid", type=Path, help="replay the searches over this gathered grid")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--factors", default="0.92,0.96,1,1.04,1.08,1.12",
                    help="estimates, as factors of each capacity (the default sweep: ~1.07)")  # fmt: skip
    a = ap.parse_args()
    if a.gather:
        gather(a.gather, a.jobs)
    if not a.grid:
        return
    rows = [json.loads(line) for line in a.grid.read_text().splitlines() if line]
    table = {(r["c"], r["n"]): r for r in rows}
    truth = {slo: replay(table, slo, band.start + len(band) // 2)[0].capacity for slo, band in BANDS.items()}
    guesses: list[bool] = []
    for f in (float(x) for x in a.factors.split(",")):
        chains, cpu, cells = [], 0.0, []
        for slo in BANDS:
            s, waves = replay(table, slo, round(truth[slo] * f), guesses)
            chains.append(waves)
            cpu += sum(w for wave in waves for _, w in wave)
            order = "/".join(str(x) for wave in waves for x, _ in wave)
            cells.append(f"{slo:g}: {s.capacity} {list(s.interval())} via {order}")
        wall = fifo_wall(chains)
        print(f"estimate x{f:<5g} CPU {cpu:6.2f} s, two workers {wall:5.2f} s | " + "; ".join(cells))
    print(f"a spare worker's guess (made while the search cut a bracket) was its next N {sum(guesses)} "
          f"times of {len(guesses)}")  # fmt: skip


if __name__ == "__main__":
    main()
