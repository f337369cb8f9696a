"""CPU each side of a validation run takes, sampled every 5 s (issue 30, item 1): the server's
process tree (``wispsim serve``, started as ``python -m wispsim.cli serve``: the engine and its
HTTP threads) and the validate process tree (the swarm and the simulations), as percent of one
core over the last interval, and the host's busy and stolen time (the hypervisor running other
guests on this VM's CPUs).

    python experiments/data/validation-scale/cpu_sampler.py OUT.csv   # until killed
"""

from __future__ import annotations

import sys
import time

import psutil


def shares(procs: dict[int, psutil.Process]) -> tuple[float, float]:
    """CPU of the server's tree and of the rest of the validate tree (each process read once:
    ``cpu_percent`` measures since its previous call)."""
    server = validate = 0.0
    for p in list(procs.values()):
        try:
            cmds = [" ".join(p.cmdline())] + [" ".join(a.cmdline()) for a in p.parents()]
            pct = p.cpu_percent(None)
        except psutil.Error:
            continue
        if any("wispsim.cli serve" in c for c in cmds):
            server += pct
        elif any("wispsim validate" in c for c in cmds):
            validate += pct
    return server, validate


def main(out: str) -> None:
    procs: dict[int, psutil.Process] = {}
    with open(out, "a") as f:
        if f.tell() == 0:
            f.write("time,server_pct,validate_pct,host_pct,steal_pct\n")
        psutil.cpu_percent(None)
        psutil.cpu_times_percent(None)
        while True:
            for p in psutil.process_iter():
                if p.pid not in procs:
                    procs[p.pid] = p
                    p.cpu_percent(None)  # the first call only starts the interval
            time.sleep(5)
            server, validate = shares(procs)
            host = psutil.cpu_percent(None) * psutil.cpu_count()
            # time the hypervisor gave this VM's CPUs to others (a shared host's slowdown)
            steal = getattr(psutil.cpu_times_percent(None), "steal", 0.0) * psutil.cpu_count()
            f.write(f"{time.time():.0f},{server:.0f},{validate:.0f},{host:.0f},{steal:.0f}\n")
            f.flush()
            procs = {pid: p for pid, p in procs.items() if p.is_running()}


if __name__ == "__main__":
    main(sys.argv[1])
