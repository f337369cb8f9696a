"""Running many simulations: points, a results store that survives interruption, and sweeps.

A *point* is one simulation: a resolved scenario, N and a seed. Its results live in
``OUT/points/<key>/`` where the key is a hash of the resolved scenario, N, the seed, the wispsim
version and the contents of the data files the scenario names (latency profiles, acceptance
trace, predictor, arrival trace: editing a profile in place makes new points); a point whose
folder is complete is never run again, so an interrupted sweep resumes where it stopped and
loses nothing it finished. Each point's ``meta.json`` records the git commit of the code that
computed it (:func:`code_commit`), so a report built from stored points can say which code made
them. Points run in a local process pool
(``--jobs``); each is deterministic given its key, so results do not depend on the pool.

:func:`capacity_sweep` drives one :class:`~wispsim.study.capacity_search.CapacitySearch` per (policy, group)
in waves: each wave asks every unfinished search for its next N values and runs all their points
(times seeds) in parallel.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim import __version__
from wispsim.analysis.metrics import device_counts, replica_summary, summarize
from wispsim.config import Scenario
from wispsim.provenance import code_commit, file_digest
from wispsim.sim.engine import simulate
from wispsim.study.capacity_search import CapacitySearch, pooled_stats

RECORD_MODES = ("none", "responses", "all")


def input_files(scenario: Scenario) -> dict[str, Path | None]:
    """The data files a scenario reads besides itself, by role (None: not found here)."""
    from wispsim.errors import WispsimError

    def find(fn: Callable[[str], Path], name: str) -> Path | None:
        try:
            return fn(name)
        except WispsimError:
            return None

    from wispsim.model.acceptance import find_trace
    from wispsim.model.predictor import find_predictor
    from wispsim.model.profiles import find_profile
    from wispsim.sim.arrivals import find_arrival_trace

    sv = scenario.server
    files: dict[str, Path | None] = {}
    for name in dict.fromkeys(sv.replica_profiles or (sv.profile,)):
        files[f"profile:{name}"] = find(find_profile, name)
    if scenario.acceptance.model == "trace" and scenario.acceptance.trace:
        files["acceptance.trace"] = find(find_trace, scenario.acceptance.trace)
    pred = scenario.drafting.predictor
    if scenario.drafting.controller == "predictor" and pred.path:
        files["drafting.predictor"] = find(find_predictor, pred.path)
    if scenario.arrivals.process == "trace" and scenario.arrivals.trace:
        files["arrivals.trace"] = find(find_arrival_trace, scenario.arrivals.trace)
    return files


def input_digests(scenario: Scenario) -> dict[str, str]:
    """Content hashes of :func:`input_files` (cached per file, size and modification time)."""
    out = {}
    for role, path in input_files(scenario).items():
        if path is None:
            out[role] = "missing"
        else:
            out[role] = file_digest(path)
    return out


@dataclass(frozen=True)
class Point:
    scenario: Scenario
    devices: int
    seed: int

    @cached_property
    def key(self) -> str:
        blob = json.dumps(
            {
                "scenario": self.scenario.to_dict(),
                "devices": self.devices,
                "seed": self.seed,
                "version": __version__,
                "inputs": input_digests(self.scenario),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class PointResult:
    key: str
    summary: pd.DataFrame
    counts: pd.DataFrame
    replicas: pd.DataFrame | None = None  # per-replica load (replicas.csv)
    computed: bool = False  # simulated now (False: loaded from the store)
    commit: str = "unknown"  # git commit of the code that computed it (meta.json)


def _write_atomic_dir(final: Path, write: Callable[[Path], None]) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write(tmp)
        if final.exists():
            shutil.rmtree(tmp)
            return
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_point(point: Point, out: Path | None) -> PointResult | None:
    """A point's stored results, or None if ``out`` does not hold it complete."""
    folder = out / "points" / point.key if out is not None else None
    if folder is None or not (folder / "summary.csv").is_file():
        return None
    reps = folder / "replicas.csv"
    try:
        commit = str(json.loads((folder / "meta.json").read_text()).get("commit", "unknown"))
    except (OSError, ValueError, AttributeError):
        commit = "unknown"
    return PointResult(
        point.key,
        pd.read_csv(folder / "summary.csv", dtype={"class": str}),
        pd.read_csv(folder / "devices.csv"),
        pd.read_csv(reps) if reps.is_file() else None,
        commit=commit,
    )


@dataclass
class PointOutput:
    """Everything one simulated point stores (computed anywhere, stored by whoever holds ``out``)."""

    point: Point
    summary: pd.DataFrame
    counts: pd.DataFrame
    replicas: pd.DataFrame
    meta: dict[str, object]
    frames: dict[str, pd.DataFrame]  # records kept per the record mode


def compute_point(point: Point, records: str = "responses") -> PointOutput:
    """Simulate one point (no disk access: safe on a remote Ray worker)."""
    res = simulate(point.scenario, point.devices, point.seed)
    frames: dict[str, pd.DataFrame] = {}
    if records in ("responses", "all"):
        frames["responses"] = res.responses
    if records == "all":
        frames["rounds"] = res.rounds
        frames["batches"] = res.batches
    meta = {
        "devices": point.devices,
        "seed": point.seed,
        "key": point.key,
        "version": __version__,
        "sim_end_s": res.sim_end,
        "wall_s": res.wall_s,
        **res.info,
    }
    return PointOutput(point, summarize(res), device_counts(res), replica_summary(res), meta, frames)


def store_point(output: PointOutput, out: Path | None) -> PointResult:
    """Write a computed point under ``out/points/<key>/`` atomically (summary.csv last)."""
    point = output.point
    meta = {**output.meta, "commit": code_commit(), "inputs": input_digests(point.scenario)}
    if out is not None:

        def write(d: Path) -> None:
            (d / "scenario.yaml").write_text(point.scenario.to_yaml())
            (d / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
            for name, df in output.frames.items():
                df.to_parquet(d / f"{name}.parquet", index=False)
            output.counts.to_csv(d / "devices.csv", index=False)
            output.replicas.to_csv(d / "replicas.csv", index=False)
            output.summary.to_csv(d / "summary.csv", index=False)  # written last: marks completion

        _write_atomic_dir(out / "points" / point.key, write)
    return PointResult(
        point.key, output.summary, output.counts, output.replicas, computed=True, commit=str(meta["commit"])
    )


def run_point(point: Point, out: Path | None, records: str = "responses") -> PointResult:
    """Run one point, or load it if ``out`` already holds it."""
    done = load_point(point, out)
    if done is not None:
        return done
    return store_point(compute_point(point, records), out)


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


@dataclass(frozen=True)
class Group:
    """What one capacity question puts on the server: one class alone, or a shared mix."""

    label: str
    classes: tuple[float, ...]


def groups_for(classes: Iterable[float], mix: str) -> list[Group]:
    cls = tuple(float(c) for c in classes)
    if mix == "shared":
        return [Group("mix:" + ",".join(f"{c:g}" for c in cls), cls)]
    return [Group(f"{c:g}", (c,)) for c in cls]


@dataclass
class SweepResult:
    capacity: pd.DataFrame
    curve: pd.DataFrame
    pooled: pd.DataFrame


def capacity_sweep(
    base: dict[str, Scenario],
    groups: list[Group],
    seeds: list[int],
    epsilon: float,
    runner: Runner,
    grid: tuple[int, ...] = (),
    start: int = 8,
    max_devices: int = 4096,
    progress: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Capacity of every (policy, group); ``base`` maps policy name -> resolved scenario."""
    searches = {
        (pol, g.label): CapacitySearch(epsilon, start=start, max_devices=max_devices, grid=grid)
        for pol in base
        for g in groups
    }
    group_of = {g.label: g for g in groups}
    curve_rows: list[pd.DataFrame] = []
    pooled_rows: list[dict[str, object]] = []
    planned = finished = 0

    def tick() -> None:
        nonlocal finished
        finished += 1
        if progress:
            progress(finished, planned)

    while True:
        wave: list[tuple[tuple[str, str], int]] = []
        for key, s in searches.items():
            wave.extend((key, n) for n in s.next_devices())
        if not wave:
            break
        points: list[Point] = []
        for (pol, label), n in wave:
            sc = base[pol].with_devices(n, group_of[label].classes)
            points.extend(Point(sc, n, seed) for seed in seeds)
        planned += len(points)
        if progress:
            progress(finished, planned)
        results = runner.map(points, tick)
        it = iter(results)
        for (pol, label), n in wave:
            counts = []
            for seed in seeds:
                r = next(it)
                summ = r.summary.rename(columns={"devices": "class_devices"})
                summ.insert(0, "seed", seed)
                summ.insert(0, "devices", n)
                summ.insert(0, "group", label)
                summ.insert(0, "policy", pol)
                summ["point"] = r.key
                curve_rows.append(summ)
                c = r.counts.copy()
                c["seed"] = seed
                counts.append(c)
            allc = pd.concat(counts, ignore_index=True)
            stats = pooled_stats(n, allc)
            searches[(pol, label)].evaluated[n] = stats
            for cls, rate in stats.per_class.items():
                pooled_rows.append(
                    {
                        "policy": pol,
                        "group": label,
                        "class": cls,
                        "devices": n,
                        "seeds": len(seeds),
                        "responses": int(allc[allc.slo == float(cls)].responses.sum()),
                        "violation_rate": rate,
                        "decision_violation": stats.violation,
                        "decision_ci_low": stats.ci_low,
                        "decision_ci_high": stats.ci_high,
                    }
                )
    cap_rows = []
    for (pol, label), s in searches.items():
        lo, hi = s.interval()
        cap_rows.append(
            {
                "policy": pol,
                "class": label,
                "capacity": s.capacity,
                "ci_low": lo,
                "ci_high": hi,
                "saturated": s.saturated,
                "evaluated": len(s.evaluated),
            }
        )
    curve = pd.concat(curve_rows, ignore_index=True) if curve_rows else pd.DataFrame()
    if not curve.empty:
        curve = curve.sort_values(["policy", "group", "class", "devices", "seed"], kind="stable")
    pooled = pd.DataFrame(pooled_rows)
    if not pooled.empty:
        pooled = pooled.sort_values(["policy", "group", "class", "devices"], kind="stable")
    return SweepResult(pd.DataFrame(cap_rows), curve.reset_index(drop=True), pooled.reset_index(drop=True))
