"""One simulation run: wire the components, run SimPy, return flat records.

:func:`simulate` is the only entry point the rest of the package uses. It builds the server
(speculative verifier or centralized engine), the devices and their processes, runs until every
*measured* response is decided, and returns the round, batch and response records.

Measurement window: responses that start in [warmup, warmup + duration) are measured. Devices keep
generating load after the window closes until every measured response has finished, or has run
past the time at which it could still meet its SLO (then it is a certain violation and is recorded
as censored), or ``drain_limit_s`` has passed. Measuring only responses that *finish* inside a
window would drop the slow ones and bias the violation rate down; this avoids that.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import numpy as np
import pandas as pd
import simpy

from wispsim.acceptance import AcceptanceModel, expected_accept_ratio, make_acceptance
from wispsim.arrivals import Arrivals, Closed, make_arrivals
from wispsim.centralized import CentralizedServer
from wispsim.config import Scenario
from wispsim.controllers import Controller, make_controller
from wispsim.device import Device
from wispsim.errors import ConfigError
from wispsim.fleet import device_specs, fleet_size
from wispsim.latency import make_latency
from wispsim.memory import KVMemory
from wispsim.network import draft_token_bytes
from wispsim.profiles import Profile, load_profile
from wispsim.records import BatchRecord, ResponseRecord, RoundRecord, frame
from wispsim.router import ROUTERS, CentralRouter
from wispsim.schedulers import SCHEDULERS, GpuState
from wispsim.server import Verifier

SERVER_STREAM = 1_000_000_007  # spawn key of the server's noise stream (apart from device keys)


@dataclass
class SimResult:
    """Records of one run, with what produced them."""

    scenario: Scenario
    seed: int
    devices: int
    rounds: pd.DataFrame
    batches: pd.DataFrame
    responses: pd.DataFrame
    window: tuple[float, float]
    sim_end: float
    wall_s: float
    kv_blocks: int
    info: dict[str, Any] = field(default_factory=dict)


class RunContext:
    """State shared by one run's processes: config, shared components and record lists."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, seed: int, profile: Profile) -> None:
        self.env = env
        self.scenario = scenario
        self.seed = seed
        self.profile = profile
        wl = scenario.workload
        self.window = (wl.warmup_s, wl.warmup_s + wl.duration_s)
        self.acceptance: AcceptanceModel = make_acceptance(scenario.acceptance)
        self.controller: Controller = make_controller(scenario.drafting)
        dr = scenario.drafting
        k_nominal = dr.k if dr.controller == "fixed" else dr.k_max
        self.alpha_init = expected_accept_ratio(self.acceptance.nominal_rate(), k_nominal)
        self.alpha_ema = scenario.devices.alpha_ema
        self.header_bytes = scenario.network.header_bytes
        self.draft_token_bytes = draft_token_bytes(scenario.network, profile.model.vocab_size)
        self.stream_pad = dr.k_max + 2
        # records as plain tuples in the field order of RoundRecord, BatchRecord, ResponseRecord
        self.rounds: list[tuple[Any, ...]] = []
        self.batches: list[tuple[Any, ...]] = []
        self.responses: list[tuple[Any, ...]] = []
        self._response_ids = count()
        self.request_ids = count()
        self.batch_ids = count()
        # measured responses not yet decided: id -> (t0, SLO deadline, device, slo, prompt, output)
        self.outstanding: dict[int, tuple[float, float, int, float, int, int]] = {}
        self._measured: set[int] = set()
        self.done = env.event()
        self.server: Any  # a Verifier, or a router in front of several
        self.central: Any  # a CentralizedServer, or a CentralRouter
        self.arrivals: Arrivals
        self.devices_started = 0

    def open_response(self, t0: float, device: int, slo: float, prompt: int, output: int) -> int:
        rid = next(self._response_ids)
        if self.window[0] <= t0 < self.window[1]:
            self._measured.add(rid)
            self.outstanding[rid] = (t0, t0 + output / slo, device, slo, prompt, output)
        return rid

    def is_measured(self, rid: int) -> bool:
        return rid in self._measured

    def close_response(self, rid: int) -> bool:
        """A response finished; False if it had already been recorded as censored."""
        if rid in self._measured:
            return self.outstanding.pop(rid, None) is not None
        return True

    def watchdog(self) -> Generator[Any, Any, None]:
        """Ends the run once every measured response is decided (see the module docstring)."""
        env = self.env
        end = self.window[1]
        yield env.timeout(end)
        limit = end + self.scenario.workload.drain_limit_s
        while True:
            now = env.now
            hard = now >= limit
            for rid, entry in list(self.outstanding.items()):
                if hard or now > entry[1]:
                    self._censor(rid, now)
            if not self.outstanding:
                self.done.succeed()
                return
            yield env.timeout(min(0.5, max(limit - now, 1e-9)))

    def _censor(self, rid: int, now: float) -> None:
        t0, _, dev, slo, prompt, output = self.outstanding.pop(rid)
        self.responses.append(
            (
                dev,
                slo,
                rid,
                t0,
                math.nan,
                prompt,
                output,
                0,
                0,
                output / (now - t0) if now > t0 else math.inf,
                True,
                True,
                True,
            )
        )


def check_memory(
    scenario: Scenario, capacity_tokens: int, profile: Profile, source: str = "scenario"
) -> None:
    """The KV cache must have room, and hold the longest possible response."""
    wl = scenario.workload
    if capacity_tokens <= 0:
        raise ConfigError(
            source,
            "server.gpu_memory_utilization",
            "no memory is left for the KV cache after the weights and the activation reserve",
        )
    longest = wl.prompt_tokens.support()[1] + wl.output_tokens.support()[1] + scenario.drafting.k_max + 1
    if math.isfinite(longest) and longest > capacity_tokens:
        raise ConfigError(
            source,
            "workload.output_tokens",
            f"the longest response ({int(longest)} tokens of prompt + output) does not fit in the "
            f"KV cache ({capacity_tokens} tokens); lower the length limits or raise memory",
        )


def device_classes(n: int, classes: tuple[float, ...]) -> list[float]:
    """Device i belongs to classes[i % len(classes)]."""
    return [classes[i % len(classes)] for i in range(n)]


def _server_rng(seed: int, replica: int) -> np.random.Generator:
    key = (SERVER_STREAM,) if replica == 0 else (SERVER_STREAM, replica)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def simulate(
    scenario: Scenario,
    devices: int | None = None,
    seed: int | None = None,
    drive: Callable[[RunContext], int] | None = None,
) -> SimResult:
    """Run one simulation of ``scenario`` with ``devices`` devices (default: devices.count).

    ``drive`` replaces the arrival process and the devices: it is called with the run context
    (servers built, ``ctx.server`` / ``ctx.central`` ready) once before the run, starts its own
    SimPy processes (``wispsim.replay`` drives recorded devices this way) and returns how many
    devices it started.
    """
    wall0 = time.perf_counter()
    n = devices if devices is not None else scenario.devices.count
    if n < 1:
        raise ConfigError("--devices", "devices", f"must be >= 1, got {n}")
    seed = scenario.seed if seed is None else seed
    srv = scenario.server
    names = srv.replica_profiles or (srv.profile,) * srv.replicas
    profiles = [load_profile(name) for name in names]
    profile = profiles[0]
    env = simpy.Environment()
    ctx = RunContext(env, scenario, seed, profile)
    capacities = []
    for prof in profiles:
        cap = prof.kv_capacity_tokens(srv.gpu_memory_utilization, srv.activation_reserve_gib)
        check_memory(scenario, cap, prof)
        capacities.append(cap)
    capacity_tokens = capacities[0]
    total_blocks = capacity_tokens // srv.block_size
    centralized = srv.mode == "centralized"
    routed = srv.replicas > 1
    if centralized:
        servers = [
            CentralizedServer(
                env,
                cap // srv.block_size,
                srv.block_size,
                srv.max_batch_requests,
                srv.prefill_chunk_tokens,
                make_latency(prof, srv, _server_rng(seed, r)),
                ctx.batches,
                ctx.batch_ids,
                replica=r,
            )
            for r, (prof, cap) in enumerate(zip(profiles, capacities, strict=True))
        ]
        ctx.central = CentralRouter(servers, srv.router) if routed else servers[0]
    else:
        verifiers = []
        for r, (prof, cap) in enumerate(zip(profiles, capacities, strict=True)):
            blocks = cap // srv.block_size
            gpu = GpuState(
                prof.estimator,
                blocks,
                srv.block_size,
                srv.max_batch_requests,
                srv.max_batch_tokens,
                srv.delta_ms / 1000.0,
            )
            memory = KVMemory(blocks, srv.block_size, srv.prefix_cache, srv.eviction)
            scheduler = SCHEDULERS.get(srv.scheduler, field="server.scheduler")()
            latency = make_latency(prof, srv, _server_rng(seed, r))
            verifiers.append(
                Verifier(
                    env, r, gpu, scheduler, memory, latency, ctx.batches, ctx.batch_ids, track_work=routed
                )
            )
        ctx.server = ROUTERS.get(srv.router, field="server.router")(verifiers) if routed else verifiers[0]

    if drive is not None:
        arrivals: Arrivals = Closed(ctx, 0)
        ctx.arrivals = arrivals
        ctx.devices_started = drive(ctx)
    else:
        arrivals = make_arrivals(ctx, n)
        ctx.arrivals = arrivals
        specs = device_specs(scenario, arrivals.n if not arrivals.open else fleet_size(scenario))

        def launch(index: int, once: bool) -> None:
            ctx.devices_started += 1
            d = Device(ctx, index, specs[index % len(specs)], once)
            env.process(d.run_centralized() if centralized else d.run_speculative())

        arrivals.start(launch)
    env.process(ctx.watchdog())
    env.run(until=ctx.done)
    info: dict[str, Any] = {"kv_capacity_tokens": capacity_tokens, "replicas": srv.replicas}
    if arrivals.open or scenario.arrivals.process != "closed":
        info["devices_started"] = ctx.devices_started
    if centralized:
        info["preemptions"] = ctx.central.preemptions
    return SimResult(
        scenario=scenario,
        seed=seed,
        devices=n if scenario.arrivals.process == "closed" and drive is None else ctx.devices_started,
        rounds=frame(ctx.rounds, RoundRecord),
        batches=frame(ctx.batches, BatchRecord),
        responses=frame(ctx.responses, ResponseRecord)
        .sort_values("response", kind="stable")
        .reset_index(drop=True),
        window=ctx.window,
        sim_end=env.now,
        wall_s=time.perf_counter() - wall0,
        kv_blocks=total_blocks,
        info=info,
    )
