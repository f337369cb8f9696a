"""How long a sweep's workers outlive ``kill -9`` of the command (issue 13), local pool or Ray.

Starts ``python -m wispsim.cli sweep`` in its own session with a marker in its environment, waits
until it has stored a point, SIGKILLs the command's process only, then polls /proc for every
process that descended from the command or carries the marker (pool workers, a forkserver, Ray's
raylet, GCS, agents and workers) and prints, per process, how many seconds it outlived the
command. Linux only (reads /proc).

    python benchmarks/kill_sweep.py                  # local process pool, -j 2
    python benchmarks/kill_sweep.py --backend ray    # a local Ray instance (ray.init() ~10 s)

    python benchmarks/kill_sweep.py --backend ray --address 127.0.0.1:6390   # a running cluster

With ``--address`` the cluster is not the command's: what is watched is the cluster's workers that
ran the sweep's points (``ray::compute_point`` when the kill lands); Ray ends a dead driver's job.
Anything still alive at ``--wait`` seconds is killed (and reported as left).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

MARK = "WISPSIM_KILLTEST"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, None if it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return f[0], int(f[1]), int(f[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Tracker:
    """The processes of one command: its descendants and whatever carries ``MARK=tag``.

    Ray's processes rename themselves (setproctitle), which can overwrite their environment, so
    the descendants of the command are noted too, by pid and start time, while it lives.
    """

    def __init__(self, root: int, tag: str, cluster_workers: bool = False) -> None:
        self.root = root
        self.needle = f"{MARK}={tag}".encode()
        self.seen: dict[tuple[int, int], str] = {}  # (pid, start time) -> command line
        # with --address: the cluster's workers that run this sweep's points (ray::compute_point)
        self.cluster_workers = cluster_workers

    def scan(self) -> None:
        parent: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
                parent[int(d.name)] = st[1]
        for pid in parent:
            q, ours = pid, False
            while q > 1 and not ours:
                ours = q == self.root
                q = parent.get(q, 0)
            if not ours and self.cluster_workers:
                ours = _cmdline(pid).startswith("ray::compute_point")
            if not ours:
                try:
                    ours = self.needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
            st = _stat(pid)
            if ours and st is not None and (pid, st[2]) not in self.seen:
                self.seen[(pid, st[2])] = _cmdline(pid)

    def live(self) -> set[tuple[int, int]]:
        """The noted processes still alive (zombies count as gone)."""
        out = set()
        for pid, start in self.seen:
            st = _stat(pid)
            if st is not None and st[2] == start and st[0] != "Z":
                out.add((pid, start))
        return out


def short(cmd: str) -> str:
    if cmd.startswith("ray::"):
        return cmd.split()[0]
    if "wispsim: guard" in cmd:
        return "wispsim guard of the Ray instance"
    parts = cmd.split()
    for i, p in enumerate(parts):
        if p == "-m" and i + 1 < len(parts):
            return " ".join(parts[i + 1 : i + 3])
        if p.endswith(".py") or "/ray/" in p:
            return Path(p).name
    return cmd[:60]


def points(out: Path) -> int:
    return len(list((out / "points").glob("*/summary.csv")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="local", choices=("local", "ray"))
    ap.add_argument("--jobs", "-j", type=int, default=2)
    ap.add_argument("--address", help="a running Ray cluster (--backend ray): watch its task workers")
    ap.add_argument("--wait", type=float, default=90.0, help="seconds to watch after the kill")
    args = ap.parse_args()

    tag = uuid.uuid4().hex
    tmp = Path(tempfile.mkdtemp(prefix="wispsim-kill-"))
    out = tmp / "sweep"
    cmd = [sys.executable, "-m", "wispsim.cli", "sweep", "--classes", "4", "--seeds", "2"]
    cmd += ["--set", "workload.duration_s=10", "--set", "workload.warmup_s=1"]
    cmd += ["-j", str(args.jobs), "--backend", args.backend, "-o", str(out)]
    if args.address:
        cmd += ["--address", args.address]
    env = {**os.environ, MARK: tag}
    t_start = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    tracker = Tracker(proc.pid, tag, cluster_workers=bool(args.address))
    try:
        while points(out) < 1:
            tracker.scan()
            if proc.poll() is not None:
                sys.exit(f"the sweep ended (rc {proc.returncode}) before storing a point")
            time.sleep(0.1)
        t_first = time.monotonic() - t_start
        tracker.scan()
        n_before = points(out)
        os.kill(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        proc.wait()
        gone: dict[tuple[int, int], float] = {}
        while time.monotonic() - t0 < args.wait:
            tracker.scan()  # marked processes started after the kill
            live = tracker.live()
            now = time.monotonic() - t0
            for key in tracker.seen:
                if key not in live and key not in gone:
                    gone[key] = now
            if not live:
                break
            time.sleep(0.05)
        left = tracker.live()
        for pid, _ in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        n_after = points(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"backend {args.backend}, -j {args.jobs}: first point stored {t_first:.1f} s after start")
    print(f"points stored at the kill: {n_before}; when the watch ended: {n_after}")
    print(f"{'pid':>8}  {'process':<40} outlived the command by")
    for key, c in sorted(tracker.seen.items(), key=lambda kv: gone.get(kv[0], 1e9)):
        pid = key[0]
        when = f"{gone[key]:.2f} s" if key in gone else f"still alive at {args.wait:.0f} s (killed)"
        if pid == proc.pid:
            when = "(the command, SIGKILLed)"
        print(f"{pid:>8}  {short(c):<40} {when}")
    others = [t for key, t in gone.items() if key[0] != proc.pid]
    if left:
        print(f"NOT CLEAN: {len(left)} processes still alive after {args.wait:.0f} s")
    else:
        print(f"no process left {max(others, default=0.0):.2f} s after the kill")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
