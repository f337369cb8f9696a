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

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from wispsim.config import Scenario
from wispsim.config.limits import MAX_DEVICES
from wispsim.errors import ConfigError
from wispsim.model.admission import make_admission
from wispsim.model.fleet import device_specs, fleet_size
from wispsim.model.latency import make_latency
from wispsim.model.memory import KVMemory, block_size, check_memory, kv_capacity
from wispsim.model.profiles import load_profile
from wispsim.model.schedulers import SCHEDULERS, GpuState
from wispsim.model.speculation import resolve as resolve_speculation
from wispsim.sim.arrivals import Arrivals, Closed, RequestTrace, load_request_trace, make_arrivals
from wispsim.sim.centralized import CentralizedServer
from wispsim.sim.context import RunContext
from wispsim.sim.device import Device
from wispsim.sim.records import MEMORY_ROWS, SimResult
from wispsim.sim.router import ROUTERS, CentralRouter
from wispsim.sim.verifier import Verifier

SERVER_STREAM = 1_000_000_007  # spawn key of the server's noise stream (apart from device keys)


def device_classes(n: int, classes: tuple[float, ...]) -> list[float]:
    """Device i belongs to classes[i % len(classes)]."""
    return [classes[i % len(classes)] for i in range(n)]


def _server_rng(seed: int, replica: int) -> np.random.Generator:
    key = (SERVER_STREAM,) if replica == 0 else (SERVER_STREAM, replica)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _check_requests_fit(scenario: Scenario, capacity_tokens: int) -> RequestTrace:
    """Every request of a request trace must fit the KV cache and, cold, one verification batch:
    prompt + output + one round's drafts and bonus token."""
    assert scenario.arrivals.trace is not None
    req = load_request_trace(scenario.arrivals.trace)
    extra = scenario.drafting.largest + 1
    need = req.prompts + req.outputs + extra
    i = int(np.argmax(need))
    srv = scenario.server
    for limit, what in (
        (capacity_tokens, f"the KV cache ({capacity_tokens:,} tokens)"),
        (srv.max_batch_tokens if srv.mode == "speculative" else None, "server.max_batch_tokens"),
    ):
        if limit is not None and need[i] > limit:
            raise ConfigError(
                req.source,
                "prompt_tokens",
                f"row {i + 1}: {int(req.prompts[i]):,} + {int(req.outputs[i]):,} tokens (prompt + output) "
                f"do not fit {what}; allowed: prompt + output <= {limit - extra:,}",
            )
    return req


def simulate(
    scenario: Scenario,
    devices: int | None = None,
    seed: int | None = None,
    drive: Callable[[RunContext], int] | None = None,
    env: simpy.Environment | None = None,
    remote: Callable[[RunContext], None] | None = None,
    memory_rows: int = MEMORY_ROWS,
) -> SimResult:
    """Run one simulation of ``scenario`` with ``devices`` devices (default: devices.count).

    ``drive`` replaces the arrival process and the devices: it is called with the run context
    (servers built, ``ctx.server`` / ``ctx.central`` ready) once before the run, starts its own
    SimPy processes (:mod:`wispsim.study.replay.drive` drives recorded devices this way) and
    returns how many devices it started.

    ``env`` and ``remote`` run the same devices against a real server (:mod:`wispsim.serve`):
    ``env`` is the clock (a SimPy environment on the wall clock), and ``remote`` sets
    ``ctx.server`` / ``ctx.central`` to clients of the real server instead of simulated ones.

    ``memory_rows``: records a table keeps in memory before it spills to a temporary Parquet file
    (:mod:`wispsim.sim.records`); the records, and every summary of them, are the same either way.
    """
    wall0 = time.perf_counter()
    n = devices if devices is not None else scenario.devices.count
    if not 1 <= n <= MAX_DEVICES:
        raise ConfigError("--devices", "devices", f"must be in [1, {MAX_DEVICES:,}], got {n:,}")
    seed = scenario.seed if seed is None else seed
    srv = scenario.server
    names = srv.replica_profiles or (srv.profile,) * srv.replicas
    profiles = [load_profile(name).with_form(srv.estimator_form) for name in names]
    profile = profiles[0]
    env = simpy.Environment() if env is None else env
    ctx = RunContext(env, scenario, seed, profile, memory_rows)
    capacities = []
    for prof in profiles:
        cap = kv_capacity(srv, prof)
        check_memory(scenario, cap, prof)
        capacities.append(cap)
    capacity_tokens = capacities[0]
    sizes = [block_size(srv.block_size, prof) for prof in profiles]  # per replica: its engine's
    outputs = None  # (mean, max) output tokens, where a request trace sets them
    if scenario.arrivals.process == "requests" and scenario.arrivals.trace:
        req = _check_requests_fit(scenario, min(c // b * b for c, b in zip(capacities, sizes, strict=True)))
        outputs = (float(req.outputs.mean()), float(req.outputs.max()))
        if scenario.workload.drain_limit_s is None:  # the longest request at the slowest class
            slos = [g.slo for g in scenario.devices.groups] or list(scenario.devices.classes)
            ctx.drain_s = max(ctx.drain_s, float(req.outputs.max()) / min(slos))
    total_blocks = capacity_tokens // sizes[0]
    centralized = srv.mode == "centralized"
    routed = srv.replicas > 1
    if remote is not None:
        remote(ctx)
    elif centralized:
        specs = [resolve_speculation(srv, prof) for prof in profiles]
        ctx.speculation = specs[0]
        servers = [
            CentralizedServer(
                env,
                cap // bs,
                bs,
                srv.max_batch_requests,
                srv.prefill_chunk_tokens,
                make_latency(prof, srv, _server_rng(seed, r)),
                ctx.batches,
                ctx.batch_ids,
                replica=r,
                spec=spec,
            )
            for r, (prof, cap, bs, spec) in enumerate(zip(profiles, capacities, sizes, specs, strict=True))
        ]
        ctx.central = CentralRouter(servers, srv.router) if routed else servers[0]
    else:
        verifiers = []
        for r, (prof, cap, bs) in enumerate(zip(profiles, capacities, sizes, strict=True)):
            blocks = cap // bs
            gpu = GpuState(
                prof.estimator,
                blocks,
                bs,
                srv.max_batch_requests,
                srv.max_batch_tokens,
                srv.delta_ms / 1000.0,
            )
            memory = KVMemory(blocks, bs, srv.prefix_cache, srv.eviction, srv.prefix_reuse)
            scheduler = SCHEDULERS.get(srv.scheduler, field="server.scheduler")()
            latency = make_latency(prof, srv, _server_rng(seed, r))
            verifiers.append(
                Verifier(
                    env,
                    r,
                    gpu,
                    scheduler,
                    memory,
                    latency,
                    ctx.batches,
                    ctx.batch_ids,
                    track_work=routed,
                    admission=make_admission(scenario, blocks, bs, outputs),
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
    if centralized and remote is None:
        info["preemptions"] = ctx.central.preemptions
    return SimResult(
        scenario=scenario,
        seed=seed,
        devices=n if scenario.arrivals.process == "closed" and drive is None else ctx.devices_started,
        round_records=ctx.rounds.close(),
        batches=ctx.batches.close().frame(),
        responses=ctx.responses.close().frame().sort_values("response", kind="stable").reset_index(drop=True),
        window=ctx.window,
        sim_end=env.now,
        wall_s=time.perf_counter() - wall0,
        kv_blocks=total_blocks,
        info=info,
        block_size=sizes[0],
    )
