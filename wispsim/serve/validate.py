"""``wispsim validate``: the real deployment and the simulator, side by side.

For each regime (a set of scenario overrides: compute-bound, memory pressure), each policy and
each N of the grid: start ``wispsim serve`` for the policy (a child process; one per regime and
policy, reset between points), run the swarm (:func:`wispsim.serve.swarm.run_swarm`) for the
scenario's window and drain, then simulate the same scenario (same devices, classes, lengths,
trace, link delays, the engine's measured profile, and its real KV capacity and block size), and
replay the real log with :func:`wispsim.study.replay.replay`. Each point is stored in its own
folder when it is complete (``done.json`` last), so an interrupted validation resumes where it
stopped; the server child is stopped whatever happens.

Figures compared (:func:`point_metrics`): violation rate with its Wilson interval, goodput,
response speed p10 / p50, queue and verify p50 / p90 / p99, mean batch size, cold rounds, the
prefix tokens served from cache, and per policy the capacity (the largest N of the grid up to
which every N keeps the violation rate within epsilon).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wispsim.analysis.metrics import server_stats, summarize
from wispsim.config import POLICY_NAMES, Scenario, parse_set
from wispsim.errors import ConfigError, WispsimError
from wispsim.model.profiles import load_profile
from wispsim.serve.app import ModelSource
from wispsim.serve.process import ServerProcess
from wispsim.serve.swarm import Server, SwarmRun, probe, run_swarm
from wispsim.sim.engine import simulate
from wispsim.sim.inputs import load_scenario
from wispsim.sim.records import SimResult
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


@dataclass(frozen=True)
class Regime:
    """A named set of scenario overrides (``--set`` strings)."""

    name: str
    sets: tuple[str, ...] = ()

    def scenario(self, path: Path | None, sets: list[str]) -> Scenario:
        """The scenario file (or the default) with the user's ``--set`` and then this regime's."""
        return load_scenario(path, parse_set([*sets, *self.sets]))


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
    queue = (rounds.dispatch - rounds.arrival).to_numpy() if len(rounds) else []
    verify = rounds.verify_time.to_numpy() if len(rounds) else []
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


def point_folder(out: Path, regime: str, policy: str, n: int) -> Path:
    return out / "points" / regime / policy / f"n{n}"


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


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


def store_real(folder: Path, sc: Scenario, real: SwarmRun) -> dict[str, Any]:
    """Write one point's real side: the swarm's records, the server's log, the replay log, and
    ``real.json`` (its figures and the server's facts)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scenario.yaml").write_text(sc.to_yaml())
    r = real.result
    real.write_records(folder, "real_")
    real.write_log(folder / "real_log.parquet")
    doc = {
        "real": point_metrics(r),
        "server": real.facts,
        "clock_offset_s": real.offset,
        "real_wall_s": r.wall_s,
        "send_lag_p50_ms": r.info.get("send_lag_p50_ms"),
        "send_lag_p99_ms": r.info.get("send_lag_p99_ms"),
    }
    _write_json(folder / "real.json", doc)
    return doc


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


def simulated_scenario(sc: Scenario, facts: Mapping[str, Any], sim_sets: list[str]) -> Scenario:
    """What the simulator runs for a real point: the served scenario with the engine's real KV
    capacity and block size (as the server reported them), then the ``sim_sets`` overrides that apply to its
    policy (:func:`sets_for`: model options under test, e.g. a profile fitted from a
    deployment's batch log)."""
    sim_sets = sets_for(sim_sets, sc.policy)
    data = sc.to_dict()
    cap, bs = facts.get("kv_capacity_tokens"), facts.get("block_size")
    if cap:
        data = {**data, "server": {**data["server"], "kv_capacity_tokens": int(cap)}}
    if bs and data["server"].get("block_size") is None:  # the engine's, as it reported it
        data = {**data, "server": {**data["server"], "block_size": int(bs)}}
    sim = load_scenario(None, parse_set(sim_sets), base=data, source="--sim-set")
    if not any(s.startswith("server.profile=") for s in sim_sets):  # a --sim-set profile is chosen on purpose
        load_profile(sim.server.profile).check_layout(facts.get("engine_in_process"), "scenario")
    return sim


def store_sim(folder: Path, sc: Scenario, sim_sets: list[str]) -> dict[str, Any]:
    """Simulate a stored real point (:func:`simulated_scenario`), replay its real log, and write
    ``done.json`` (real and simulated figures) last."""
    real = json.loads((folder / "real.json").read_text())
    sim_sc = simulated_scenario(sc, real["server"], sim_sets)
    sim = simulate(sim_sc)
    (folder / "sim_scenario.yaml").write_text(sim_sc.to_yaml())
    sim.round_records.to_parquet(folder / "sim_rounds.parquet")
    sim.responses.to_parquet(folder / "sim_responses.parquet", index=False)
    sim.batches.to_parquet(folder / "sim_batches.parquet", index=False)
    rows = replay_real(folder, sim_sets)
    if rows is not None:
        rows.to_csv(folder / "replay_comparison.csv", index=False)
    done = {**real, "sim": point_metrics(sim), "sim_sets": sim_sets, "sim_end_s": sim.sim_end}
    _write_json(folder / DONE, done)
    return done


def replay_real(folder: Path, sim_sets: list[str]) -> pd.DataFrame | None:
    """Replay the point's real log under its own policy and compare (``wispsim replay``), with
    the engine's real KV capacity and the ``sim_sets`` overrides."""
    path = folder / "real_log.parquet"
    if not path.is_file():
        return None
    log, meta = read_log(path)
    sc = simulated_scenario(log_scenario(meta, str(path)), meta.get("server") or {}, sim_sets)
    return compare_replay(log, replay(sc, log, meta), meta)


def validate(
    scenario: Path | None,
    sets: list[str],
    regimes: list[Regime],
    policies: list[str],
    grid: list[int],
    source: ModelSource | None,
    out: Path,
    port: int = 8011,
    say: Callable[[str], None] = print,
    progress: Callable[[str, float, float], None] | None = None,
    sim_sets: list[str] | None = None,
    real_from: Path | None = None,
    openai: Server | None = None,
) -> pd.DataFrame:
    """Run every (regime, policy, N) point not stored yet; return the long comparison table.

    ``sim_sets`` override the simulated side only; with ``real_from`` (a validation folder) no
    server runs: its real points are copied and simulated again (a model change, before/after);
    with ``openai`` (:class:`wispsim.serve.openai.OpenAIServer`) no server is started either: the
    swarm drives that one, which is not reset between points (it has no way to be).
    """
    sim_sets = list(sim_sets or [])
    for regime in regimes:
        sc_r = regime.scenario(scenario, sets)
        for policy in policies:
            sc = sc_r.with_policy(policy)
            todo = [n for n in grid if not (point_folder(out, regime.name, policy, n) / DONE).is_file()]
            if not todo:
                continue
            if real_from is not None:  # the real side is stored: simulate it again
                for n in todo:
                    src = point_folder(real_from, regime.name, policy, n)
                    _real_json(src)
                    if not (src / "real.json").is_file():
                        say(f"{regime.name} / {policy} / N={n}: no real point in {real_from}; skipped")
                        continue
                    dst = point_folder(out, regime.name, policy, n)
                    dst.mkdir(parents=True, exist_ok=True)
                    for name in REAL_FILES:
                        if (src / name).is_file():
                            shutil.copy2(src / name, dst / name)
                    _report(
                        say, f"{regime.name} / {policy} / N={n}", store_sim(dst, sc.with_devices(n), sim_sets)
                    )
                continue
            if openai is not None:  # a running server: checked, and the simulated side with it
                simulated_scenario(sc, probe(sc, openai), sim_sets)
                for n in todo:
                    _point(out, regime.name, policy, n, sc, openai, sim_sets, say, progress)
                continue
            if source is None:
                raise WispsimError("validate: give --arch or --model to run the real side (or --real-from)")
            scen_file = out / "scenarios" / f"{regime.name}-{policy}.yaml"
            scen_file.parent.mkdir(parents=True, exist_ok=True)
            scen_file.write_text(sc.to_yaml())
            say(f"{regime.name} / {policy}: starting wispsim serve ...")
            log_file = out / "logs" / f"serve-{regime.name}-{policy}.log"
            server = ServerProcess(scen_file, policy, source, port, log_file)
            try:
                server.wait_ready()
                for n in todo:
                    server.reset()
                    _point(out, regime.name, policy, n, sc, server.url, sim_sets, say, progress)
            finally:
                server.stop()
    return collect(out, regimes, policies, grid)


def _point(
    out: Path,
    regime: str,
    policy: str,
    n: int,
    sc: Scenario,
    server: str | Server,
    sim_sets: list[str],
    say: Callable[[str], None],
    progress: Callable[[str, float, float], None] | None,
) -> None:
    """One point: the swarm of ``n`` devices against ``server``, stored, then simulated."""
    scn = sc.with_devices(n)
    label = f"{regime} / {policy} / N={n}"
    tick = None if progress is None else (lambda t, end: progress(label, t, end))
    real = run_swarm(scn, server, reset=False, progress=tick)
    folder = point_folder(out, regime, policy, n)
    store_real(folder, scn, real)
    _report(say, label, store_sim(folder, scn, sim_sets))


def _real_json(folder: Path) -> None:
    """A point stored before ``real.json`` existed keeps its real side in ``done.json``."""
    done = folder / DONE
    if not (folder / "real.json").is_file() and done.is_file():
        doc = json.loads(done.read_text())
        keep = ("real", "server", "clock_offset_s", "real_wall_s")
        _write_json(folder / "real.json", {k: doc[k] for k in keep if k in doc})


def _report(say: Callable[[str], None], label: str, done: Mapping[str, Any]) -> None:
    m_r, m_s = done["real"], done["sim"]
    say(
        f"{label}: violation real {m_r['violation_rate']:.2f} sim {m_s['violation_rate']:.2f}; "
        f"goodput real {m_r['goodput_tps']:.2f} sim {m_s['goodput_tps']:.2f} tok/s; "
        f"verify p50 real {m_r['verify_p50_ms']:.0f} sim {m_s['verify_p50_ms']:.0f} ms"
    )


def collect(out: Path, regimes: list[Regime], policies: list[str], grid: list[int]) -> pd.DataFrame:
    """The stored points as a long table: regime, policy, N, metric, real, sim, error, rel_error."""
    rows = []
    for regime in regimes:
        for policy in policies:
            for n in grid:
                f = point_folder(out, regime.name, policy, n) / DONE
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
    return pd.DataFrame(
        rows, columns=["regime", "policy", "devices", "metric", "real", "sim", "error", "rel_error"]
    )


def replays(out: Path) -> pd.DataFrame:
    """Every stored point's replay comparison (``wispsim replay`` of its real log), one table with
    the point's regime, policy and N in front."""
    frames = []
    for f in sorted(out.glob("points/*/*/n*/replay_comparison.csv")):
        t = pd.read_csv(f)
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
    return pd.DataFrame(rows, columns=["regime", "policy", "capacity_real", "capacity_sim", "error"])
