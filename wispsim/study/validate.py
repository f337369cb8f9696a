"""A validation's simulated side: stored real points simulated again and compared with the real.

``wispsim validate`` stores one folder per regime, policy and N (``points/REGIME/POLICY/nN``,
:func:`point`). Its real side (the swarm against ``wispsim serve`` or an OpenAI-compatible
server, :mod:`wispsim.serve.real_points`; or a copy of another validation's real points,
:func:`copy_real`) writes the records, the server's log, the replay log and ``real.json``; this
module then simulates
the same point (:func:`store_sim`: the scenario the server served, with the engine's real KV
capacity and block size as the server reported them and the ``--sim-set`` overrides of its
policy), replays the real log (:func:`wispsim.study.replay.replay`), and writes ``done.json`` last,
so an interrupted validation resumes where it stopped. It gathers the stored points into the long
comparison table (:func:`collect`), the capacities (:func:`capacities`) and the replay table
(:func:`replays`).

Figures compared (:func:`point_metrics`): violation rate with its Wilson interval, goodput,
response speed p10 / p50, queue and verify p50 / p90 / p99, mean batch size, cold rounds, the
prefix tokens served from cache, and per policy the capacity (the largest N of the grid up to
which every N keeps the violation rate within epsilon).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.analysis.metrics import server_stats, summarize
from wispsim.config import POLICY_NAMES, Scenario, parse_set
from wispsim.config.server import upgrade_server
from wispsim.errors import ConfigError
from wispsim.model.profiles import load_profile
from wispsim.results import Results
from wispsim.sim.records import SimResult
from wispsim.sim.scenarios import Resolved, check_consistency
from wispsim.study.replay import compare as compare_replay
from wispsim.study.replay import log_scenario, read_log, replay
from wispsim.study.replay.compare import wilson

METRICS = (
    "responses",
    "violation_rate",
    "violation_lo",
    "violation_hi",
    "goodput_tps",
    "speed_p10",
    "speed_p50",
    "queue_p50_ms",
    "queue_p90_ms",
    "queue_p99_ms",
    "verify_p50_ms",
    "verify_p90_ms",
    "verify_p99_ms",
    "mean_batch_size",
    "cold_round_share",
    "cached_prefix_share",
)

TABLE_COLUMNS = ["regime", "policy", "devices", "metric", "real", "sim", "error", "rel_error"]
CAPACITY_COLUMNS = ["regime", "policy", "capacity_real", "capacity_sim", "error"]
DONE = "done.json"  # a point's folder is complete when this is there (written last)
# a real point's files (the real side writes them; --real-from copies them)
REAL_FILES = (
    "scenario.yaml",
    "real_rounds.parquet",
    "real_responses.parquet",
    "real_tokens.parquet",
    "real_batches.parquet",
    "server_batches.parquet",
    "server_members.parquet",
    "real_log.parquet",
    "real_log.parquet.meta.json",
    "real.json",
)


@dataclass(frozen=True)
class Regime:
    """A named set of scenario overrides (``--set`` strings), applied after the user's."""

    name: str
    sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class SimSide:
    """What the simulator runs for one regime and policy: ``scenario`` is the served scenario
    with the policy's ``--sim-set`` overrides (``sets``, :func:`sets_for`) applied, resolved once
    before any point; ``given`` is every ``--sim-set`` item as given (kept in ``done.json``)."""

    scenario: Scenario
    sets: tuple[str, ...] = ()
    given: tuple[str, ...] = ()

    def at(self, devices: int | None, facts: Mapping[str, Any]) -> Resolved:
        """One point's simulated scenario: ``devices`` devices (None: the scenario's) on the engine
        the server reported (:func:`with_facts`), checked once: its KV capacity is new."""
        sc = self.scenario if devices is None else self.scenario.with_devices(devices)
        return check_consistency(with_facts(sc, facts, self.sets), "--sim-set")


def point(out: Results, regime: str, policy: str, n: int) -> Results:
    """The folder of one point of the validation in ``out``."""
    return Results(out.path / "points" / regime / policy / f"n{n}", out.source)


def write_json(folder: Results, name: str, data: Any) -> None:
    """``name`` in ``folder``, written atomically (a point is complete once ``done.json`` is there)."""
    with folder.file(name) as path:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        tmp.replace(path)


def _q(x: Any, q: float) -> float:
    a = np.asarray(x, dtype=float)
    return float(np.quantile(a, q) * 1000) if len(a) else float("nan")


def point_metrics(res: SimResult) -> dict[str, float]:
    """The compared figures of one run (real or simulated): measured responses and rounds."""
    resp = res.responses[res.responses.measured]
    rounds = res.rounds[res.rounds.measured] if len(res.rounds) else res.rounds
    n = len(resp)
    k = int(resp.violated.sum()) if n else 0
    lo, hi = wilson(k, n) if n else (float("nan"), float("nan"))
    summary = summarize(res)
    goodput = float(summary[summary["class"] != "all"].goodput_tps.sum())  # summed over classes
    srv = server_stats(res.batches, res.window)
    queue: Any = (rounds.dispatch - rounds.arrival).to_numpy() if len(rounds) else []
    verify: Any = rounds.verify_time.to_numpy() if len(rounds) else []
    if len(rounds):
        prefix = (rounds.l_new + rounds.l_cached - rounds.k).clip(lower=0)
        cached_share = float(rounds.l_cached.sum() / prefix.sum()) if prefix.sum() > 0 else float("nan")
        cold = float(rounds.cold.mean())
    else:
        cached_share = cold = float("nan")
    speeds = resp.speed.to_numpy(float) if n else np.empty(0)
    return {
        "responses": float(n),
        "violation_rate": k / n if n else float("nan"),
        "violation_lo": lo,
        "violation_hi": hi,
        "goodput_tps": goodput,
        "speed_p10": float(np.quantile(speeds, 0.10)) if n else float("nan"),
        "speed_p50": float(np.quantile(speeds, 0.50)) if n else float("nan"),
        "queue_p50_ms": _q(queue, 0.5),
        "queue_p90_ms": _q(queue, 0.9),
        "queue_p99_ms": _q(queue, 0.99),
        "verify_p50_ms": _q(verify, 0.5),
        "verify_p90_ms": _q(verify, 0.9),
        "verify_p99_ms": _q(verify, 0.99),
        "mean_batch_size": float(srv["mean_batch_size"]),
        "cold_round_share": cold,
        "cached_prefix_share": cached_share,
    }


def real_summary(res: SimResult, facts: Mapping[str, Any], offset: float) -> dict[str, Any]:
    """``real.json`` of a real point: its figures, the server's facts and the swarm's timing."""
    return {
        "real": point_metrics(res),
        "server": dict(facts),
        "clock_offset_s": offset,
        "real_wall_s": res.wall_s,
        "send_lag_p50_ms": res.info.get("send_lag_p50_ms"),
        "send_lag_p99_ms": res.info.get("send_lag_p99_ms"),
    }


def sets_for(sim_sets: list[str], policy: str) -> list[str]:
    """The ``--sim-set`` items that apply to ``policy``: ``KEY=VALUE`` applies to every policy,
    ``POLICY:KEY=VALUE`` only to that one (after the general ones)."""
    general, own = [], []
    for item in sim_sets:
        head, sep, rest = item.partition(":")
        if sep and "=" not in head and "." not in head:
            if head not in POLICY_NAMES:
                raise ConfigError(
                    "--sim-set", item, f"unknown policy {head!r}; allowed: {', '.join(POLICY_NAMES)}"
                )
            if head == policy:
                own.append(rest)
        else:
            general.append(item)
    return general + own


def with_facts(sc: Scenario, facts: Mapping[str, Any], sets: tuple[str, ...] | list[str] = ()) -> Scenario:
    """``sc`` (with the ``sets`` overrides already applied) on the engine the server reported:
    its real KV capacity, and its block size where the scenario leaves it to the engine. What
    ``sets`` set stays as set (model options under test, e.g. a profile fitted from a
    deployment's batch log); a profile not chosen there must have been measured in the server's
    engine layout."""
    given = upgrade_server(parse_set(list(sets)).get("server"), "--sim-set")
    given = given if isinstance(given, dict) else {}
    engine_given = given.get("engine") if isinstance(given.get("engine"), dict) else {}
    srv = sc.server
    eng = srv.engine
    cap, bs = facts.get("kv_capacity_tokens"), facts.get("block_size")
    if cap and "kv_capacity_tokens" not in engine_given:
        eng = dataclasses.replace(eng, kv_capacity_tokens=int(cap))
    if bs and eng.block_size is None and "block_size" not in engine_given:  # the engine's, as it reported it
        eng = dataclasses.replace(eng, block_size=int(bs))
    srv = dataclasses.replace(srv, engine=eng)
    if "profile" not in given:  # a --sim-set profile is chosen on purpose
        load_profile(srv.profile).check_layout(facts.get("engine_in_process"), "scenario")
    return sc.replace(server=srv)


def store_sim(folder: Results, sim: SimSide, devices: int) -> dict[str, Any]:
    """Simulate a stored real point of ``devices`` devices (:meth:`SimSide.at`), replay its real
    log, and write ``done.json`` (real and simulated figures) last."""
    from wispsim.sim.simulation import simulate

    real = json.loads((folder / "real.json").read_text())
    resolved = sim.at(devices, real["server"])
    res = simulate(resolved)
    rows = replay_real(folder, sim.sets)
    done = {**real, "sim": point_metrics(res), "sim_sets": list(sim.given), "sim_end_s": res.sim_end}
    with folder.writing():
        folder.text("sim_scenario.yaml", resolved.scenario.to_yaml())
        folder.table("sim_rounds.parquet", res.round_records)  # type: ignore[arg-type]
        folder.table("sim_responses.parquet", res.responses)
        folder.table("sim_batches.parquet", res.batches)
        if rows is not None:
            folder.table("replay_comparison.csv", rows)
        write_json(folder, DONE, done)
    return done


def replay_real(folder: Results, sets: tuple[str, ...] | list[str]) -> pd.DataFrame | None:
    """Replay the point's real log under its own policy and compare (``wispsim replay``): the
    log's scenario with the ``sets`` overrides, on the engine the log's sidecar names."""
    path = folder / "real_log.parquet"
    if not path.is_file():
        return None
    log, meta = read_log(path)
    sc = with_facts(log_scenario(meta, str(path), parse_set(list(sets))), meta.get("server") or {}, sets)
    return compare_replay(log, replay(sc, log, meta), meta)


def copy_real(src: Path, dst: Results) -> bool:
    """Copy a stored real point (``--real-from``) into ``dst``; False when ``src`` holds none. A
    point stored before ``real.json`` existed keeps its real side in ``done.json``."""
    doc = None
    if not (src / "real.json").is_file():
        if not (src / DONE).is_file():
            return False
        done = json.loads((src / DONE).read_text())
        keep = ("real", "server", "clock_offset_s", "real_wall_s")
        doc = {k: done[k] for k in keep if k in done}
    for name in REAL_FILES:
        if (src / name).is_file():
            with dst.file(name) as p:
                shutil.copy2(src / name, p)
    if doc is not None:
        write_json(dst, "real.json", doc)
    return True


def collect(out: Results, regimes: list[Regime], policies: list[str], grid: list[int]) -> pd.DataFrame:
    """The stored points as a long table: regime, policy, N, metric, real, sim, error, rel_error."""
    rows = []
    for regime in regimes:
        for policy in policies:
            for n in grid:
                f = point(out, regime.name, policy, n) / DONE
                if not f.is_file():
                    continue
                done = json.loads(f.read_text())
                for m in METRICS:
                    real, sim = done["real"].get(m, float("nan")), done["sim"].get(m, float("nan"))
                    real = float("nan") if real is None else float(real)
                    sim = float("nan") if sim is None else float(sim)
                    rel = (sim - real) / real if real not in (0.0,) and np.isfinite(real) else float("nan")
                    rows.append(
                        {
                            "regime": regime.name,
                            "policy": policy,
                            "devices": n,
                            "metric": m,
                            "real": real,
                            "sim": sim,
                            "error": sim - real,
                            "rel_error": rel,
                        }
                    )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def replays(out: Results) -> pd.DataFrame:
    """Every stored point's replay comparison (``wispsim replay`` of its real log), one table with
    the point's regime, policy and N in front."""
    frames = []
    for f in sorted(out.path.glob("points/*/*/n*/replay_comparison.csv")):
        t = out.read_csv(str(f.relative_to(out.path)))
        t.insert(0, "devices", int(f.parts[-2][1:]))
        t.insert(0, "policy", f.parts[-3])
        t.insert(0, "regime", f.parts[-4])
        frames.append(t)
    return (
        pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=["regime", "policy", "devices"])
    )


def capacity_of(curve: Mapping[int, float], epsilon: float) -> int:
    """The largest N of the grid up to which every N keeps the violation rate within epsilon
    (0 when the smallest N already misses)."""
    cap = 0
    for n in sorted(curve):
        v = curve[n]
        if not np.isfinite(v) or v > epsilon:
            break
        cap = n
    return cap


def capacities(table: pd.DataFrame, epsilon: float) -> pd.DataFrame:
    """Capacity per regime and policy, real and simulated."""
    rows = []
    v = table[table.metric == "violation_rate"]
    for (regime, policy), g in v.groupby(["regime", "policy"], sort=False):
        real = capacity_of(dict(zip(g.devices, g.real, strict=True)), epsilon)
        sim = capacity_of(dict(zip(g.devices, g.sim, strict=True)), epsilon)
        rows.append(
            {
                "regime": regime,
                "policy": policy,
                "capacity_real": real,
                "capacity_sim": sim,
                "error": sim - real,
            }
        )
    return pd.DataFrame(rows, columns=CAPACITY_COLUMNS)
