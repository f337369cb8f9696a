"""Runners: where a list of points is computed -- a local process pool, or Ray.

Both check the store first and keep each finished point (:mod:`wispsim.study.points`), so a
killed sweep rerun with the same command redoes nothing it finished, whichever runner ran it.

Workers die with the command that started them, ``kill -9`` of it included: the pool's workers
through :func:`worker_pool`, a local Ray instance through Ray's own fate-sharing and a guard
process (:func:`_ray_guard`). Ray ends the tasks of a dead driver on a cluster (``address``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from wispsim.provenance import code_commit
from wispsim.study.points import Point, PointResult, compute_point, load_point, run_point, store_point

WATCH_S = 0.25  # how often a pool worker checks that the process that started it is alive


def _alive(pid: int) -> bool:
    if sys.platform == "win32":
        return True  # os.kill(pid, 0) would terminate it there; the parent-pid check remains
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _set_pdeathsig() -> bool:
    """Ask Linux to SIGKILL this process when its parent thread dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)) == 0  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


def _watch_parent(owner: int, parent: int) -> None:
    while True:
        time.sleep(WATCH_S)
        if os.getppid() != parent or not _alive(owner):
            os._exit(1)


def _worker_init(owner: int, direct: bool, pdeathsig: bool) -> None:
    """Initializer of :func:`worker_pool`'s workers: die with ``owner``, the pool's process.

    ``direct``: this worker is ``owner``'s own child (fork, spawn), not the forkserver's. Three
    guards: Linux kills the worker when its parent dies (``pdeathsig``: only for a pool made on
    the main thread, since Linux ties the signal to the thread that forked -- the one that
    submits -- and a thread may end before its process); a check that the parent did not die
    before that was set; and a thread that ends the worker within :data:`WATCH_S` once its parent
    changes (reparented: the parent died) or ``owner`` is gone -- on every platform, and for a
    forkserver worker, whose parent (the forkserver) exits when ``owner`` does.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle; it ends the pool
    parent = os.getppid()
    if pdeathsig and sys.platform.startswith("linux"):
        _set_pdeathsig()
    if (direct and os.getppid() != owner) or os.getppid() != parent or not _alive(owner):
        os._exit(1)  # the owner died before the guards were up
    watch = threading.Thread(target=_watch_parent, args=(owner, parent), name="wispsim-watch", daemon=True)
    watch.start()


def worker_pool(jobs: int, start_method: str | None = None) -> ProcessPoolExecutor:
    """A process pool whose workers die with this process, however it ends (``kill -9`` too).

    ``start_method``: fork, spawn or forkserver (default: the platform's). Workers ignore
    Ctrl-C; the process that owns the pool handles it (:meth:`LocalRunner.__exit__` kills them).
    """
    ctx = multiprocessing.get_context(start_method)
    method = ctx.get_start_method()
    on_main = threading.current_thread() is threading.main_thread()
    return ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(os.getpid(), method != "forkserver", on_main),
    )


def kill_workers(pool: ProcessPoolExecutor) -> None:
    """SIGKILL a pool's workers now (running points are lost; finished ones are stored)."""
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            p.kill()


class LocalRunner:
    """Runs points serially (jobs=1) or in a local process pool (:func:`worker_pool`).

    An exception in the block that holds the runner (Ctrl-C included) kills the workers at once
    instead of waiting for their points; ``kill -9`` of this process ends them within
    :data:`WATCH_S` (at once on Linux).
    """

    def __init__(
        self, jobs: int, out: Path | None, records: str = "responses", start_method: str | None = None
    ) -> None:
        self.jobs = max(1, jobs)
        self.out = out
        self.records = records
        self.start_method = start_method
        self._pool: ProcessPoolExecutor | None = None
        self.computed = self.loaded = 0
        self.commits: dict[str, int] = {}  # git commit that computed each point -> points

    def __enter__(self) -> LocalRunner:
        code_commit()  # once, here: forked workers inherit it, and edits made mid-sweep don't show
        if self.jobs > 1:
            self._pool = worker_pool(self.jobs, self.start_method)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._pool is not None:
            if exc_type is not None:
                kill_workers(self._pool)
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def map(self, points: list[Point], done: Callable[[], None] | None = None) -> list[PointResult]:
        out: list[PointResult] = []
        if self._pool is None:
            for p in points:
                out.append(run_point(p, self.out, self.records))
                if done:
                    done()
        else:
            futures = [self._pool.submit(run_point, p, self.out, self.records) for p in points]
            for f in futures:
                out.append(f.result())
                if done:
                    done()
        n = sum(r.computed for r in out)
        self.computed += n
        self.loaded += len(out) - n
        for r in out:
            self.commits[r.commit] = self.commits.get(r.commit, 0) + 1
        return out


# The guard of a local Ray instance (run with ``python -c``; psutil comes with Ray). While the
# process that started it lives, it notes that process's descendants that belong to Ray; once its
# stdin reaches EOF (that process exited, however, or closed the pipe) it SIGTERMs those still
# alive, and SIGKILLs them a second later. Ray's own fate-sharing ends the raylet, GCS and workers
# at once, but its agents wait a minute for the dead GCS before they exit.
_RAY_GUARD = """# wispsim: guard of a local Ray instance
import os, signal, sys, threading, psutil
signal.signal(signal.SIGINT, signal.SIG_IGN)
owner, me = psutil.Process(int(sys.argv[1])), os.getpid()
before = {int(p) for p in sys.argv[2:]}
known, eof = {}, threading.Event()
def note():
    try:
        procs = owner.children(recursive=True)
    except psutil.Error:
        return
    for p in procs:
        if p.pid == me or p.pid in before or p.pid in known:
            continue
        try:
            if "ray" in p.name() + " ".join(p.cmdline()):
                known[p.pid] = p
        except psutil.Error:
            pass
def wait_eof():
    while sys.stdin.buffer.read(4096):
        pass
    eof.set()
threading.Thread(target=wait_eof, daemon=True).start()
while not eof.wait(0.25):
    note()
left = set()
for p in known.values():
    try:
        if p.is_running():
            left.add(p)
            left.update(p.children(recursive=True))
    except psutil.Error:
        pass
for p in left:
    try:
        p.terminate()
    except psutil.Error:
        pass
gone, alive = psutil.wait_procs(left, timeout=1)
for p in alive:
    try:
        p.kill()
    except psutil.Error:
        pass
"""


def _ray_guard() -> subprocess.Popen[bytes] | None:
    """Start the guard of the local Ray instance this process is about to start (None: no psutil)."""
    try:
        import psutil

        before = [str(p.pid) for p in psutil.Process().children(recursive=True)]
        return subprocess.Popen(
            [sys.executable, "-c", _RAY_GUARD, str(os.getpid()), *before],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except (ImportError, OSError):
        return None


class RayRunner:
    """Runs points as Ray tasks, on a local Ray instance or an existing cluster (``address``).

    Workers only simulate (:func:`compute_point`); this process checks the store before
    submitting and writes each result as it arrives (:func:`store_point`), so results land in
    ``out`` on the machine that runs the command, a killed sweep keeps every point that came back,
    and workers need no shared file system. ``jobs`` is how many points are in flight at once
    (default: the cluster's CPUs).
    """

    def __init__(
        self, jobs: int | None, out: Path | None, records: str = "responses", address: str | None = None
    ) -> None:
        self.out = out
        self.records = records
        self.address = address
        self._jobs = jobs
        self.jobs = max(1, jobs or 1)
        self._started = False
        self._guard: subprocess.Popen[bytes] | None = None
        self.computed = self.loaded = 0
        self.commits: dict[str, int] = {}  # git commit that computed each point -> points

    def __enter__(self) -> RayRunner:
        try:
            import ray
        except ImportError:
            from wispsim.errors import WispsimError

            raise WispsimError(
                "--backend ray needs Ray: pip install 'wispsim[ray]' (or pip install ray)"
            ) from None
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            else:
                self._guard = _ray_guard()
                try:
                    ray.init(
                        address="local", num_cpus=self._jobs, include_dashboard=False, log_to_driver=False
                    )
                except BaseException:
                    self._stop_guard()
                    raise
            self._started = True
        self.jobs = max(1, self._jobs or int(ray.cluster_resources().get("CPU", 1)))
        self._remote: Any = ray.remote(compute_point)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            import ray

            try:
                ray.shutdown()
            finally:
                self._stop_guard()

    def _stop_guard(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:
            with contextlib.suppress(OSError, ValueError):
                if guard.stdin is not None:
                    guard.stdin.close()  # the guard reaps what ray.shutdown() left, then exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                guard.wait(timeout=5)

    def map(self, points: list[Point], done: Callable[[], None] | None = None) -> list[PointResult]:
        import ray

        results: dict[int, PointResult] = {}
        pending: dict[object, int] = {}
        todo = []
        for i, p in enumerate(points):
            stored = load_point(p, self.out)
            if stored is not None:
                results[i] = stored
                if done:
                    done()
            else:
                todo.append(i)
        queue = iter(todo)
        for i in queue:  # keep at most ``jobs`` tasks in flight
            pending[self._remote.remote(points[i], self.records)] = i
            if len(pending) >= self.jobs:
                break
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            i = pending.pop(ref)
            results[i] = store_point(ray.get(ref), self.out)
            if done:
                done()
            nxt = next(queue, None)
            if nxt is not None:
                pending[self._remote.remote(points[nxt], self.records)] = nxt
        n = sum(r.computed for r in results.values())
        self.computed += n
        self.loaded += len(results) - n
        for r in results.values():
            self.commits[r.commit] = self.commits.get(r.commit, 0) + 1
        return [results[i] for i in range(len(points))]


BACKENDS = ("local", "ray")


def make_runner(
    backend: str, jobs: int, out: Path | None, records: str = "responses", address: str | None = None
) -> LocalRunner | RayRunner:
    """The runner for ``--backend``: a local process pool, or Ray (``--address`` for a cluster)."""
    from wispsim.errors import ConfigError

    if backend == "local":
        if address:
            raise ConfigError("--address", "", "only with --backend ray")
        return LocalRunner(jobs, out, records)
    if backend == "ray":
        return RayRunner(jobs, out, records, address)
    raise ConfigError("--backend", "", f"got {backend!r}; allowed: {', '.join(BACKENDS)}")


Runner = LocalRunner | RayRunner
