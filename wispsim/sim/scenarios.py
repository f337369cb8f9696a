"""Loading a scenario for a run: parse it, apply its policy preset, check every name it uses.

This sits above the model's registries, so it is where plug-in names (schedulers, controllers,
acceptance and latency models, predictors, routers, arrival processes), profiles, traces and the
KV fit are checked; :mod:`wispsim.config` only parses and validates values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wispsim.config import Dist, Scenario
from wispsim.config.builds import apply_build
from wispsim.config.limits import MAX_SIM_SECONDS
from wispsim.config.parse import build, deep_merge, default_scenario_dict, read_yaml
from wispsim.config.presets import check_preset
from wispsim.config.server import upgrade_server
from wispsim.errors import ConfigError, WispsimError
from wispsim.model.acceptance import ACCEPTANCE, find_trace
from wispsim.model.attention import with_attention_backend
from wispsim.model.drafting import CONTROLLERS
from wispsim.model.estimator import FORMS
from wispsim.model.latency import LATENCY
from wispsim.model.memory import block_size, check_memory, kv_capacity
from wispsim.model.predictor import PREDICTORS, find_predictor
from wispsim.model.profiles import Profile, load_profile
from wispsim.model.schedulers import SCHEDULERS
from wispsim.paths import resolve_named, scenarios_dir
from wispsim.sim.arrivals import ARRIVALS, load_arrival_trace, load_request_trace
from wispsim.sim.engine_checks import check_engine_generation
from wispsim.sim.router import ROUTERS

# centralized serving's scheduler (continuous batching); verification schedulers are ignored there
CENTRAL_SCHEDULER = "continuous"


def available_scenarios() -> list[str]:
    """The shipped scenarios' names (``wispsim scenario list``)."""
    d = scenarios_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def find_scenario(path: str | Path) -> Path:
    """A scenario file as given, or a shipped scenario by name (``fleet-2000``); a one-line
    error naming the shipped ones when it is neither."""
    found = resolve_named(str(path), scenarios_dir(), (".yaml", ".yml"))
    if found is not None:
        return found
    p = Path(path)
    if p.exists():  # a folder, say: read_yaml says what is wrong with it
        return p
    known = ", ".join(available_scenarios()) or "none"
    raise ConfigError(
        str(path), "", f"file not found, and no shipped scenario of that name; shipped: {known}"
    )


def load_scenario(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    base: Mapping[str, Any] | None = None,
    source: str | None = None,
    consistency: bool = True,
) -> Scenario:
    """Load a scenario file (merged over the default scenario) and apply its policy preset.

    ``base`` is a scenario mapping merged over the default before the file (a replay log's
    resolved scenario); ``overrides`` is a nested mapping merged last (the CLI uses it for
    ``--set a.b=value``). Errors name ``source`` (default: the file, else "default scenario"),
    or ``--set`` when the field at fault was set there.

    The verifier's build (``server.build``, :mod:`wispsim.config.builds`) sets how rounds reach
    the engine, how its prefix cache reuses them and how devices talk to it; an explicit field
    that disagrees with a named build is an error.

    A field the policy preset sets (``drafting.controller``, ``server.mode``, ``server.scheduler``,
    ``server.engine.enable_prefix_caching``, ``server.verifier.kv_policy``) given explicitly in the
    file or with ``--set`` must agree with the preset; to choose them one by one, use ``policy: custom``.

    ``consistency=False`` leaves the checks that load profiles and traces
    (:func:`check_consistency`) to the caller, who runs them once after changing the scenario
    further (:func:`wispsim.runs.resolve.resolve`).
    """
    data = default_scenario_dict()
    label = "default scenario"
    if base:
        data = deep_merge(data, upgrade(base, source or "scenario"))
    written: dict[str, Any] = {}
    if path is not None:
        path = find_scenario(path)
        label = str(path)
        written = upgrade(read_yaml(Path(path)), label)
        data = deep_merge(data, written)
    if overrides:
        overrides = upgrade(overrides, "--set")
        data = deep_merge(data, overrides)
    source = label if source is None else source
    set_paths = dotted_fields(overrides or {})
    try:
        scenario: Scenario = build(Scenario, data, source)
        if scenario.policy != "custom":
            check_preset(scenario, written, overrides or {}, source)
            scenario = scenario.with_policy(scenario.policy, source)
        layers = ((overrides or {}, "--set"), (written, source), (base or {}, source))
        scenario = apply_build(scenario, layers)
        check_references(scenario, source, consistency)
    except ConfigError as e:
        raise relabel(e, dict.fromkeys(set_paths, "--set")) from None
    return scenario


def upgrade(layer: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A scenario mapping with its server section in today's names
    (:func:`wispsim.config.server.upgrade_server`): files written with the earlier flat names
    keep loading, and ``--set`` takes either name."""
    out = dict(layer)
    if "server" in out:
        out["server"] = upgrade_server(out["server"], source)
    return out


def relabel(error: ConfigError, owners: Mapping[str, str]) -> ConfigError:
    """``error`` blamed on whoever set its field: ``owners`` maps a dotted field (or a section)
    to a source such as ``--set`` or ``--classes``; an unrelated error is returned unchanged."""
    fld = error.field
    for key, owner in owners.items():
        if fld == key or fld.startswith((key + ".", key + "[")) or (key.startswith(fld + ".") and fld):
            return ConfigError(owner, fld, error.problem)
    return error


def dotted_fields(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The dotted fields a nested mapping of overrides sets (``--set``): a leaf, a whole list or
    distribution, or a section replaced whole."""
    out: list[str] = []
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v and "dist" not in v and k != "links":  # replaced whole
            out += dotted_fields(v, key)
        else:
            out.append(key)
    return out


def check_references(scenario: Scenario, source: str, consistency: bool = True) -> None:
    """Check the names a scenario refers to (plug-ins, profile, trace), naming ``source``, then
    (with ``consistency``) that its values fit together (:func:`check_consistency`)."""
    sv = scenario.server
    ACCEPTANCE.get(scenario.acceptance.model, source, "acceptance.model")
    CONTROLLERS.get(scenario.drafting.controller, source, "drafting.controller")
    PREDICTORS.get(scenario.drafting.predictor.name, source, "drafting.predictor.name")
    LATENCY.get(sv.latency_model, source, "server.latency_model")
    if sv.estimator_form is not None:
        FORMS.get(sv.estimator_form, source, "server.estimator_form")
    if sv.mode == "speculative":
        SCHEDULERS.get(sv.scheduler, source, "server.scheduler")
    elif sv.scheduler != CENTRAL_SCHEDULER and sv.scheduler not in SCHEDULERS:
        known = ", ".join([CENTRAL_SCHEDULER, *SCHEDULERS])
        raise ConfigError(source, "server.scheduler", f"unknown scheduler {sv.scheduler!r}; known: {known}")
    ARRIVALS.get(scenario.arrivals.process, source, "arrivals.process")
    ROUTERS.get(sv.router, source, "server.router")
    for i, g in enumerate(scenario.devices.groups):
        if g.link is not None and g.link not in scenario.network.link_types:
            known = ", ".join(sorted(scenario.network.link_types))
            raise ConfigError(
                source, f"devices.groups[{i}].link", f"unknown link type {g.link!r}; known: {known}"
            )
    try:
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
    if consistency:
        check_consistency(scenario, source)


def _profiles(scenario: Scenario, source: str) -> list[Profile]:
    sv = scenario.server
    names = [("server.profile", sv.profile)]
    if sv.replica_profiles:
        names = [(f"server.replica_profiles[{i}]", n) for i, n in enumerate(sv.replica_profiles)]
    backend = sv.engine.attention_backend  # the engine's: it prices the batches, not the planner
    return [
        with_attention_backend(_load(name, fld, scenario, source), backend, source) for fld, name in names
    ]


def _load(name: str, fld: str, scenario: Scenario, source: str) -> Profile:
    """Profile ``name`` (scenario field ``fld``) with the scenario's estimator form applied."""
    try:
        profile = load_profile(name)
    except ConfigError as e:
        if e.source != "scenario":  # the profile file itself is bad: it names itself
            raise
        raise ConfigError(source, fld, e.problem) from None
    return profile.with_form(scenario.server.estimator_form, source)


@dataclass(frozen=True)
class Resolved:
    """A checked scenario and what its checks computed, carried to the run so that nothing is
    loaded or checked twice: per replica, its profile (estimator form applied), KV capacity in
    tokens and KV block size."""

    scenario: Scenario
    profiles: tuple[Profile, ...]
    capacities: tuple[int, ...]
    block_sizes: tuple[int, ...]
    # per replica, the profile the scheduler plans with (``server.planning_profile``, else its own)
    planning: tuple[Profile, ...] = ()

    def planner(self, replica: int) -> Profile:
        """The profile replica ``replica``'s scheduler plans with."""
        return self.planning[replica] if self.planning else self.profiles[replica]


def resolve_server(scenario: Scenario, source: str = "scenario") -> Resolved:
    """Each replica's profile, KV capacity (checked to hold the longest response) and block size."""
    distinct = _profiles(scenario, source)  # replica_profiles, or the one profile of every replica
    capacities = []
    for profile in distinct:
        cap = kv_capacity(scenario.server, profile)
        check_memory(scenario, cap, profile, source)
        capacities.append(cap)
    copies = 1 if scenario.server.replica_profiles else scenario.server.replicas
    profiles = tuple(distinct) * copies
    sizes = tuple(block_size(scenario.server.engine.block_size, p) for p in profiles)
    plan = scenario.server.planning_profile
    planning = (_load(plan, "server.planning_profile", scenario, source),) * len(profiles) if plan else ()
    resolved = Resolved(scenario, profiles, tuple(capacities) * copies, sizes, planning)
    _check_requests_fit(resolved)
    return resolved


def _check_requests_fit(resolved: Resolved) -> None:
    """Under a request trace, every request must fit the KV cache of every replica and, cold, one
    verification batch: prompt + output + one round's drafts and bonus token."""
    sc = resolved.scenario
    if sc.arrivals.process != "requests" or not sc.arrivals.trace:
        return
    req = load_request_trace(sc.arrivals.trace)
    capacity = min(c // b * b for c, b in zip(resolved.capacities, resolved.block_sizes, strict=True))
    extra = sc.drafting.largest + 1
    need = req.prompts + req.outputs + extra
    i = int(np.argmax(need))
    srv = sc.server
    for limit, what in (
        (capacity, f"the KV cache ({capacity:,} tokens)"),
        (
            srv.verifier.max_batch_tokens if srv.mode == "speculative" else None,
            "server.verifier.max_batch_tokens",
        ),
    ):
        if limit is not None and need[i] > limit:
            raise ConfigError(
                req.source,
                "prompt_tokens",
                f"row {i + 1}: {int(req.prompts[i]):,} + {int(req.outputs[i]):,} tokens (prompt + output) "
                f"do not fit {what}; allowed: prompt + output <= {limit - extra:,}",
            )


def check(scenario: Scenario) -> Resolved:
    """A scenario resolved, once: its one consistency check (profiles, memory, lengths,
    reachability), what :func:`wispsim.sim.simulation.simulate` takes (``wispsim.check``)."""
    return check_consistency(scenario, "scenario")


def check_consistency(scenario: Scenario, source: str = "scenario") -> Resolved:
    """What a run would trip over, caught before it starts: the KV cache holds the longest
    response in whole blocks, one batch can hold the longest single verification, the drain
    limit leaves every on-time response time to finish, an arrival trace stays within the limits,
    and every SLO class is reachable by the devices that hold it. Errors name ``source``.
    Returns the scenario with the profiles and capacities the checks computed."""
    sv, wl, dr = scenario.server, scenario.workload, scenario.drafting
    if (
        sv.mode == "speculative"
        and sv.verifier.kind == "resident"
        and not (sv.engine.enable_prefix_caching and sv.verifier.kv_policy == "admission")
    ):
        raise ConfigError(  # a preset may set either, so this is checked on the whole scenario
            source,
            "server.verifier.kind",
            "resident keeps each session's KV pinned until its response ends: it needs "
            "engine.enable_prefix_caching: true and verifier.kv_policy: admission (got "
            f"{str(sv.engine.enable_prefix_caching).lower()} and {sv.verifier.kv_policy}); allowed with "
            "this policy: resubmit",
        )
    if sv.mode == "speculative" and sv.engine.batching != "continuous":
        raise ConfigError(
            source,
            "server.engine.batching",
            f"{sv.engine.batching} batching is centralized serving's (policy centralized or centralized-sd); "
            f"a verifier batches rounds by its scheduler; allowed with policy {scenario.policy}: continuous",
        )
    _check_speculation(scenario, source)
    check_engine_generation(scenario, source)
    resolved = resolve_server(scenario, source)
    profiles = list(resolved.profiles)
    longest_prompt = wl.prompt_tokens.support()[1]
    longest_output = wl.output_tokens.support()[1]
    longest = int(longest_prompt + longest_output) + dr.largest + 1
    if sv.mode == "speculative" and sv.verifier.max_batch_tokens < longest:
        raise ConfigError(
            source,
            "server.verifier.max_batch_tokens",
            f"{sv.verifier.max_batch_tokens:,} is less than the longest single verification ({longest:,} "
            "tokens: a cold round forwards prompt + output + max(k, k_max) + 1); "
            f"allowed: >= {longest:,}",
        )
    slos = [g.slo for g in scenario.devices.groups] or list(scenario.devices.classes)
    on_time = scenario.on_time_s()
    horizon = wl.warmup_s + wl.duration_s + scenario.drain_limit_s()
    if horizon > MAX_SIM_SECONDS:
        raise ConfigError(
            source,
            "workload.duration_s",
            f"warmup_s + duration_s + drain ({scenario.drain_limit_s():g} s) is {horizon:.3g} s of "
            f"simulated time; allowed: <= {MAX_SIM_SECONDS:g} s",
        )
    if wl.drain_limit_s is not None and wl.drain_limit_s < on_time:
        raise ConfigError(
            source,
            "workload.drain_limit_s",
            f"{wl.drain_limit_s:g} s is shorter than the longest on-time response "
            f"({longest_output:g} tokens at {min(slos):g} tokens/s = {on_time:g} s), so responses "
            f"still in flight would be counted as violations unseen; allowed: >= {on_time:g}",
        )
    _check_arrivals(scenario, source)
    _check_reachable(scenario, profiles, source)
    return resolved


def _check_speculation(scenario: Scenario, source: str) -> None:
    """Server-side speculation is centralized serving's, and only a draft model or an EAGLE head
    has a draft to name (checked after the options, which may change the policy)."""
    sv = scenario.server
    if sv.speculation.method != "none" and sv.mode != "centralized":
        raise ConfigError(
            source,
            "server.speculation.method",
            f"server-side speculation is centralized serving's (policy centralized-sd); a {sv.mode} "
            "server verifies the devices' drafts; allowed here: none",
        )
    spec = sv.speculation
    for name, given in (("draft", spec.draft), ("draft_profile", spec.draft_profile)):
        if given is not None and spec.method not in ("draft", "eagle"):
            raise ConfigError(
                source,
                f"server.speculation.{name}",
                f"names the draft, which method {spec.method!r} has none of; allowed: null, or method "
                "draft or eagle",
            )


def _check_arrivals(scenario: Scenario, source: str) -> None:
    """An arrival trace exists, and its values times ``scale`` fit its kind and the limits."""
    arr = scenario.arrivals
    if arr.process not in ("trace", "requests"):
        return
    if not arr.trace:
        raise ConfigError(source, "arrivals.trace", f"the {arr.process} arrival process needs a file or name")
    if arr.process == "trace":
        load_arrival_trace(arr.trace, source, kind=arr.kind, scale=arr.scale)
        return
    load_request_trace(arr.trace, source)
    acc = scenario.acceptance
    if acc.model == "trace" and acc.lengths == "trace":
        raise ConfigError(
            source,
            "acceptance.lengths",
            "a request trace sets every response's lengths; the acceptance trace must take them "
            "from the workload: allowed: workload",
        )


def _check_reachable(scenario: Scenario, profiles: list[Profile], source: str) -> None:
    """Every SLO class must be a speed some device could reach at all (an upper bound, so a
    class this rejects could never be met: capacity would be 0 whatever the load)."""
    dev, dr, sv = scenario.devices, scenario.drafting, scenario.server
    # the fastest verification any replica can do: the batch constant, on a lucky (4-sigma) draw
    fastest = min(
        p.estimator.fastest * math.exp(-4 * p.noise_sigma) if sv.noise else p.estimator.fastest
        for p in profiles
    )
    if sv.mode == "centralized":
        step = min(
            p.estimator.alone(1, 0) * (math.exp(-4 * p.noise_sigma) if sv.noise else 1.0) for p in profiles
        )
        per_step = sv.speculation.k + 1 if sv.speculation.method != "none" else 1  # tokens a step may commit
        bound = per_step / step if step > 0 else math.inf
        why = f"one decode step takes >= {step * 1e3:.3g} ms and commits <= {per_step} tokens"
        pairs = [("devices.classes", c, bound, why) for c in dev.classes]
        pairs += [(f"devices.groups[{i}].slo", g.slo, bound, why) for i, g in enumerate(dev.groups)]
    else:
        k_lo = dr.k_min if dr.controller == "predictor" else dr.k
        k_hi = dr.k_max if dr.controller == "predictor" else dr.k

        def reach(draft: Dist) -> tuple[float, str]:
            top = draft.support()[1]
            if not math.isfinite(top):
                return math.inf, ""
            best = max((k + 1) / (k / top + fastest) for k in range(k_lo, k_hi + 1))
            return (
                best,
                f"drafting at <= {top:g} tokens/s, k {k_lo}..{k_hi}, verification >= {fastest * 1e3:.3g} ms",
            )

        pairs = []
        if dev.groups:
            for i, g in enumerate(dev.groups):
                pairs.append((f"devices.groups[{i}].slo", g.slo, *reach(g.draft_speed or dev.draft_speed)))
        else:
            bound, why = reach(dev.draft_speed)
            pairs = [("devices.classes", c, bound, why) for c in dev.classes]
    for fld, slo, bound, why in pairs:
        if slo >= bound:
            raise ConfigError(
                source,
                fld,
                f"{slo:g} tokens/s is faster than any device can reach (at most {bound:.4g} tokens/s: "
                f"{why}); allowed: < {bound:.4g}",
            )
