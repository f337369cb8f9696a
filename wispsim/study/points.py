"""Points: one configuration under its seeds, and a results store that survives interruption.

A *point* is a resolved scenario, N and its seeds: one simulation per seed, run together
(:mod:`wispsim.study.stopping`: a capacity search's points stop together once their answer is
known; a point without a stopping rule runs each seed to its horizon). Its results live in
``OUT/points/<key>/`` (every table with a ``seed`` column) where the key is a hash of the
resolved scenario, N, the seeds, the stopping rule, the wispsim version and the contents of the
data files the scenario names (latency profiles, acceptance trace, predictor, arrival trace:
editing a profile in place makes new points); a point whose
folder is complete is never run again, so an interrupted sweep resumes where it stopped and
loses nothing it finished. Each point's ``meta.json`` records the git commit of the code that
computed it (:func:`code_commit`), so a report built from stored points can say which code made
them. Each point is deterministic given its key, so results do not depend on the runner
(:mod:`wispsim.study.runners`) that computed it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.analysis.metrics import device_counts, replica_summary, summarize
from wispsim.config import Scenario
from wispsim.native import used as hot_path
from wispsim.provenance import code_commit, file_digest
from wispsim.sim.records import StoredRecords
from wispsim.sim.scenarios import resolve_server
from wispsim.sim.simulation import Run
from wispsim.study.stopping import UNRULED, Stop, Stopping, run_together
from wispsim.version import __version__

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
    if scenario.arrivals.process in ("trace", "requests") and scenario.arrivals.trace:
        files["arrivals.trace"] = find(find_arrival_trace, scenario.arrivals.trace)
    return files


def input_digests(scenario: Scenario) -> dict[str, str]:
    """Content hashes of :func:`input_files` (cached per file, size and modification time), and of
    the model's own shipped data (:func:`model_data_digest`)."""
    out = {"model_data": model_data_digest()}
    for role, path in input_files(scenario).items():
        if path is None:
            out[role] = "missing"
        else:
            out[role] = file_digest(path)
    return out


def model_data_digest() -> str:
    """One content hash of the data the model prices with, shipped in ``wispsim/data`` (GPUs,
    interconnects, kernel efficiencies, architectures, the public calibration, the host CPU's
    measured costs, speculation) -- not its scenario presets or prices: a point stored before a
    re-fit or a new measurement is computed again, not loaded."""
    from wispsim.paths import data_dir

    root = data_dir()
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("scenarios/") or rel == "gpu_prices.yaml":
            continue
        h.update(f"{rel}:{file_digest(path)}\n".encode())
    return h.hexdigest()[:16]


# Fields added after points were stored, with the value that simulates exactly as before they
# existed: left out of a point's key at that value, so stored points stay valid (a scenario that
# sets another value hashes it).
NEUTRAL_DEFAULTS: dict[tuple[str, ...], Any] = {("server", "engine", "batching"): "continuous"}


def key_dict(scenario: Scenario) -> dict[str, Any]:
    """What a point's key hashes of ``scenario``: every field it runs with
    (``to_dict(complete=True)``) less :data:`NEUTRAL_DEFAULTS` at their neutral value."""
    out = scenario.to_dict(complete=True)
    for path, neutral in NEUTRAL_DEFAULTS.items():
        *parents, name = path
        node = out
        for p in parents:
            node = node[p]
        if node.get(name) == neutral:
            del node[name]
    return out


def model_revisions(scenario: Scenario, devices: int) -> dict[str, Any]:
    """Changes of the model made after points were stored, named in the key of exactly the
    points whose outcome they can change (the rest keep their keys and stored results):
    ``resident_slots`` (issue 46): a resident session holds one of vLLM's ``max_num_seqs`` request
    slots, which only binds a closed loop of more devices than one replica's slots (each device
    has one response in flight at most) or open arrivals."""
    srv = scenario.server
    resident = srv.mode == "speculative" and srv.verifier.kind == "resident"
    # one replica's slots: with several, uneven routing can fill one replica's first
    can_bind = scenario.arrivals.process != "closed" or devices > srv.engine.max_num_seqs
    return {"resident_slots": 1} if resident and srv.verifier.kv_policy == "admission" and can_bind else {}


@dataclass(frozen=True)
class Point:
    """``scenario`` with ``devices`` devices under each of ``seeds`` (one seed: an int), stopped
    by ``stopping`` (None: every seed to its horizon)."""

    scenario: Scenario
    devices: int
    seeds: tuple[int, ...]
    stopping: Stopping | None = None

    def __post_init__(self) -> None:
        if isinstance(self.seeds, int):
            object.__setattr__(self, "seeds", (self.seeds,))

    @cached_property
    def key(self) -> str:
        blob = json.dumps(
            {
                "scenario": key_dict(self.scenario),
                "devices": self.devices,
                "seeds": list(self.seeds),
                "stopping": self.stopping.to_dict() if self.stopping else None,
                "version": __version__,
                "inputs": input_digests(self.scenario),
                **model_revisions(self.scenario, self.devices),
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class PointResult:
    """A point's tables, each with a ``seed`` column: ``summary`` (per class), ``counts`` (per
    device: the clusters of the capacity bootstrap), ``replicas``; ``stop`` how it ended
    (:class:`~wispsim.study.stopping.Stop`: ``how`` and ``window_end``)."""

    key: str
    summary: pd.DataFrame
    counts: pd.DataFrame
    replicas: pd.DataFrame | None = None  # per-replica load (replicas.csv)
    computed: bool = False  # simulated now (False: loaded from the store)
    commit: str = "unknown"  # git commit of the code that computed it (meta.json)
    stop: Stop = field(default_factory=lambda: Stop(UNRULED, math.nan))

    def seed(self, seed: int) -> PointResult:
        """This point's tables of one seed (without the ``seed`` column)."""

        def mine(df: pd.DataFrame | None) -> pd.DataFrame | None:
            if df is None:
                return None
            return df[df.seed == seed].drop(columns="seed").reset_index(drop=True)

        return PointResult(
            self.key, mine(self.summary), mine(self.counts), mine(self.replicas),  # type: ignore[arg-type]
            self.computed, self.commit, self.stop,
        )  # fmt: skip


def _write_atomic_dir(final: Path, write: Callable[[Path], None]) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        write(tmp)
        if final.exists():
            shutil.rmtree(tmp)
            return
        try:
            os.replace(tmp, final)
        except OSError as e:  # another process wrote the same point meanwhile: the first one stays
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# what a stored point's tables must hold to be used again (else it is simulated again)
SUMMARY_NEEDS = {"seed", "class", "devices", "responses", "violation_rate"}
COUNTS_NEEDS = {"seed", "device", "slo", "violated", "responses"}


def load_point(point: Point, out: Path | None) -> PointResult | None:
    """A point's stored results, or None if ``out`` does not hold it complete."""
    folder = out / "points" / point.key if out is not None else None
    if folder is None or not (folder / "summary.csv").is_file():
        return None
    reps = folder / "replicas.csv"
    try:
        meta = json.loads((folder / "meta.json").read_text())
        commit = str(meta.get("commit", "unknown"))
        stop = Stop(str(meta["stop"]), float(meta["window_end_s"]), bool(meta["stopped_early"]))
        summary = pd.read_csv(folder / "summary.csv", dtype={"class": str})
        counts = pd.read_csv(folder / "devices.csv")
        replicas = pd.read_csv(reps) if reps.is_file() else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):  # a pandas parse error is a ValueError
        return None  # not a point of this layout, or damaged: simulate it again
    if set(summary.columns) >= SUMMARY_NEEDS and set(summary["seed"]) != set(point.seeds):
        return None  # a seed's summary missing: simulate it again
    for df, need in ((summary, SUMMARY_NEEDS), (counts, COUNTS_NEEDS)):  # (a seed without measured
        if not need <= set(df.columns):  # responses has no device rows)
            return None  # damaged (columns missing): simulate it again
        if df[sorted(need - {"violation_rate"})].isna().any().any():  # a class without responses: NaN
            return None
    return PointResult(point.key, summary, counts, replicas, commit=commit, stop=stop)


@dataclass
class PointOutput:
    """Everything one simulated point stores (computed anywhere, stored by whoever holds ``out``)."""

    point: Point
    summary: pd.DataFrame
    counts: pd.DataFrame
    replicas: pd.DataFrame
    meta: dict[str, object]
    frames: dict[str, pd.DataFrame | StoredRecords]  # records kept per the record mode
    stop: Stop


def _with_seed(df: pd.DataFrame, seed: int) -> pd.DataFrame:
    out = df.copy()
    out.insert(0, "seed", seed)
    return out


def compute_point(point: Point, records: str = "responses") -> PointOutput:
    """Simulate one point, its seeds together (no disk access: safe on a remote Ray worker)."""
    wall0 = time.perf_counter()
    resolved = resolve_server(point.scenario)
    runs = [Run(resolved, point.devices, seed) for seed in point.seeds]
    stop = run_together(runs, resolved.scenario.workload.window(), point.stopping)
    results = [r.result() for r in runs]
    frames: dict[str, pd.DataFrame | StoredRecords] = {}
    for seed, res in zip(point.seeds, results, strict=True):
        tail = "" if len(point.seeds) == 1 else f"-seed{seed}"
        if records in ("responses", "all"):
            frames["responses" + tail] = res.responses
        if records == "all":
            frames["rounds" + tail] = res.round_records  # a spilled run's file is copied, not loaded
            frames["batches" + tail] = res.batches
    meta = {
        "devices": point.devices,
        "seeds": list(point.seeds),
        "key": point.key,
        "version": __version__,
        "stop": stop.how,
        "window_end_s": stop.window_end,
        "stopped_early": stop.early,
        "stopping": point.stopping.to_dict() if point.stopping else None,
        "sim_end_s": [res.sim_end for res in results],
        "wall_s": time.perf_counter() - wall0,  # the seeds together
        "hot_path": hot_path()[0],  # compiled or pure (wispsim.native): the same numbers
        **results[0].info,
    }
    tables = [(summarize(r), device_counts(r), replica_summary(r)) for r in results]
    summary, counts, replicas = (
        pd.concat([_with_seed(t[i], s) for s, t in zip(point.seeds, tables, strict=True)], ignore_index=True)
        for i in range(3)
    )
    return PointOutput(point, summary, counts, replicas, meta, frames, stop)


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
        point.key, output.summary, output.counts, output.replicas,
        computed=True, commit=str(meta["commit"]), stop=output.stop,
    )  # fmt: skip


def run_point(point: Point, out: Path | None, records: str = "responses") -> PointResult:
    """Run one point, or load it if ``out`` already holds it."""
    done = load_point(point, out)
    if done is not None:
        return done
    return store_point(compute_point(point, records), out)
