"""``run`` and ``replay``: one simulation, or one replay of a recorded log, into a results folder.

``run`` simulates one resolved scenario and writes its records (Parquet), per-class and
per-replica summaries, time series and, for open arrivals, the compliance figure. ``replay``
drives the simulator with the device side of a recorded deployment (its per-round log) under a
policy and compares recorded and simulated violation rates and time quantiles. Both write the
resolved scenario and a manifest beside the results (:class:`~wispsim.results.Results`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.config import Scenario, parse_set
from wispsim.errors import ConfigError
from wispsim.results import Results, check_output_file, writing
from wispsim.runs.resolve import (
    Options,
    apply_options,
    blaming,
    check_poisson_rate,
    check_series_step,
    load,
    resolve,
)
from wispsim.sim.records import SimResult
from wispsim.sim.simulation import simulate

# what a long step shows while it runs: ``with status("simulating ..."):`` (the CLI's spinner)
Status = Callable[[str], AbstractContextManager[Any]]


def _quiet(_: str) -> AbstractContextManager[Any]:
    return nullcontext()


@dataclass
class RunOutcome:
    """What ``run`` produced: the folder, the scenario, the records and the tables it wrote."""

    folder: Path
    scenario: Scenario
    result: SimResult
    summary: pd.DataFrame
    per_replica: pd.DataFrame
    bursts: pd.DataFrame | None
    notes: list[str] = field(default_factory=list)


def describe_load(sc: Scenario, devices: int | None = None) -> str:
    """The offered load in a few words: ``N=12``, ``Poisson 3 responses/s, 2 replicas``."""
    a = sc.arrivals
    reps = f", {sc.server.replicas} replicas" if sc.server.replicas > 1 else ""
    if a.process == "closed":
        return f"N={devices or sc.devices.count}{reps}"
    if a.process == "poisson":
        return f"Poisson {a.rate:g} responses/s{reps}"
    kind = "request" if a.process == "requests" else a.kind  # a request trace has no kind of its own
    return f"{kind} trace {Path(a.trace or '').name}{reps}"


def run(
    file: Path | None,
    sets: list[str] | None,
    options: Options,
    out: Path | None = None,
    log: Path | None = None,
    step: float = 10.0,
    window: float = 60.0,
    status: Status = _quiet,
) -> RunOutcome:
    """Resolve, simulate and write one run (see the module text); ``log`` also writes the
    per-round log ``replay`` reads."""
    folder = Results.planned(out, "run")  # every output checked before any work
    if log is not None:
        check_output_file(log, "--log", (".parquet", ".csv"))
    check_poisson_rate(options.arrivals)
    resolved = resolve(file, sets, options)
    sc = resolved.scenario
    if log is not None:
        from wispsim.study.replay import check_loggable

        check_loggable(sc, log)  # a centralized run has no rounds to log: refused before it runs
    wl = sc.workload
    check_series_step(step, wl.warmup_s + wl.duration_s + sc.drain_limit_s())
    with status(f"simulating {describe_load(sc)} under {sc.policy} ..."):
        res = simulate(resolved)  # as resolved: nothing is loaded or checked again
    return write_run(folder, res, log, step, window)


def write_run(folder: Results, res: SimResult, log: Path | None, step: float, window: float) -> RunOutcome:
    """A run's results folder: scenario, records, summaries, time series, figure, manifest last."""
    from wispsim.analysis.metrics import replica_summary, summarize
    from wispsim.analysis.timeseries import write_timeseries
    from wispsim.plots import compliance_figure

    sc = res.scenario
    summary, per_replica = summarize(res), replica_summary(res)
    with folder.writing():
        folder.text("scenario.yaml", sc.to_yaml())
        folder.table("rounds.parquet", res.round_records)
        folder.table("batches.parquet", res.batches)
        folder.table("responses.parquet", res.responses)
        folder.table("summary.csv", summary)
        folder.table("replicas.csv", per_replica)
        comp, server, bursts = write_timeseries(res, folder, step, window)
        if sc.arrivals.process != "closed":
            with folder.file("compliance.png") as p:
                compliance_figure(res, comp, server, window, p)
        if log is not None:
            from wispsim.study.replay import write_log

            with writing("--log", log):
                write_log(res, log)
        folder.finish(
            {
                "seed": sc.seed,
                "devices": sc.devices.count,
                "policy": sc.policy,
                "sim_end_s": res.sim_end,
                "wall_s": res.wall_s,
                **res.info,
            }
        )
    return RunOutcome(folder.path, sc, res, summary, per_replica, bursts)


@dataclass
class ReplayOutcome:
    """What ``replay`` produced: the folder, the replay's result, the comparison table."""

    folder: Path
    scenario: Scenario
    result: Any  # study.replay's ReplayResult
    comparison: pd.DataFrame
    meta: dict[str, Any]
    about: str  # what was replayed, in a line
    notes: list[str] = field(default_factory=list)


# the scenario sections a replay log fixes (what its devices did, when, and the window)
LOG_FIXED = ("devices", "workload", "arrivals", "drafting", "acceptance", "network")


def replay(
    log: Path,
    file: Path | None,
    sets: list[str] | None,
    policy: str | None,
    seed: int | None,
    out: Path | None = None,
    status: Status = _quiet,
) -> ReplayOutcome:
    """Replay a recorded deployment's device side under ``policy`` (default: the recorded one)
    and compare recorded and simulated. The scenario is the log's; a file replaces it, ``sets``
    override."""
    from wispsim.model.profiles import load_profile
    from wispsim.study.replay import compare, describe, log_scenario, meta_path, read_log
    from wispsim.study.replay import replay as replay_log

    folder = Results.planned(out, "replay")  # checked before any work
    for item in sets or []:  # the log fixes the devices' side: such a setting would go unread
        key = item.partition("=")[0].strip()
        if key.split(".")[0] in LOG_FIXED:
            raise ConfigError(
                "--set",
                key,
                f"the log fixes the devices' side ({', '.join(LOG_FIXED)}: their rounds, lengths, times "
                "and window as recorded); replay changes the server side (server.*, policy, seed)",
            )
    frame, meta = read_log(log)
    if file is not None:  # checked once, by the replay, as it runs (its window and devices)
        sc = apply_options(load(file, sets), Options(policy=policy))
    else:
        sc = log_scenario(meta, str(meta_path(log)), parse_set(sets or []))
        if policy is not None:
            with blaming({"policy": "--policy"}):
                sc = sc.with_policy(policy)
    notes = []
    if file is None and not any(s.startswith("server.profile=") for s in sets or []):
        # the recorded server's profile: it must be one measured in that server's engine layout
        served = (meta.get("server") or {}).get("engine_in_process")
        load_profile(sc.server.profile).check_layout(served, str(meta_path(log)))
    server_host = (meta.get("server") or {}).get("host")
    if isinstance(server_host, dict) and server_host:  # the host the recorded timings come from
        notes += host_notes(sc.server.profile, server_host)
    about = describe(sc, meta)
    with status(f"replaying {frame.device.nunique()} devices, {len(frame)} rounds under {sc.policy} ..."):
        res = replay_log(sc, frame, meta, seed)
    comparison = compare(frame, res, meta)
    with folder.writing():
        folder.text("scenario.yaml", res.scenario.to_yaml())
        folder.table("rounds.parquet", res.round_records)
        folder.table("batches.parquet", res.batches)
        folder.table("responses.parquet", res.responses)
        folder.table("comparison.csv", comparison)
        folder.finish(
            {
                "log": str(log),
                "recorded_policy": meta.get("policy"),
                "policy": sc.policy,
                "seed": res.seed,
                "devices": res.devices,
                "sim_end_s": res.sim_end,
                "wall_s": res.wall_s,
            }
        )
    return ReplayOutcome(folder.path, sc, res, comparison, meta, about, notes)


def host_notes(profile: str, here: dict[str, Any] | None = None) -> list[str]:
    """A line when ``profile`` was measured on a CPU host unlike ``here`` (this host when None):
    :func:`wispsim.host.host_note`."""
    from wispsim.host import cpu_facts, host_note
    from wispsim.model.profiles import load_profile

    prof = load_profile(profile)
    measured = prof.provenance.get("host")
    note = host_note(prof.name, measured if isinstance(measured, dict) else None, here or cpu_facts())
    return [note] if note else []
