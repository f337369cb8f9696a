"""Points: one simulation each, and a results store that survives interruption.

A *point* is one simulation: a resolved scenario, N and a seed. Its results live in
``OUT/points/<key>/`` where the key is a hash of the resolved scenario, N, the seed, the wispsim
version and the contents of the data files the scenario names (latency profiles, acceptance
trace, predictor, arrival trace: editing a profile in place makes new points); a point whose
folder is complete is never run again, so an interrupted sweep resumes where it stopped and
loses nothing it finished. Each point's ``meta.json`` records the git commit of the code that
computed it (:func:`code_commit`), so a report built from stored points can say which code made
them. Each point is deterministic given its key, so results do not depend on the runner
(:mod:`wispsim.study.runners`) that computed it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd

from wispsim.analysis.metrics import device_counts, replica_summary, summarize
from wispsim.config import Scenario
from wispsim.provenance import code_commit, file_digest
from wispsim.sim.records import StoredRecords
from wispsim.sim.scenarios import resolve_server
from wispsim.sim.simulation import simulate
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
    frames: dict[str, pd.DataFrame | StoredRecords]  # records kept per the record mode


def compute_point(point: Point, records: str = "responses") -> PointOutput:
    """Simulate one point (no disk access: safe on a remote Ray worker)."""
    res = simulate(resolve_server(point.scenario), point.devices, point.seed)
    frames: dict[str, pd.DataFrame] = {}
    if records in ("responses", "all"):
        frames["responses"] = res.responses
    if records == "all":
        frames["rounds"] = res.round_records  # a spilled run's file is copied, not loaded
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
