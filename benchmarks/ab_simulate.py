"""CPU seconds of one simulation, for comparing two trees on a noisy machine.

Prints the best CPU time of ``--reps`` runs of ``simulate`` (default scenario, policy wisp, the
four classes, ``--devices`` devices, seed 0) and the rounds simulated. Run it alternately from
two checkouts, e.g.::

    for i in $(seq 8); do for t in /tmp/before /path/to/wispsim; do
        echo "$t $(PYTHONPATH=$t python benchmarks/ab_simulate.py)"; done; done

and compare the medians (benchmarks/README.md, issue 34). The scenario is resolved once per run,
as a user's run resolves it (``simulate`` takes a resolved scenario; before issue 34 it resolved
a plain one itself, so the timed work is the same on both sides).
"""

from __future__ import annotations

import argparse
import time

from wispsim.sim.scenarios import load_scenario, resolve_server
from wispsim.sim.simulation import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=100)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    sc = load_scenario().with_policy("wisp").with_devices(args.devices, (2.0, 4.0, 6.0, 8.0))
    best, rounds = float("inf"), 0
    for _ in range(args.reps):
        t0 = time.process_time()
        res = simulate(resolve_server(sc), seed=0)
        best = min(best, time.process_time() - t0)
        rounds = len(res.rounds)
    print(f"{best:.3f} {rounds}")


if __name__ == "__main__":
    main()
