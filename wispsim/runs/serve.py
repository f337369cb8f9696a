"""``serve``, ``swarm`` and ``validate``: the real deployment's commands.

Each resolves its scenarios once, before any work (:func:`served_scenario`: one replica, checked).
``serve`` runs the verification server on a real vLLM engine until interrupted; ``swarm`` probes
the server, runs the scenario's devices against it (:func:`wispsim.serve.swarm.run_swarm`) and
writes their records; ``validate`` resolves the served scenario of every regime and policy and its
``--sim-set`` variant, then per point runs the real side (:mod:`wispsim.serve.real_points`) and the
simulated one (:mod:`wispsim.study.validate`), and writes the comparison. Nothing here prints:
notes and progress go to the ``say`` and ``meter`` callbacks the CLI hands in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from wispsim.config import Scenario
from wispsim.errors import ConfigError, WispsimError
from wispsim.results import Results, check_output_file, writing
from wispsim.runs.resolve import Options, check, load, resolve
from wispsim.runs.run import host_notes
from wispsim.sim.scenarios import Resolved
from wispsim.study.validate import (
    DONE,
    Regime,
    SimSide,
    capacities,
    collect,
    copy_real,
    point,
    replays,
    sets_for,
    store_sim,
)

DEFAULT_URL = "http://127.0.0.1:8011"
DTYPES = ("float32", "bfloat16", "float16")

Tick = Callable[[str, float, float], None]  # progress: what, how far (s), of how long (s)
Meter = Callable[[str], AbstractContextManager[Tick]]  # a progress display, entered once work starts
Say = Callable[[str], None]  # a line for the user (notes, a point's figures)


def _no_meter(label: str) -> AbstractContextManager[Tick]:
    return nullcontext(lambda what, now, end: None)


def _silent(line: str) -> None:
    return None


def model_source(model: str | None, arch: str | None, dtype: str, seed: int = 0) -> Any:
    """The engine's weights (``--model`` or ``--arch``, ``--dtype``), checked; a
    :class:`wispsim.serve.backend.ModelSource`."""
    from wispsim.serve.backend import ModelSource

    if (model is None) == (arch is None):
        raise ConfigError("--model/--arch", "", "give exactly one: a model folder or an architecture")
    if dtype not in DTYPES:
        raise ConfigError("--dtype", dtype, f"must be one of {', '.join(DTYPES)}")
    if arch is not None:
        from wispsim.model.archs import available_archs

        if arch not in available_archs() and not Path(arch).is_file():
            raise ConfigError("--arch", arch, f"unknown architecture; known: {', '.join(available_archs())}")
    if model is not None and not Path(model, "config.json").is_file():
        raise ConfigError("--model", model, "no config.json there (a model folder in Hugging Face format)")
    return ModelSource(model=model, arch=arch, dtype=dtype, seed=seed)


def openai_server(url: str | None, model: str | None, vocab: int | None) -> Any:
    """The OpenAI-compatible server of ``--openai-url`` (a
    :class:`wispsim.serve.openai.OpenAIServer`; None without it)."""
    if url is None:
        if model is not None or vocab is not None:
            raise ConfigError("--openai-model/--openai-vocab", "", "only with --openai-url")
        return None
    from wispsim.serve.openai import OpenAIServer

    return OpenAIServer(url, model, vocab)


def served_scenario(
    file: Path | None, sets: list[str] | None, options: Options, source: str | None = None
) -> Resolved:
    """The scenario a real server runs (file, ``sets``, ``options``), resolved once; it must have
    one replica, and clients that call its own protocol (``server.host.endpoint`` is what a
    simulated API server charges: a real one answers as it does). Errors name ``source`` (a
    validation's regime) when given."""
    resolved = resolve(file, sets, options, source=source)
    server = resolved.scenario.server
    for name, value, allowed, why in (
        ("server.replicas", server.replicas, 1, "wispsim serve runs one replica; set 1"),
        ("server.host.endpoint", server.host.endpoint, "completions",
         "wispsim serve answers on its own protocol, not vLLM's chat endpoint; set completions"),
        ("server.engine.batching", server.engine.batching, "continuous",
         "wispsim serve generates on vLLM's continuous batching; static batching is simulated only"),
        ("server.engine.use_v1", not server.engine.v0, True,
         "wispsim serve runs the installed vLLM's V1 engine; V0's scheduling (use_v1: false, "
         "num_scheduler_steps > 1) is simulated only"),
        ("server.engine.enable_chunked_prefill", server.engine.chunked_prefill, True,
         "wispsim serve runs vLLM V1 with chunked prefill; without it is simulated only"),
        ("server.engine.attention_backend", server.engine.attention_backend, None,
         "wispsim serve's engine takes the installed vLLM's own backend (set VLLM_ATTENTION_BACKEND "
         "for it); the setting is simulated only; allowed: null"),
    ):  # fmt: skip
        if value != allowed:
            raise ConfigError(source, name, why) if source is not None else ConfigError(name, str(value), why)
    return resolved


def serve(
    file: Path | None,
    sets: list[str] | None,
    policy: str | None,
    source: Any,
    host: str,
    port: int,
    ready: Callable[[Scenario, dict[str, Any], str], None],
    say: Say = _silent,
    limits: Any = None,
    grpc_port: int | None = None,
) -> None:
    """Serve the scenario's policy on a real vLLM engine (``source``) until interrupted, within
    ``limits`` (:class:`wispsim.serve.limits.Limits`); ``ready(scenario, facts, admin token)``
    once it listens. The verification service is served over gRPC too on ``grpc_port``, or on
    ``port + 1`` where the scenario's devices speak gRPC (``server.host.transport: grpc``, the
    ``wisp-grpc`` build) and no port is given."""
    from wispsim.serve.app import serve as run_server

    sc = served_scenario(file, sets, Options(policy=policy)).scenario
    if grpc_port is not None and sc.server.mode != "speculative":
        raise ConfigError(
            "--grpc-port", str(grpc_port), f"the gRPC service verifies rounds; policy {sc.policy} generates"
        )
    if grpc_port is None and sc.server.host.transport == "grpc" and sc.server.mode == "speculative":
        grpc_port = port + 1
    for note in host_notes(sc.server.profile):  # vLLM runs here: the profile should be this host's
        say(note)
    say(f"starting vLLM for {sc.policy} ({source.describe()}) ...")
    run_server(
        sc,
        source,
        host,
        port,
        lambda facts, token: ready(sc, facts, token),
        limits=limits,
        grpc_port=grpc_port,
    )


@dataclass(frozen=True)
class SwarmRequest:
    """What ``swarm`` takes: the scenario, the server (``url`` or ``openai_url``), N and seed."""

    scenario: Path | None
    sets: list[str] | None
    policy: str | None = None
    url: str | None = None
    openai_url: str | None = None
    openai_model: str | None = None
    openai_vocab: int | None = None
    devices: int | None = None
    seed: int | None = None
    log: Path | None = None
    admin_token: str | None = None  # wispsim serve's, to reset it and read its log


@dataclass
class SwarmOutcome:
    """What ``swarm`` produced: the folder, the scenario, the run and its summary."""

    folder: Path
    scenario: Scenario
    run: Any  # serve.swarm's SwarmRun
    summary: pd.DataFrame
    url: str  # the server the devices talked to


def swarm(req: SwarmRequest, out: Path | None = None, meter: Meter = _no_meter) -> SwarmOutcome:
    """Run the scenario's devices against the real server for its window; write their records,
    the summary and (``req.log``) the replay log."""
    from wispsim.analysis.metrics import summarize
    from wispsim.serve.swarm import WispsimServer, run_swarm

    if req.url is not None and req.openai_url is not None:
        raise ConfigError("--url/--openai-url", "", "give one: wispsim serve's or an OpenAI server's")
    openai = openai_server(req.openai_url, req.openai_model, req.openai_vocab)
    if openai is None and req.admin_token is None:
        raise ConfigError(
            "--admin-token",
            "",
            "wispsim serve's /reset and /log need its admin token (it prints one at start): pass "
            "--admin-token or set WISPSIM_ADMIN_TOKEN",
        )
    url = WispsimServer(req.url or DEFAULT_URL, token=req.admin_token)
    folder = Results.planned(out, "swarm")  # every output checked before any work
    if req.log is not None:
        check_output_file(req.log, "--log", (".parquet", ".csv"))
    resolved = served_scenario(req.scenario, req.sets, Options(req.policy, req.devices, seed=req.seed))
    sc = resolved.scenario
    _probe(sc, openai or url, openai is not None)
    folder.create()
    label = f"{sc.devices.count} devices, {sc.policy}"
    with meter(label) as tick:
        run = run_swarm(resolved, openai or url, progress=lambda now, end: tick(label, now, end))
    summary = summarize(run.result)
    if openai is not None:  # an OpenAI server logs no batches: unknown, not zero
        summary[["gpu_utilization", "mean_batch_size"]] = float("nan")
    with folder.writing():
        folder.text("scenario.yaml", sc.to_yaml())
        run.write_records(folder)
        folder.table("summary.csv", summary)
        if req.log is not None:
            with writing("--log", req.log):
                run.write_log(req.log)
        folder.finish(
            {"seed": sc.seed, "devices": sc.devices.count, "policy": sc.policy, "server": run.facts}
        )
    return SwarmOutcome(folder.path, sc, run, summary, str(run.facts.get("url", (openai or url).url)))


def _probe(sc: Scenario, server: Any, openai: bool) -> dict[str, Any]:
    """The server's facts, checked for ``sc``: reachable and serving this policy; an OpenAI
    server serves centralized policies only, the model there, in the profile's engine layout."""
    from wispsim.serve.swarm import probe

    if not openai:
        return probe(sc, server)
    from wispsim.model.profiles import load_profile
    from wispsim.serve.openai import check_policy

    check_policy(sc)
    facts = probe(sc, server)
    load_profile(sc.server.profile).check_layout(facts.get("engine_in_process"), "--openai-url")
    return facts


@dataclass(frozen=True)
class ValidateRequest:
    """What ``validate`` takes: the scenario, policies, grid and regimes, the real side (an engine
    to start, ``openai_url``, or the stored points of ``real_from``) and the simulated side's
    overrides (``sim_sets``)."""

    scenario: Path | None
    sets: list[str]
    policies: list[str]
    grid: list[int]
    regimes: list[Regime]
    model: str | None = None
    arch: str | None = None
    dtype: str = "float32"
    port: int = 8011
    openai_url: str | None = None
    openai_model: str | None = None
    openai_vocab: int | None = None
    epsilon: float | None = None
    sim_sets: list[str] = field(default_factory=list)
    real_from: Path | None = None


@dataclass
class ValidateOutcome:
    """What ``validate`` produced: the folder, the long comparison table, the capacities."""

    folder: Path
    comparison: pd.DataFrame
    capacity: pd.DataFrame
    epsilon: float


@dataclass(frozen=True)
class RegimePolicy:
    """One regime and policy, resolved once before any work: the scenario the server serves and
    the simulated side (its ``--sim-set`` variant)."""

    regime: str
    policy: str
    served: Resolved
    sim: SimSide

    def at(self, devices: int) -> Resolved:
        """The served scenario with ``devices`` devices (N changes no profile or KV capacity)."""
        return dataclasses.replace(self.served, scenario=self.served.scenario.with_devices(devices))


def validate(
    req: ValidateRequest, out: Path | None = None, say: Say = _silent, meter: Meter = _no_meter
) -> ValidateOutcome:
    """Run every (regime, policy, N) point not stored yet in ``out`` (real side, then simulated);
    write comparison.csv, capacity.csv, replay.csv, validation.png and the manifest."""
    from wispsim.plots import validation_plot

    folder = Results.planned(out, "validate")  # checked before any work
    openai = openai_server(req.openai_url, req.openai_model, req.openai_vocab)
    source = _real_side(req, openai, folder)
    if len({r.name for r in req.regimes}) != len(req.regimes):
        raise ConfigError("--regime", "", "regime names must be unique")
    pairs = [_pair(req, r, p, openai is not None) for r in req.regimes for p in req.policies]
    if source is not None:  # the servers run here: the profile should be this host's
        for profile in dict.fromkeys(p.served.scenario.server.profile for p in pairs):
            for note in host_notes(profile):
                say(note)
    # the epsilon of the scenario as given (a regime's overrides do not change it)
    eps = load(req.scenario, req.sets).epsilon if req.epsilon is None else req.epsilon
    with folder.writing():  # the old manifest goes: the folder is incomplete until the new one
        folder.create()
    with meter("validate") as tick:
        for pair in pairs:
            _points(folder, pair, req, source, openai, say, tick)
    table = collect(folder, req.regimes, req.policies, req.grid)
    cap = capacities(table, eps)
    with folder.writing():
        folder.table("comparison.csv", table)
        folder.table("capacity.csv", cap)
        folder.table("replay.csv", replays(folder))
        if len(table):
            with folder.file("validation.png") as p:
                validation_plot(table, p)
        model = source.describe() if source else openai.url if openai else f"real points of {req.real_from}"
        folder.finish(
            {
                "policies": req.policies,
                "devices": req.grid,
                "regimes": {r.name: list(r.sets) for r in req.regimes},
                "epsilon": eps,
                "model": model,
                "dtype": req.dtype,
                "sim_set": req.sim_sets,
            }
        )
    return ValidateOutcome(folder.path, table, cap, eps)


def _real_side(req: ValidateRequest, openai: Any, folder: Results) -> Any:
    """The engine to start (a ModelSource), or None when the real side is ``--openai-url``'s
    server or the stored points of ``--real-from``; the options checked against each other."""
    if openai is not None:
        if req.real_from is not None or req.model is not None or req.arch is not None:
            raise ConfigError(
                "--openai-url",
                req.openai_url or "",
                "drives a running server: no --arch, --model, --real-from",
            )
        return None
    if req.real_from is not None:
        if not (req.real_from / "points").is_dir():
            raise ConfigError(
                "--real-from", str(req.real_from), "not a wispsim validate folder (no points/ in it)"
            )
        if req.real_from.resolve() == folder.path.resolve():
            raise ConfigError(
                "--real-from",
                str(req.real_from),
                "must differ from --out (results folders are not rewritten)",
            )
        return None
    return model_source(req.model, req.arch, req.dtype)


def _pair(req: ValidateRequest, regime: Regime, policy: str, openai: bool) -> RegimePolicy:
    """The served scenario of ``regime`` and ``policy`` (file, ``--set``, the regime's overrides,
    the policy) and its ``--sim-set`` variant, each resolved once."""
    where = f"--regime {regime.name}"
    served = served_scenario(req.scenario, [*req.sets, *regime.sets], Options(policy=policy), source=where)
    if openai:
        from wispsim.serve.openai import check_policy

        check_policy(served.scenario)
    mine = sets_for(req.sim_sets, policy)
    keys = {item.partition("=")[0].strip() for item in mine}
    if not openai and "server.profile" in keys and "server.planning_profile" not in keys:
        # the real server planned with the served profile: a re-priced simulation plans with it too
        srv = served.scenario.server
        mine.append(f"server.planning_profile={srv.planning_profile or srv.profile}")
    variant = served.scenario
    if mine:
        variant = load(None, mine, base=served.scenario.to_dict(), source="--sim-set")
        check(variant, Options(policy=policy))
    return RegimePolicy(regime.name, policy, served, SimSide(variant, tuple(mine), tuple(req.sim_sets)))


def _points(
    folder: Results, pair: RegimePolicy, req: ValidateRequest, source: Any, openai: Any, say: Say, tick: Tick
) -> None:
    """The points of one regime and policy not stored yet: real side, then simulated, per N."""
    from wispsim.serve.real_points import served
    from wispsim.serve.swarm import probe

    policy = pair.policy
    todo = [n for n in req.grid if not (point(folder, pair.regime, policy, n) / DONE).is_file()]
    if not todo:
        return
    if req.real_from is not None:  # the real side is stored: simulate it again
        for n in todo:
            label, dst = f"{pair.regime} / {policy} / N={n}", point(folder, pair.regime, policy, n)
            if not copy_real(point(Results(req.real_from), pair.regime, policy, n).path, dst):
                say(f"{label}: no real point in {req.real_from}; skipped")
                continue
            _report(say, label, store_sim(dst, pair.sim, n))
        return
    if openai is not None:  # a running server: checked, and the simulated side with it
        pair.sim.at(None, probe(pair.served.scenario, openai))
        for n in todo:
            _point(folder, pair, n, openai, say, tick)
        return
    if source is None:
        raise WispsimError("validate: give --arch or --model to run the real side (or --real-from)")
    say(f"{pair.regime} / {policy}: starting wispsim serve ...")
    with served(folder, pair.regime, pair.served.scenario, source, req.port) as server:
        for n in todo:
            server.reset()
            _point(folder, pair, n, server.target(), say, tick)


def _point(folder: Results, pair: RegimePolicy, n: int, server: Any, say: Say, tick: Tick) -> None:
    """One point: the swarm of ``n`` devices against ``server``, stored, then simulated."""
    from wispsim.serve.real_points import real_point

    policy = pair.policy
    label, dst = f"{pair.regime} / {policy} / N={n}", point(folder, pair.regime, policy, n)
    real_point(dst, pair.at(n), server, lambda now, end: tick(label, now, end))
    _report(say, label, store_sim(dst, pair.sim, n))


def _report(say: Say, label: str, done: Mapping[str, Any]) -> None:
    m_r, m_s = done["real"], done["sim"]
    say(
        f"{label}: violation real {m_r['violation_rate']:.2f} sim {m_s['violation_rate']:.2f}; "
        f"goodput real {m_r['goodput_tps']:.2f} sim {m_s['goodput_tps']:.2f} tok/s; "
        f"verify p50 real {m_r['verify_p50_ms']:.0f} sim {m_s['verify_p50_ms']:.0f} ms"
    )
