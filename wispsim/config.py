"""Typed, validated scenario configuration.

A scenario is YAML on disk and a tree of frozen dataclasses in memory. :func:`load_scenario` is
the one loader: it merges the file over the embedded default scenario, builds the dataclasses
field by field (unknown keys, wrong types and bad values are reported with the file and the dotted
field path), and applies the policy preset. The simulator only ever sees these objects.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import numpy as np
import yaml

from wispsim.errors import ConfigError
from wispsim.resources import default_scenario_path


class FieldError(ValueError):
    """Raised by a dataclass's checks; the loader adds the file and the path prefix."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


def _require(cond: bool, fld: str, problem: str) -> None:
    if not cond:
        raise FieldError(fld, problem)


# --------------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------------

DistKind = Literal["constant", "uniform", "lognormal", "exponential", "normal"]


@dataclass(frozen=True, slots=True)
class Dist:
    """A scalar distribution, clipped to [min, max].

    ``lognormal`` and ``exponential`` are parameterised by their mean (and ``cv``, the coefficient
    of variation, for lognormal) because that is what people know about their workloads.
    """

    dist: DistKind = "constant"
    value: float = 0.0
    mean: float = 0.0
    cv: float = 0.0
    std: float = 0.0
    low: float = 0.0
    high: float = 0.0
    min: float = 0.0
    max: float = math.inf

    def __post_init__(self) -> None:
        _require(self.min <= self.max, "min", f"must be <= max ({self.max}), got {self.min}")
        if self.dist == "constant":
            _require(self.value >= 0, "value", f"must be >= 0, got {self.value}")
        elif self.dist == "uniform":
            _require(0 <= self.low <= self.high, "low", "needs 0 <= low <= high")
        elif self.dist in ("lognormal", "exponential"):
            _require(self.mean > 0, "mean", f"must be > 0, got {self.mean}")
            _require(self.cv >= 0, "cv", f"must be >= 0, got {self.cv}")
        elif self.dist == "normal":
            _require(self.std >= 0, "std", f"must be >= 0, got {self.std}")

    def sample(self, rng: np.random.Generator, size: int | None = None) -> Any:
        d = self.dist
        if d == "constant":
            x = np.full(size, self.value) if size is not None else self.value
        elif d == "uniform":
            x = rng.uniform(self.low, self.high, size)
        elif d == "lognormal":
            s2 = math.log1p(self.cv**2)
            x = rng.lognormal(math.log(self.mean) - s2 / 2, math.sqrt(s2), size)
        elif d == "exponential":
            x = rng.exponential(self.mean, size)
        else:
            x = rng.normal(self.mean, self.std, size)
        return np.clip(x, self.min, self.max) if size is not None else min(max(x, self.min), self.max)

    def support(self) -> tuple[float, float]:
        """Smallest and largest values a sample can take."""
        if self.dist == "constant":
            v = min(max(self.value, self.min), self.max)
            return v, v
        if self.dist == "uniform":
            return max(self.low, self.min), min(self.high, self.max)
        if self.dist in ("lognormal", "exponential"):
            return max(self.min, 0.0), self.max
        return self.min if self.min > -math.inf else -math.inf, self.max

    def nominal(self) -> float:
        """The distribution's centre, used where one representative number is needed."""
        c = {
            "constant": self.value,
            "uniform": (self.low + self.high) / 2,
        }.get(self.dist, self.mean)
        return float(min(max(c, self.min), self.max))


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """One part of a heterogeneous fleet: ``count`` devices of one SLO class, optionally with
    their own draft-speed distribution (a device type) and access link type."""

    count: int = 1
    slo: float = 4.0
    name: str = ""
    draft_speed: Dist | None = None
    link: str | None = None

    def __post_init__(self) -> None:
        _require(self.count >= 0, "count", f"must be >= 0, got {self.count}")
        _require(self.slo > 0, "slo", f"a token speed must be > 0, got {self.slo}")
        if self.draft_speed is not None:
            _require(self.draft_speed.min > 0, "draft_speed.min", "must be > 0 (tokens/s)")


@dataclass(frozen=True, slots=True)
class DevicesConfig:
    """The edge devices: how many, their SLO classes and how fast they draft.

    ``groups`` describes a heterogeneous fleet (devices per class, device type and link type);
    when given it replaces ``count`` and ``classes`` (see :func:`wispsim.fleet.device_specs`).
    """

    count: int = 50
    classes: tuple[float, ...] = (2.0, 4.0, 6.0, 8.0)
    draft_speed: Dist = Dist("lognormal", mean=50.0, cv=0.25, min=15.0, max=150.0)
    predictor_latency_ms: float = 0.46
    alpha_ema: float = 0.2
    start_spread_s: float = 2.0
    groups: tuple[DeviceGroup, ...] = ()

    def __post_init__(self) -> None:
        _require(self.count >= 1, "count", f"must be >= 1, got {self.count}")
        _require(len(self.classes) >= 1, "classes", "needs at least one class")
        for c in self.classes:
            _require(c > 0, "classes", f"token speeds must be > 0, got {c}")
        _require(self.draft_speed.min > 0, "draft_speed.min", "must be > 0 (tokens/s)")
        if self.groups:
            _require(sum(g.count for g in self.groups) >= 1, "groups", "needs at least one device")
        _require(self.predictor_latency_ms >= 0, "predictor_latency_ms", "must be >= 0")
        _require(0 < self.alpha_ema <= 1, "alpha_ema", f"must be in (0, 1], got {self.alpha_ema}")
        _require(self.start_spread_s >= 0, "start_spread_s", "must be >= 0")


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    """The rejection predictor a ``predictor`` drafting controller asks after each draft token."""

    name: str = "confidence"
    threshold: float = 0.5
    path: str | None = None

    def __post_init__(self) -> None:
        _require(0 <= self.threshold <= 1, "threshold", f"must be in [0, 1], got {self.threshold}")


@dataclass(frozen=True, slots=True)
class DraftingConfig:
    """Who decides how many tokens a device drafts per round (SPEC 2.1)."""

    controller: str = "predictor"
    k: int = 5
    k_max: int = 8
    k_min: int = 1
    predictor: PredictorConfig = PredictorConfig()

    def __post_init__(self) -> None:
        _require(self.k >= 1, "k", f"must be >= 1, got {self.k}")
        _require(self.k_min >= 1, "k_min", f"must be >= 1, got {self.k_min}")
        _require(self.k_max >= self.k_min, "k_max", f"must be >= k_min ({self.k_min})")


@dataclass(frozen=True, slots=True)
class AcceptanceConfig:
    """How drafted tokens are accepted (SPEC 1 and 5)."""

    model: str = "latent"
    mean: float = 0.72
    spread: float = 0.3
    feature_noise: float = 0.5
    trace: str | None = None
    accept_from: Literal["beta", "flag", "greedy"] = "beta"
    lengths: Literal["trace", "workload"] = "trace"

    def __post_init__(self) -> None:
        _require(0 < self.mean < 1, "mean", f"must be in (0, 1), got {self.mean}")
        max_sd = math.sqrt(self.mean * (1 - self.mean))
        _require(
            0 <= self.spread < max_sd,
            "spread",
            f"must be in [0, {max_sd:.3f}) for mean {self.mean} (a Beta's std), got {self.spread}",
        )
        _require(self.feature_noise >= 0, "feature_noise", "must be >= 0")


@dataclass(frozen=True, slots=True)
class LinkType:
    """One kind of access link: one-way latency, bandwidths and a log-normal jitter factor."""

    latency_ms: float = 10.0
    up_mbps: float = 20.0
    down_mbps: float = 50.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        _require(self.latency_ms >= 0, "latency_ms", f"must be >= 0, got {self.latency_ms}")
        _require(self.up_mbps > 0, "up_mbps", f"must be > 0, got {self.up_mbps}")
        _require(self.down_mbps > 0, "down_mbps", f"must be > 0, got {self.down_mbps}")
        _require(self.jitter >= 0, "jitter", f"must be >= 0, got {self.jitter}")


DEFAULT_LINK_TYPES: dict[str, LinkType] = {
    "wifi": LinkType(latency_ms=10.0, up_mbps=20.0, down_mbps=50.0, jitter=0.15),
    "5g": LinkType(latency_ms=15.0, up_mbps=50.0, down_mbps=200.0, jitter=0.2),
    "4g": LinkType(latency_ms=40.0, up_mbps=10.0, down_mbps=30.0, jitter=0.3),
    "ethernet": LinkType(latency_ms=1.0, up_mbps=1000.0, down_mbps=1000.0, jitter=0.05),
}


@dataclass(frozen=True, slots=True)
class NetworkConfig:
    """Links between devices and the server, and what a round's uplink carries (SPEC 2.2)."""

    payload: Literal["ids", "topk", "full"] = "ids"
    topk: int = 20
    header_bytes: int = 64
    links: dict[str, float] = field(default_factory=lambda: {"wifi": 1.0})
    link_types: dict[str, LinkType] = field(default_factory=lambda: dict(DEFAULT_LINK_TYPES))

    def __post_init__(self) -> None:
        _require(self.topk >= 1, "topk", f"must be >= 1, got {self.topk}")
        _require(self.header_bytes >= 0, "header_bytes", "must be >= 0")
        _require(len(self.links) > 0, "links", "needs at least one link type")
        for name, w in self.links.items():
            known = ", ".join(sorted(self.link_types))
            _require(name in self.link_types, f"links.{name}", f"unknown link type; known: {known}")
            _require(w >= 0, f"links.{name}", f"share must be >= 0, got {w}")
        _require(sum(self.links.values()) > 0, "links", "shares must not all be 0")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The verification server (SPEC 2.3 and 3)."""

    profile: str = "a100-qwen3-32b"
    mode: Literal["speculative", "centralized"] = "speculative"
    scheduler: str = "wisp"
    prefix_cache: bool = True
    eviction: Literal["session", "block"] = "session"
    latency_model: str = "linear"
    noise: bool = True
    gpu_memory_utilization: float = 0.9
    activation_reserve_gib: float = 1.5
    block_size: int = 16
    max_batch_requests: int = 256
    max_batch_tokens: int = 16384
    delta_ms: float = 5.0
    prefill_chunk_tokens: int = 2048
    replicas: int = 1
    router: str = "affinity"
    replica_profiles: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _require(self.replicas >= 1, "replicas", f"must be >= 1, got {self.replicas}")
        _require(
            not self.replica_profiles or len(self.replica_profiles) == self.replicas,
            "replica_profiles",
            f"gives {len(self.replica_profiles)} profiles for {self.replicas} replicas; "
            "give one per replica, or none to use server.profile for all",
        )
        _require(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization",
            f"must be in (0, 1], got {self.gpu_memory_utilization}",
        )
        _require(self.activation_reserve_gib >= 0, "activation_reserve_gib", "must be >= 0")
        _require(self.block_size >= 1, "block_size", f"must be >= 1, got {self.block_size}")
        _require(self.max_batch_requests >= 1, "max_batch_requests", "must be >= 1")
        _require(self.max_batch_tokens >= 1, "max_batch_tokens", "must be >= 1")
        _require(self.delta_ms >= 0, "delta_ms", f"must be >= 0, got {self.delta_ms}")
        _require(self.prefill_chunk_tokens >= 1, "prefill_chunk_tokens", "must be >= 1")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What devices ask for and how long the simulation measures (SPEC 2.1)."""

    prompt_tokens: Dist = Dist("lognormal", mean=256.0, cv=0.5, min=16.0, max=2048.0)
    output_tokens: Dist = Dist("lognormal", mean=256.0, cv=0.5, min=16.0, max=1024.0)
    think_time_s: Dist = Dist("constant", value=0.0)
    warmup_s: float = 20.0
    duration_s: float = 120.0
    drain_limit_s: float = 900.0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens"):
            d = getattr(self, name)
            lo = d.support()[0]
            fld = f"{name}.value" if d.dist == "constant" else f"{name}.min"
            _require(lo >= 1, fld, f"a response needs >= 1 token, but samples can be {lo:g}")
        _require(self.warmup_s >= 0, "warmup_s", f"must be >= 0, got {self.warmup_s}")
        _require(self.duration_s > 0, "duration_s", f"must be > 0, got {self.duration_s}")
        _require(self.drain_limit_s >= 0, "drain_limit_s", "must be >= 0")


@dataclass(frozen=True, slots=True)
class ArrivalsConfig:
    """How responses arrive (SPEC 5 and 7); ``process`` names an arrival process.

    ``closed``: N devices loop forever (the default). ``poisson``: open sessions; new responses
    arrive at ``rate`` per second, each on a fresh device. ``trace``: a CSV of ``time_s,value``
    (step function); ``kind: concurrency`` keeps ``value`` devices active, ``kind: rate`` is a
    time-varying Poisson rate of new responses. ``scale`` multiplies the trace's values.
    """

    process: str = "closed"
    rate: float = 1.0
    trace: str | None = None
    kind: Literal["concurrency", "rate"] = "concurrency"
    scale: float = 1.0

    def __post_init__(self) -> None:
        _require(self.rate > 0, "rate", f"must be > 0 responses/s, got {self.rate}")
        _require(self.scale > 0, "scale", f"must be > 0, got {self.scale}")


POLICIES: dict[str, dict[str, Any]] = {
    # policy: (drafting.controller, server.mode, server.scheduler, server.prefix_cache)
    "wisp": {"controller": "predictor", "mode": "speculative", "scheduler": "wisp", "cache": True},
    "sled": {"controller": "fixed", "mode": "speculative", "scheduler": "fcfs", "cache": False},
    "centralized": {
        "controller": "none",
        "mode": "centralized",
        "scheduler": "continuous",
        "cache": True,
    },
    "fcfs": {"controller": "predictor", "mode": "speculative", "scheduler": "fcfs", "cache": True},
    "wisp-fixed": {"controller": "fixed", "mode": "speculative", "scheduler": "wisp", "cache": True},
}
POLICY_NAMES = (*POLICIES, "custom")


@dataclass(frozen=True, slots=True)
class Scenario:
    """A whole scenario: everything one simulation run needs besides N and the seed."""

    name: str = "default"
    policy: str = "wisp"
    seed: int = 0
    epsilon: float = 0.05
    devices: DevicesConfig = DevicesConfig()
    drafting: DraftingConfig = DraftingConfig()
    acceptance: AcceptanceConfig = AcceptanceConfig()
    network: NetworkConfig = NetworkConfig()
    server: ServerConfig = ServerConfig()
    workload: WorkloadConfig = WorkloadConfig()
    arrivals: ArrivalsConfig = ArrivalsConfig()

    def __post_init__(self) -> None:
        _require(
            self.policy in POLICY_NAMES,
            "policy",
            f"unknown policy {self.policy!r}; allowed: {', '.join(POLICY_NAMES)}",
        )
        _require(self.seed >= 0, "seed", f"must be >= 0, got {self.seed}")
        _require(0 <= self.epsilon < 1, "epsilon", f"must be in [0, 1), got {self.epsilon}")

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)

    def with_policy(self, policy: str, source: str = "--policy") -> Scenario:
        """This scenario under a named policy preset (SPEC 3): sets drafting and server fields."""
        if policy == "custom":
            return self.replace(policy=policy)
        if policy not in POLICIES:
            raise ConfigError(
                source,
                "" if source.startswith("--") else "policy",
                f"unknown policy {policy!r}; allowed: {', '.join(POLICY_NAMES)}",
            )
        p = POLICIES[policy]
        drafting = dataclasses.replace(self.drafting, controller=p["controller"])
        server = dataclasses.replace(
            self.server, mode=p["mode"], scheduler=p["scheduler"], prefix_cache=p["cache"]
        )
        return self.replace(policy=policy, drafting=drafting, server=server)

    def with_devices(self, count: int, classes: tuple[float, ...] | None = None) -> Scenario:
        """N devices; ``classes`` replaces the class list (and drops a fleet's groups)."""
        devices = dataclasses.replace(self.devices, count=count)
        if classes is not None and self.devices.groups:
            devices = dataclasses.replace(devices, groups=())
        if classes is not None:
            devices = dataclasses.replace(devices, classes=tuple(float(c) for c in classes))
        return self.replace(devices=devices)

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --------------------------------------------------------------------------------------------
# Loader: YAML -> dataclasses
# --------------------------------------------------------------------------------------------


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [_to_plain(v) for v in obj]
    if isinstance(obj, float) and math.isinf(obj):
        return ".inf"
    return obj


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, path: str, source: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path, source)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(source, path, f"got {value!r}; allowed: {', '.join(map(str, allowed))}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(source, path, f"must be a mapping, got {type(value).__name__}")
        return build(tp, value, source, path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            value = [value]
        (inner, *_) = get_args(tp)
        return tuple(_coerce(v, inner, f"{path}[{i}]", source) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(source, path, f"must be a mapping, got {type(value).__name__}")
        _, vt = get_args(tp)
        return {str(k): _coerce(v, vt, f"{path}.{k}", source) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, path, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise ConfigError(source, path, f"must be an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, str) and value.strip().lower() in (".inf", "inf"):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ConfigError(source, path, f"must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, path, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {_type_name(tp)} at {path}")  # pragma: no cover


def build(cls: Any, data: Mapping[str, Any], source: str, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``, reporting problems with ``source`` and field path."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise ConfigError(source, path, f"unknown field; allowed: {', '.join(sorted(names))}")
        kwargs[key] = _coerce(value, hints[key], path, source)
    try:
        return cls(**kwargs)
    except FieldError as e:
        path = f"{prefix}.{e.field}" if prefix else e.field
        raise ConfigError(source, path, e.problem) from None


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        # a distribution given with its kind replaces the default whole (else a constant would
        # inherit the default's clipping range); link shares are replaced whole too
        replace = k == "links" or (isinstance(v, Mapping) and "dist" in v)
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) and not replace:
            out[k] = _deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def read_yaml(path: Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(source, "", "file not found") from None
    except OSError as e:
        raise ConfigError(source, "", f"cannot read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source, "", f"malformed YAML at {where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, "", f"must be a YAML mapping, got {type(data).__name__}")
    return data


def default_scenario_dict() -> dict[str, Any]:
    return read_yaml(default_scenario_path())


def load_scenario(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Load a scenario file (merged over the default scenario) and apply its policy preset.

    ``overrides`` is a nested mapping merged last (the CLI uses it for ``--set a.b=value``).
    """
    data = default_scenario_dict()
    source = "default scenario"
    if path is not None:
        source = str(path)
        data = _deep_merge(data, read_yaml(Path(path)))
    if overrides:
        data = _deep_merge(data, overrides)
    scenario: Scenario = build(Scenario, data, source)
    if scenario.policy != "custom":
        scenario = scenario.with_policy(scenario.policy, source)
    check_references(scenario, source)
    return scenario


def check_references(scenario: Scenario, source: str) -> None:
    """Check the names a scenario refers to (plug-ins, profile, trace), naming ``source``."""
    from wispsim.acceptance import ACCEPTANCE, find_trace
    from wispsim.controllers import CONTROLLERS
    from wispsim.errors import WispsimError
    from wispsim.latency import LATENCY
    from wispsim.predictor import PREDICTORS
    from wispsim.schedulers import SCHEDULERS

    sv = scenario.server
    ACCEPTANCE.get(scenario.acceptance.model, source, "acceptance.model")
    CONTROLLERS.get(scenario.drafting.controller, source, "drafting.controller")
    PREDICTORS.get(scenario.drafting.predictor.name, source, "drafting.predictor.name")
    LATENCY.get(sv.latency_model, source, "server.latency_model")
    if sv.mode == "speculative":
        SCHEDULERS.get(sv.scheduler, source, "server.scheduler")
    from wispsim.arrivals import ARRIVALS, load_arrival_trace
    from wispsim.router import ROUTERS

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
        from wispsim.profiles import load_profile
        from wispsim.simulation import check_memory

        for name in sv.replica_profiles or (sv.profile,):
            profile = load_profile(name)
            cap = profile.kv_capacity_tokens(sv.gpu_memory_utilization, sv.activation_reserve_gib)
            check_memory(scenario, cap, profile, source)
        uses_predictor = scenario.drafting.controller == "predictor"
        if uses_predictor and scenario.drafting.predictor.name == "npz":
            from wispsim.predictor import find_predictor

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


def parse_set(assignments: list[str]) -> dict[str, Any]:
    """Turn ``["server.delta_ms=3", "workload.duration_s=60"]`` into a nested mapping."""
    out: dict[str, Any] = {}
    for item in assignments:
        if "=" not in item:
            raise ConfigError("--set", item, "expected KEY=VALUE, e.g. server.delta_ms=3")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out
