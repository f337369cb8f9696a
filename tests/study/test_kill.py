"""Process tests (issue 13): a sweep's workers die with the command that started them.

These start real processes, SIGKILL them and look in /proc for what is left (Linux only). Each
run carries a unique ``WISPSIM_KILLTEST`` in its environment; a process counts as the run's if it
descends from the command (noted by pid and start time while the command lives) or carries the
marker (a spawn or forkserver worker's command line says nothing of the sweep). Zombies count as
gone: they are dead, and whether anyone reaps them is up to PID 1. About 40-60 s on 2 busy cores.
The Ray backend's counterpart is ``benchmarks/kill_sweep.py --backend ray`` (Ray takes 10-30 s
to start here, too slow for a test).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from wispsim.study.runners import LocalRunner

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")

MARK = "WISPSIM_KILLTEST"
GONE_WITHIN_S = 10.0  # the guards act within a fraction of a second; this is slack for busy cores

# 12 points of 1-2 s each: a sweep of ~10-15 s at -j 2 (N stays below capacity: no bisection)
SWEEP = ["sweep", "--classes", "4", "--seeds", "2", "--devices", "10,20,30,40,50,60"]
SWEEP += ["--max-devices", "60", "--set", "workload.warmup_s=1", "--set", "workload.duration_s=6"]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process; None once it is gone."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return f[0], int(f[1]), int(f[19])


class Tracker:
    """The processes of one command: its descendants, and whatever carries ``MARK=tag``."""

    def __init__(self, root: int, tag: str) -> None:
        self.root = root
        self.needle = f"{MARK}={tag}".encode()
        self.seen: set[tuple[int, int]] = set()  # (pid, start time)

    def scan(self) -> None:
        parent = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and (st := _stat(int(d.name))) is not None:
                parent[int(d.name)] = st[1]
        for pid in parent:
            q, ours = pid, False
            while q > 1 and not ours:
                ours = q == self.root
                q = parent.get(q, 0)
            if not ours:
                try:
                    ours = self.needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
            st = _stat(pid)
            if ours and st is not None:
                self.seen.add((pid, st[2]))

    def live(self) -> list[str]:
        """Command lines of the noted processes still alive, zombies excluded."""
        out = []
        for pid, start in sorted(self.seen):
            st = _stat(pid)
            if st is not None and st[2] == start and st[0] != "Z":
                with contextlib.suppress(OSError):
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    out.append(f"{pid}: {cmd.decode(errors='replace')[:120]}")
        return out

    def wait_gone(self, timeout: float) -> tuple[list[str], float]:
        """Poll until nothing noted is alive (new marked processes count); what is left, seconds."""
        t0 = time.monotonic()
        while True:
            self.scan()
            left = self.live()
            if not left or time.monotonic() - t0 > timeout:
                return left, time.monotonic() - t0
            time.sleep(0.05)

    def kill_all(self) -> None:
        for pid, start in self.seen:
            st = _stat(pid)
            if st is not None and st[2] == start:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def _env(tag: str) -> dict[str, str]:
    return {**os.environ, MARK: tag}


def _done(out: Path) -> int:
    return len(list((out / "points").glob("*/summary.csv")))


def _sweep(out: Path) -> list[str]:
    return [sys.executable, "-m", "wispsim.cli", *SWEEP, "-j", "2", "-o", str(out)]


@pytest.mark.slow
def test_process_kill9_of_a_sweep_leaves_no_worker_and_it_resumes(tmp_path: Path) -> None:
    cut, whole, tag = tmp_path / "cut", tmp_path / "whole", uuid.uuid4().hex
    proc = subprocess.Popen(
        _sweep(cut),
        env=_env(tag),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    tracker = Tracker(proc.pid, tag)
    try:
        deadline = time.monotonic() + 120
        while _done(cut) < 1 and proc.poll() is None and time.monotonic() < deadline:
            tracker.scan()
            time.sleep(0.05)
        tracker.scan()
        assert proc.poll() is None, (
            f"the sweep ended before the kill: {proc.stderr.read() if proc.stderr else ''}"
        )
        workers = len(tracker.seen) - 1
        assert workers >= 2, "a -j 2 sweep runs its points in worker processes"
        at_kill = _done(cut)
        os.kill(proc.pid, signal.SIGKILL)  # the command only: its workers must follow by themselves
        proc.wait()
        left, took = tracker.wait_gone(GONE_WITHIN_S)
        assert not left, f"{len(left)} processes outlived the sweep by {took:.1f} s:\n" + "\n".join(left)
        assert not (cut / "capacity.csv").exists()
        assert at_kill < 12, "the kill must land mid-sweep"
    finally:
        tracker.kill_all()
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.stderr:
            proc.stderr.close()

    for out in (cut, whole):  # resume the killed one; run the same sweep uninterrupted elsewhere
        r = subprocess.run(_sweep(out), env=_env(tag), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    for name in ("capacity.csv", "curve.csv", "curve_pooled.csv"):
        pd.testing.assert_frame_equal(pd.read_csv(cut / name), pd.read_csv(whole / name))
    keys = {p.name for p in (whole / "points").iterdir() if not p.name.startswith(".")}
    assert {p.name for p in (cut / "points").iterdir() if not p.name.startswith(".")} == keys


POOL_SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    from wispsim.study.runners import worker_pool

    def main():
        pool = worker_pool(2, sys.argv[1])
        for f in [pool.submit(time.sleep, 0.2) for _ in range(2)]:
            f.result()  # the pool is up
        futures = [pool.submit(time.sleep, 120) for _ in range(4)]
        time.sleep(0.5)
        print("ready", flush=True)
        futures[0].result()

    if sys.argv[2] == "thread":  # a pool made off the main thread: no PDEATHSIG, the watch thread
        t = threading.Thread(target=main)
        t.start()
        t.join()
    else:
        main()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(("method", "where"), [("spawn", "main"), ("forkserver", "main"), ("fork", "thread")])
def test_process_pool_workers_die_with_their_owner(method: str, where: str) -> None:
    tag = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-c", POOL_SCRIPT, method, where],
        env=_env(tag),
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    tracker = Tracker(proc.pid, tag)
    try:
        assert proc.stdout is not None
        assert select.select([proc.stdout], [], [], 120)[0], "the pool did not come up"
        assert proc.stdout.readline().strip() == "ready"
        tracker.scan()
        assert len(tracker.seen) >= 3  # the owner and two workers (and a forkserver, a tracker)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left, took = tracker.wait_gone(GONE_WITHIN_S)
        assert not left, f"{len(left)} processes outlived their owner by {took:.1f} s:\n" + "\n".join(left)
    finally:
        tracker.kill_all()
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.stdout:
            proc.stdout.close()


def test_process_an_error_in_the_runner_block_kills_its_workers_at_once(tmp_path: Path) -> None:
    """Ctrl-C (KeyboardInterrupt) or an error: the runner does not wait for the running points."""
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), LocalRunner(2, tmp_path) as runner:
        pool = runner._pool
        assert pool is not None
        futures = [pool.submit(time.sleep, 120) for _ in range(2)]
        while not all(f.running() for f in futures):
            time.sleep(0.05)
        pids = list(pool._processes)
        raise KeyboardInterrupt
    assert time.monotonic() - t0 < 30
    for pid in pids:
        st = _stat(pid)
        assert st is None or st[0] == "Z", f"worker {pid} still alive"
