"""Loading a scenario for a run: parse it, apply its policy preset, check every name it uses.

This sits above the model's registries, so it is where plug-in names (schedulers, controllers,
acceptance and latency models, predictors, routers, arrival processes), profiles, traces and the
KV fit are checked; :mod:`wispsim.config` only parses and validates values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from wispsim.config import Scenario
from wispsim.config.parse import build, deep_merge, default_scenario_dict, read_yaml
from wispsim.errors import ConfigError, WispsimError
from wispsim.model.acceptance import ACCEPTANCE, find_trace
from wispsim.model.drafting import CONTROLLERS
from wispsim.model.latency import LATENCY
from wispsim.model.memory import check_memory
from wispsim.model.predictor import PREDICTORS, find_predictor
from wispsim.model.profiles import load_profile
from wispsim.model.schedulers import SCHEDULERS
from wispsim.sim.arrivals import ARRIVALS, load_arrival_trace
from wispsim.sim.router import ROUTERS


def load_scenario(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    base: Mapping[str, Any] | None = None,
    source: str | None = None,
) -> Scenario:
    """Load a scenario file (merged over the default scenario) and apply its policy preset.

    ``base`` is a scenario mapping merged over the default before the file (a replay log's
    resolved scenario); ``overrides`` is a nested mapping merged last (the CLI uses it for
    ``--set a.b=value``). Errors name ``source`` (default: the file, else "default scenario").
    """
    data = default_scenario_dict()
    label = "default scenario"
    if base:
        data = deep_merge(data, base)
    if path is not None:
        label = str(path)
        data = deep_merge(data, read_yaml(Path(path)))
    if overrides:
        data = deep_merge(data, overrides)
    source = label if source is None else source
    scenario: Scenario = build(Scenario, data, source)
    if scenario.policy != "custom":
        scenario = scenario.with_policy(scenario.policy, source)
    check_references(scenario, source)
    return scenario


def check_references(scenario: Scenario, source: str) -> None:
    """Check the names a scenario refers to (plug-ins, profile, trace), naming ``source``."""
    sv = scenario.server
    ACCEPTANCE.get(scenario.acceptance.model, source, "acceptance.model")
    CONTROLLERS.get(scenario.drafting.controller, source, "drafting.controller")
    PREDICTORS.get(scenario.drafting.predictor.name, source, "drafting.predictor.name")
    LATENCY.get(sv.latency_model, source, "server.latency_model")
    if sv.mode == "speculative":
        SCHEDULERS.get(sv.scheduler, source, "server.scheduler")
    ARRIVALS.get(scenario.arrivals.process, source, "arrivals.process")
    ROUTERS.get(sv.router, source, "server.router")
    for i, g in enumerate(scenario.devices.groups):
        if g.link is not None and g.link not in scenario.network.link_types:
            known = ", ".join(sorted(scenario.network.link_types))
            raise ConfigError(
                source, f"devices.groups[{i}].link", f"unknown link type {g.link!r}; known: {known}"
            )
    if scenario.arrivals.process == "trace":
        if not scenario.arrivals.trace:
            raise ConfigError(source, "arrivals.trace", "the trace arrival process needs a CSV file or name")
        load_arrival_trace(scenario.arrivals.trace, source)
    try:
        for name in sv.replica_profiles or (sv.profile,):
            profile = load_profile(name)
            cap = profile.kv_capacity_tokens(sv.gpu_memory_utilization, sv.activation_reserve_gib)
            check_memory(scenario, cap, profile, source)
        uses_predictor = scenario.drafting.controller == "predictor"
        if uses_predictor and scenario.drafting.predictor.name == "npz":
            if not scenario.drafting.predictor.path:
                raise ConfigError(source, "drafting.predictor.path", "the npz predictor needs a path")
            find_predictor(scenario.drafting.predictor.path)
        if scenario.acceptance.model == "trace":
            if not scenario.acceptance.trace:
                raise ConfigError(source, "acceptance.trace", "the trace model needs a trace file or name")
            find_trace(scenario.acceptance.trace)
    except ConfigError as e:
        if e.source != "scenario":  # already names its file (this scenario, or a bad profile)
            raise
        raise ConfigError(source, e.field, e.problem) from None
    except WispsimError as e:
        raise ConfigError(source, "acceptance.trace", str(e).split(": ", 1)[-1]) from None


def apply_arrivals_option(sc: Scenario, text: str | None, tail: float = 300.0) -> Scenario:
    """``--arrivals``: FILE, concurrency:FILE, rate:FILE or poisson:RATE.

    A trace sets the measurement window to the trace's span plus ``tail`` seconds (its last
    value holding), so recovery after the last burst is measured too."""
    if text is None:
        return sc
    kind, _, rest = text.partition(":")
    if kind == "poisson":
        try:
            rate = float(rest)
        except ValueError:
            rate = -1.0
        if not rate > 0:
            raise ConfigError("--arrivals", "", f"poisson:RATE needs a rate > 0 responses/s, got {rest!r}")
        return sc.replace(arrivals=dataclasses.replace(sc.arrivals, process="poisson", rate=rate))
    if kind in ("concurrency", "rate") and rest:
        path = rest
    else:
        kind, path = sc.arrivals.kind, text
    trace = load_arrival_trace(path, "--arrivals")
    arr = dataclasses.replace(sc.arrivals, process="trace", trace=path, kind=kind)  # type: ignore[arg-type]
    if tail < 0:
        raise ConfigError("--tail", "", f"must be >= 0, got {tail}")
    wl = dataclasses.replace(sc.workload, warmup_s=0.0, duration_s=max(trace.end + tail, 1e-9))
    return sc.replace(arrivals=arr, workload=wl)


def apply_server_options(sc: Scenario, replicas: int | None, router: str | None) -> Scenario:
    """``--replicas`` and ``--router``: R identical replicas of the scenario's profile, and a router."""
    if replicas is not None and replicas < 1:
        raise ConfigError("--replicas", "", f"must be >= 1, got {replicas}")
    if router is not None:
        ROUTERS.get(router, "--router", "--router")
    srv = dataclasses.replace(
        sc.server,
        replicas=replicas if replicas is not None else sc.server.replicas,
        router=router or sc.server.router,
        replica_profiles=() if replicas is not None else sc.server.replica_profiles,
    )
    return sc.replace(server=srv)
