"""Runners: where a list of points is computed -- a local process pool, or Ray.

Both check the store first and keep each finished point (:mod:`wispsim.study.points`), so a
killed sweep rerun with the same command redoes nothing it finished, whichever runner ran it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from wispsim.provenance import code_commit
from wispsim.study.points import Point, PointResult, compute_point, load_point, run_point, store_point


class LocalRunner:
    """Runs points serially (jobs=1) or in a local process pool."""

    def __init__(self, jobs: int, out: Path | None, records: str = "responses") -> None:
        self.jobs = max(1, jobs)
        self.out = out
        self.records = records
        self._pool: ProcessPoolExecutor | None = None
        self.computed = self.loaded = 0
        self.commits: dict[str, int] = {}  # git commit that computed each point -> points

    def __enter__(self) -> LocalRunner:
        code_commit()  # once, here: forked workers inherit it, and edits made mid-sweep don't show
        if self.jobs > 1:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

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
                ray.init(num_cpus=self._jobs, include_dashboard=False, log_to_driver=False)
            self._started = True
        self.jobs = max(1, self._jobs or int(ray.cluster_resources().get("CPU", 1)))
        self._remote: Any = ray.remote(compute_point)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            import ray

            ray.shutdown()

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
