"""The scenario schema: one frozen dataclass per section, and the policy presets.

A scenario is YAML on disk and a tree of these dataclasses in memory; each checks its own values
in ``__post_init__``. The loader (:func:`wispsim.sim.scenarios.load_scenario`) merges a file over the
default scenario, builds the tree (:mod:`wispsim.config.parse`), applies the policy preset and
checks the plug-in names. This package knows names, never implementations.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from wispsim.config.dist import Dist, FieldError, require
from wispsim.config.limits import (
    MAX_ARRIVAL_RATE,
    MAX_DEVICES,
    MAX_DRAFT,
    MAX_RESPONSES,
    MAX_SEED,
    MAX_SIM_SECONDS,
    MAX_TOKENS,
)
from wispsim.config.network import NetworkConfig
from wispsim.config.server import ServerConfig
from wispsim.errors import ConfigError

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
        require(
            0 <= self.count <= MAX_DEVICES, "count", f"must be in [0, {MAX_DEVICES:,}], got {self.count:,}"
        )
        require(
            math.isfinite(self.slo) and self.slo > 0,
            "slo",
            f"a token speed must be finite and > 0, got {self.slo}",
        )
        if self.draft_speed is not None:
            require(self.draft_speed.min > 0, "draft_speed.min", "must be > 0 (tokens/s)")


@dataclass(frozen=True, slots=True)
class DevicesConfig:
    """The edge devices: how many, their SLO classes and how fast they draft.

    ``groups`` describes a heterogeneous fleet (devices per class, device type and link type);
    when given it replaces ``count`` and ``classes`` (see :func:`wispsim.model.fleet.device_specs`).
    """

    count: int = 50
    classes: tuple[float, ...] = (2.0, 4.0, 6.0, 8.0)
    draft_speed: Dist = Dist("lognormal", mean=50.0, cv=0.25, min=15.0, max=150.0)
    predictor_latency_ms: float = 0.46
    alpha_ema: float = 0.2
    start_spread_s: float = 2.0
    groups: tuple[DeviceGroup, ...] = ()

    def __post_init__(self) -> None:
        require(
            1 <= self.count <= MAX_DEVICES, "count", f"must be in [1, {MAX_DEVICES:,}], got {self.count:,}"
        )
        require(len(self.classes) >= 1, "classes", "needs at least one class")
        for c in self.classes:
            require(math.isfinite(c) and c > 0, "classes", f"token speeds must be finite and > 0, got {c}")
        require(
            len(set(self.classes)) == len(self.classes),
            "classes",
            f"each class once, got {list(self.classes)}",
        )
        require(self.draft_speed.min > 0, "draft_speed.min", "must be > 0 (tokens/s)")
        if self.groups:
            total = sum(g.count for g in self.groups)
            require(total >= 1, "groups", "needs at least one device")
            require(total <= MAX_DEVICES, "groups", f"hold {total:,} devices; allowed: <= {MAX_DEVICES:,}")
        require(self.predictor_latency_ms >= 0, "predictor_latency_ms", "must be >= 0")
        require(0 < self.alpha_ema <= 1, "alpha_ema", f"must be in (0, 1], got {self.alpha_ema}")
        require(
            0 <= self.start_spread_s <= MAX_SIM_SECONDS,
            "start_spread_s",
            f"must be in [0, {MAX_SIM_SECONDS:g}] s, got {self.start_spread_s:g}",
        )


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    """The rejection predictor a ``predictor`` drafting controller asks after each draft token."""

    name: str = "confidence"
    # decision threshold: predict "accept" when the score >= threshold. null: the predictor's own
    # (0.5 for ``confidence``; the low-false-positive point an ``npz`` file was exported with)
    threshold: float | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        require(
            self.threshold is None or 0 <= self.threshold <= 1,
            "threshold",
            f"must be in [0, 1] or null (the predictor's own), got {self.threshold}",
        )


@dataclass(frozen=True, slots=True)
class DraftingConfig:
    """Who decides how many tokens a device drafts per round (SPEC 2.1)."""

    controller: str = "predictor"
    k: int = 5
    k_max: int = 8
    k_min: int = 1
    predictor: PredictorConfig = PredictorConfig()

    def __post_init__(self) -> None:
        require(1 <= self.k <= MAX_DRAFT, "k", f"must be in [1, {MAX_DRAFT}], got {self.k}")
        require(self.k_min >= 1, "k_min", f"must be >= 1, got {self.k_min}")
        require(self.k_max >= self.k_min, "k_max", f"must be >= k_min ({self.k_min})")

        require(self.k_max <= MAX_DRAFT, "k_max", f"must be <= {MAX_DRAFT}, got {self.k_max}")

    @property
    def largest(self) -> int:
        """The most draft tokens one round can send: k (fixed drafting) or k_max (the predictor);
        the larger of the two, so the checks hold whichever controller runs."""
        return max(self.k, self.k_max)


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
        require(0 < self.mean < 1, "mean", f"must be in (0, 1), got {self.mean}")
        max_sd = math.sqrt(self.mean * (1 - self.mean))
        require(
            0 <= self.spread < max_sd,
            "spread",
            f"must be in [0, {max_sd:.3f}) for mean {self.mean} (a Beta's std), got {self.spread}",
        )
        require(self.feature_noise >= 0, "feature_noise", "must be >= 0")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """What devices ask for and how long the simulation measures (SPEC 2.1)."""

    prompt_tokens: Dist = Dist("lognormal", mean=256.0, cv=0.5, min=16.0, max=2048.0)
    output_tokens: Dist = Dist("lognormal", mean=256.0, cv=0.5, min=16.0, max=1024.0)
    think_time_s: Dist = Dist("constant", value=0.0)
    warmup_s: float = 20.0
    duration_s: float = 120.0
    drain_limit_s: float | None = None  # None: long enough for every on-time response
    # tokens at the start of every prompt that all requests share (a system prompt); with
    # server.engine.enable_prefix_caching a centralized server reads them from its prefix cache
    # once one request has computed them (whole KV blocks, the last prompt token always computed)
    shared_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        require(
            0 <= self.shared_prefix_tokens <= MAX_TOKENS,
            "shared_prefix_tokens",
            f"must be in [0, {MAX_TOKENS:,}] tokens, got {self.shared_prefix_tokens}",
        )
        for name in ("prompt_tokens", "output_tokens"):
            d = getattr(self, name)
            lo = d.support()[0]
            fld = f"{name}.value" if d.dist == "constant" else f"{name}.min"
            require(lo >= 1, fld, f"a response needs >= 1 token, but samples can be {lo:g}")
            hi = d.support()[1]
            fld = f"{name}.value" if d.dist == "constant" else f"{name}.max"
            require(
                hi <= MAX_TOKENS,
                fld,
                f"the longest {name.split('_')[0]} must be a finite number of tokens <= {MAX_TOKENS:,} "
                f"(the KV-cache fit check needs it), got {hi:g}",
            )
        require(self.warmup_s >= 0, "warmup_s", f"must be >= 0, got {self.warmup_s}")
        require(self.duration_s > 0, "duration_s", f"must be > 0, got {self.duration_s}")
        require(self.drain_limit_s is None or self.drain_limit_s >= 0, "drain_limit_s", "must be >= 0")
        horizon = self.warmup_s + self.duration_s + (self.drain_limit_s or 0.0)
        require(
            horizon <= MAX_SIM_SECONDS,
            "duration_s",
            f"warmup_s + duration_s + drain_limit_s is {horizon:.3g} s of simulated time; "
            f"allowed: <= {MAX_SIM_SECONDS:g} s",
        )

    def window(self) -> tuple[float, float]:
        """The measurement window: responses that start in [warmup, warmup + duration) count."""
        return self.warmup_s, self.warmup_s + self.duration_s


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
        require(
            0 < self.rate <= MAX_ARRIVAL_RATE,
            "rate",
            f"must be in (0, {MAX_ARRIVAL_RATE:g}] responses/s, got {self.rate:g}",
        )
        require(
            0 < self.scale <= MAX_DEVICES, "scale", f"must be in (0, {MAX_DEVICES:g}], got {self.scale:g}"
        )


POLICIES: dict[str, dict[str, Any]] = {
    # policy: drafting.controller, server.mode, server.scheduler, server.engine.enable_prefix_caching
    # and server.verifier.kv_policy (docs/policies.md says why each preset has the KV policy it has)
    "wisp": {
        "controller": "predictor",
        "mode": "speculative",
        "scheduler": "wisp",
        "cache": True,
        "kv": "admission",
    },
    "wisp-lru": {
        "controller": "predictor",
        "mode": "speculative",
        "scheduler": "wisp",
        "cache": True,
        "kv": "lru",
    },
    "sled": {"controller": "fixed", "mode": "speculative", "scheduler": "fcfs", "cache": False, "kv": "lru"},
    "centralized": {
        "controller": "none",
        "mode": "centralized",
        "scheduler": "continuous",
        "cache": True,
        "kv": "lru",
    },
    # centralized serving whose GPU drafts for itself (server.speculation: a draft model unless
    # the scenario names another method)
    "centralized-sd": {
        "controller": "none",
        "mode": "centralized",
        "scheduler": "continuous",
        "cache": True,
        "kv": "lru",
        "spec": True,
    },
    "fcfs": {
        "controller": "predictor",
        "mode": "speculative",
        "scheduler": "fcfs",
        "cache": True,
        "kv": "admission",
    },
    "wisp-fixed": {
        "controller": "fixed",
        "mode": "speculative",
        "scheduler": "wisp",
        "cache": True,
        "kv": "admission",
    },
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
    network: NetworkConfig = NetworkConfig()  # noqa: RUF009 (frozen: a shared default is safe)
    server: ServerConfig = ServerConfig()  # noqa: RUF009 (frozen: a shared default is safe)
    workload: WorkloadConfig = WorkloadConfig()
    arrivals: ArrivalsConfig = ArrivalsConfig()

    def __post_init__(self) -> None:
        require(
            self.policy in POLICY_NAMES,
            "policy",
            f"unknown policy {self.policy!r}; allowed: {', '.join(POLICY_NAMES)}",
        )
        require(0 <= self.seed <= MAX_SEED, "seed", f"must be in [0, 2**63 - 1], got {self.seed}")
        require(0 <= self.epsilon < 1, "epsilon", f"must be in [0, 1), got {self.epsilon}")
        if self.arrivals.process == "poisson":
            window = self.workload.warmup_s + self.workload.duration_s
            require(
                self.arrivals.rate * window <= MAX_RESPONSES,
                "arrivals.rate",
                f"{self.arrivals.rate:g} responses/s over {window:g} s starts "
                f"{self.arrivals.rate * window:.3g} responses; allowed: <= {MAX_RESPONSES:.0e}",
            )

    def on_time_s(self) -> float:
        """The longest a response may take and still meet its SLO: the longest output at the
        slowest class."""
        slos = [g.slo for g in self.devices.groups] or list(self.devices.classes)
        return self.workload.output_tokens.support()[1] / min(slos)

    def drain_limit_s(self) -> float:
        """How long after the window the run waits for measured responses still in flight:
        ``workload.drain_limit_s``, or (when it is null) :meth:`on_time_s`, after which every
        response still running has missed its SLO, so censoring it decides nothing wrongly."""
        given = self.workload.drain_limit_s
        return self.on_time_s() if given is None else given

    def replace(self, **changes: Any) -> Scenario:
        return dataclasses.replace(self, **changes)

    def with_policy(self, policy: str, source: str = "scenario") -> Scenario:
        """This scenario under a named policy preset (SPEC 3): sets drafting and server fields.
        An unknown name is a :class:`ConfigError` naming ``source`` and the field ``policy``."""
        if policy == "custom":
            return self.replace(policy=policy)
        if policy not in POLICIES:
            raise ConfigError(
                source, "policy", f"unknown policy {policy!r}; allowed: {', '.join(POLICY_NAMES)}"
            )
        p = POLICIES[policy]
        drafting = dataclasses.replace(self.drafting, controller=p["controller"])
        spec = self.server.speculation
        if not p.get("spec"):
            spec = dataclasses.replace(spec, method="none", draft=None)
        elif spec.method == "none":
            spec = dataclasses.replace(spec, method="draft")
        server = dataclasses.replace(
            self.server,
            mode=p["mode"],
            scheduler=p["scheduler"],
            engine=dataclasses.replace(self.server.engine, enable_prefix_caching=p["cache"]),
            verifier=dataclasses.replace(self.server.verifier, kv_policy=p["kv"]),
            speculation=spec,
        )
        if server.build == "auto":  # the policy's own verifier build (wispsim.config.builds)
            from wispsim.config.builds import policy_build, with_build

            server = with_build(server, policy_build(policy))
        return self.replace(policy=policy, drafting=drafting, server=server)

    def with_devices(
        self, count: int, classes: tuple[float, ...] | None = None, source: str = "scenario"
    ) -> Scenario:
        """N devices; ``classes`` replaces the class list (and drops a fleet's groups).

        A bad count or class is a :class:`ConfigError` naming ``source`` and the field
        (``devices.count``, ``devices.classes``)."""
        try:
            devices = dataclasses.replace(self.devices, count=count)
            if classes is not None and self.devices.groups:
                devices = dataclasses.replace(devices, groups=())
            if classes is not None:
                devices = dataclasses.replace(devices, classes=tuple(float(c) for c in classes))
        except FieldError as e:
            raise ConfigError(source, f"devices.{e.field}", e.problem) from None
        return self.replace(devices=devices)

    def with_replicas(self, replicas: int | None, router: str | None) -> Scenario:
        """``replicas`` identical replicas of the scenario's profile (None: as it is), behind
        ``router`` (None: as it is)."""
        srv = dataclasses.replace(
            self.server,
            replicas=replicas if replicas is not None else self.server.replicas,
            router=router or self.server.router,
            replica_profiles=() if replicas is not None else self.server.replica_profiles,
        )
        return self.replace(server=srv)

    def with_arrivals(self, arrivals: ArrivalsConfig, window_s: float | None = None) -> Scenario:
        """Another arrival process; with ``window_s`` (a trace's span and its tail) the
        measurement window becomes [0, window_s). A request trace sets every response's lengths,
        so an acceptance trace then gives acceptance only."""
        sc = self.replace(arrivals=arrivals)
        if arrivals.process == "requests" and sc.acceptance.model == "trace":
            sc = sc.replace(acceptance=dataclasses.replace(sc.acceptance, lengths="workload"))
        if window_s is not None:
            wl = dataclasses.replace(sc.workload, warmup_s=0.0, duration_s=max(window_s, 1e-9))
            sc = sc.replace(workload=wl)
        return sc

    def to_dict(self, complete: bool = False) -> dict[str, Any]:
        """The scenario as plain data; under ``server.build: auto`` without the three fields the
        policy's build sets (they follow the policy: written, they would read as given), unless
        ``complete`` (what a simulation's key hashes: every field it ran with)."""
        out: dict[str, Any] = _to_plain(self)
        if self.server.build == "auto" and not complete:
            srv = out["server"]
            for group, name in (("verifier", "kind"), ("engine", "prefix_reuse"), ("host", "transport")):
                srv[group].pop(name, None)
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


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
