"""Runners: where a list of points is computed -- a local process pool, or Ray.

Both check the store first and keep each finished point (:mod:`wispsim.study.points`), so a
killed sweep rerun with the same command redoes nothing it finished, whichever runner ran it.

Workers die with the command that started them, ``kill -9`` of it included: the pool's workers
through :func:`worker_pool`, a local Ray instance through Ray's own fate-sharing and a guard
process (:func:`_ray_guard`). Ray ends the tasks of a dead driver on a cluster (``address``).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import threadpoolctl

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


def _worker_init(owner: int, direct: bool, pdeathsig: bool, scratch: str | None = None) -> None:
    """Initializer of :func:`worker_pool`'s workers: die with ``owner``, the pool's process.

    ``direct``: this worker is ``owner``'s own child (fork, spawn), not the forkserver's. Three
    guards: Linux kills the worker when its parent dies (``pdeathsig``: only for a pool made on
    the main thread, since Linux ties the signal to the thread that forked -- the one that
    submits -- and a thread may end before its process); a check that the parent did not die
    before that was set; and a thread that ends the worker within :data:`WATCH_S` once its parent
    changes (reparented: the parent died) or ``owner`` is gone -- on every platform, and for a
    forkserver worker, whose parent (the forkserver) exits when ``owner`` does. ``scratch``: the
    worker's temporary folder (records a long run spills), which the pool's owner removes.
    """
    if scratch is not None:
        tempfile.tempdir = scratch
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle; it ends the pool
    parent = os.getppid()
    if pdeathsig and sys.platform.startswith("linux"):
        _set_pdeathsig()
    if (direct and os.getppid() != owner) or os.getppid() != parent or not _alive(owner):
        os._exit(1)  # the owner died before the guards were up
    watch = threading.Thread(target=_watch_parent, args=(owner, parent), name="wispsim-watch", daemon=True)
    watch.start()
    # one BLAS thread per worker: the pool is the parallelism, and a BLAS library's own threads
    # (OpenBLAS spins its idle ones for a while after each product, here the drafting predictor's)
    # only take the cores from the other workers
    threadpoolctl.threadpool_limits(limits=1)


def worker_pool(
    jobs: int, start_method: str | None = None, scratch: Path | None = None
) -> ProcessPoolExecutor:
    """A process pool whose workers die with this process, however it ends (``kill -9`` too).

    ``start_method``: fork, spawn or forkserver (default: the platform's). Workers ignore
    Ctrl-C; the process that owns the pool handles it (:meth:`LocalRunner.__exit__` kills them).
    ``scratch``: the workers' temporary folder (default: the system's).
    """
    ctx = multiprocessing.get_context(start_method)
    method = ctx.get_start_method()
    on_main = threading.current_thread() is threading.main_thread()
    return ProcessPoolExecutor(
        max_workers=jobs,
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(os.getpid(), method != "forkserver", on_main, None if scratch is None else str(scratch)),
    )


def kill_workers(pool: ProcessPoolExecutor) -> None:
    """SIGKILL a pool's workers now (running points are lost; finished ones are stored)."""
    for p in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            p.kill()


class _Runner:
    """What both runners share: points started one by one and handed back as each finishes
    (``start``/``finished``: a capacity search asks for its next N as soon as its own points are
    back), :meth:`map` on top of them, and the count of points computed and loaded."""

    def __init__(self) -> None:
        self.computed = self.loaded = 0
        self.commits: dict[str, int] = {}  # git commit that computed each point -> points

    def start(self, tag: Hashable, point: Point) -> None:
        raise NotImplementedError

    def finished(self) -> tuple[Hashable, PointResult]:
        raise NotImplementedError

    def spare(self) -> int:
        """Workers with nothing to do now, for :meth:`ahead` (0: this runner does not simulate ahead)."""
        return 0

    def ahead(self, point: Point) -> None:
        """Simulate ``point`` on a spare worker before anyone asks for it (:mod:`wispsim.study.lookahead`)."""
        raise NotImplementedError

    def _count(self, r: PointResult) -> PointResult:
        self.computed += r.computed
        self.loaded += not r.computed
        self.commits[r.commit] = self.commits.get(r.commit, 0) + 1
        return r

    def map(self, points: list[Point], done: Callable[[], None] | None = None) -> list[PointResult]:
        """Every point of ``points``, results in their order; ``done()`` as each ends."""
        for i, p in enumerate(points):
            self.start(i, p)
        out: dict[Hashable, PointResult] = {}
        for _ in points:
            tag, r = self.finished()
            out[tag] = r
            if done:
                done()
        return [out[i] for i in range(len(points))]


class LocalRunner(_Runner):
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
        self._queued: deque[tuple[Hashable, Point]] = deque()  # serially: started, not yet run
        # -> (order started, tag, point key)
        self._flying: dict[Future[PointResult], tuple[int, Hashable, str]] = {}
        self._order = itertools.count()
        self._ahead: dict[str, Future[PointResult]] = {}  # point key -> simulated ahead, not asked for
        self.started_ahead = self.adopted = 0  # points started ahead; of them, asked for then
        self._scratch: Path | None = None
        super().__init__()

    def __enter__(self) -> LocalRunner:
        code_commit()  # once, here: forked workers inherit it, and edits made mid-sweep don't show
        if self.jobs > 1:
            # the workers' temporary files (a long run's spilled records) in one folder of ours: a
            # killed worker leaves them behind (their finalizers never run), and __exit__ removes it
            self._scratch = Path(tempfile.mkdtemp(prefix="wispsim-pool-"))
            self._pool = worker_pool(self.jobs, self.start_method, self._scratch)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._pool is not None:
            # a point simulated ahead that nobody asked for is not waited for (nor its half-written
            # folder kept: points are written to a hidden scratch folder, then renamed)
            unasked = [key for key, f in self._ahead.items() if not f.done()]
            if exc_type is not None or unasked:
                kill_workers(self._pool)
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
            for key in unasked if self.out is not None else ():
                for scratch in (self.out / "points").glob(f".{key}.*"):
                    shutil.rmtree(scratch, ignore_errors=True)
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        self._queued.clear()
        self._flying.clear()
        self._ahead.clear()

    def start(self, tag: Hashable, point: Point) -> None:
        """Begin computing ``point`` (or queue it behind the points in flight); :meth:`finished`
        hands it back with ``tag``."""
        if self._pool is None:
            self._queued.append((tag, point))
        else:
            future = self._ahead.pop(point.key, None)
            if future is None:
                future = self._pool.submit(run_point, point, self.out, self.records)
            elif future.done() and (future.cancelled() or future.exception() is not None):
                future = self._pool.submit(run_point, point, self.out, self.records)  # failed ahead: anew
            else:
                self.adopted += 1
            self._flying[future] = (next(self._order), tag, point.key)

    def spare(self) -> int:
        if self._pool is None:
            return 0
        return self.jobs - len(self._flying) - sum(not f.done() for f in self._ahead.values())

    def ahead(self, point: Point) -> None:
        """Start ``point`` now on the pool, unasked; :meth:`start` of the same point adopts it."""
        assert self._pool is not None, "only a pool simulates ahead"
        key = point.key
        if key not in self._ahead and all(k != key for _, _, k in self._flying.values()):
            self._ahead[key] = self._pool.submit(run_point, point, self.out, self.records)
            self.started_ahead += 1

    def finished(self) -> tuple[Hashable, PointResult]:
        """The next point to finish, with its tag (the earliest started among those done at once);
        serially, the earliest started. Raises LookupError when none was started."""
        if self._pool is None:
            if not self._queued:
                raise LookupError("no point in flight")
            tag, point = self._queued.popleft()
            return tag, self._count(run_point(point, self.out, self.records))
        if not self._flying:
            raise LookupError("no point in flight")
        done, _ = wait(self._flying, return_when=FIRST_COMPLETED)
        first = min(done, key=lambda f: self._flying[f][0])
        _, tag, _ = self._flying.pop(first)
        return tag, self._count(first.result())


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


class RayRunner(_Runner):
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
        self._ready: deque[tuple[Hashable, PointResult]] = deque()  # stored: back at once
        self._waiting: deque[tuple[Hashable, Point]] = deque()  # not yet submitted
        self._pending: dict[object, Hashable] = {}  # Ray task -> tag
        super().__init__()

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

    def start(self, tag: Hashable, point: Point) -> None:
        """As :meth:`LocalRunner.start`: a stored point is ready at once, and at most ``jobs``
        tasks are in flight (the rest wait here, in order)."""
        stored = load_point(point, self.out)
        if stored is not None:
            self._ready.append((tag, stored))
        else:
            self._waiting.append((tag, point))
            self._launch()

    def _launch(self) -> None:
        while self._waiting and len(self._pending) < self.jobs:
            tag, point = self._waiting.popleft()
            self._pending[self._remote.remote(point, self.records)] = tag

    def finished(self) -> tuple[Hashable, PointResult]:
        """As :meth:`LocalRunner.finished`: a stored point first, then whichever task ends first
        (its result stored here as it arrives)."""
        import ray

        if self._ready:
            tag, r = self._ready.popleft()
        elif self._pending:
            (ref,), _ = ray.wait(list(self._pending), num_returns=1)
            tag = self._pending.pop(ref)
            r = store_point(ray.get(ref), self.out)
            self._launch()
        else:
            raise LookupError("no point in flight")
        return tag, self._count(r)


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
