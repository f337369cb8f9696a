"""One server factory: what the devices of a run talk to, built one way for every caller.

Speculative and centralized serving are two server components with one way to submit:
``ctx.server.submit(x)`` takes a verification round (:class:`~wispsim.sim.verifier.Request`) or a
response to generate (:class:`~wispsim.sim.centralized.Generation`) and returns the event of its
verdict. Which of the two a scenario runs is decided once (:func:`~wispsim.sim.serving.serving_of`);
the factory builds that one, and the rest of a run asks the :class:`~wispsim.sim.serving.Serving`
it gets (``ctx.serving``) to pick between the two.

- :func:`verifier_parts` builds what a verification replica plans with (its GPU state and limits,
  KV memory, scheduler, admission control): the simulated :class:`~wispsim.sim.verifier.Verifier`
  and the real server (:mod:`wispsim.serve.app`) both take them from here;
- :class:`SimulatedServers` builds the simulated replicas (one per profile) behind the scenario's
  router where there are several; :func:`~wispsim.sim.simulation.simulate`, replay and the
  studies run through it, and :mod:`wispsim.serve.swarm` hands in its own server side.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from wispsim.config import Scenario
from wispsim.model.admission import make_admission
from wispsim.model.host_cpu import for_server
from wispsim.model.latency import Pricing, make_latency
from wispsim.model.memory import KVMemory, kv_window
from wispsim.model.schedulers import SCHEDULERS, GpuState
from wispsim.model.speculation import resolve as resolve_speculation
from wispsim.model.verifier_kinds import VerifierKind, verifier_kind
from wispsim.sim.arrivals import load_request_trace
from wispsim.sim.centralized import CentralizedServer
from wispsim.sim.front import GenerationFront, RoundFront
from wispsim.sim.generation import PromptCache
from wispsim.sim.router import ROUTERS, CentralRouter
from wispsim.sim.serving import Serving, SpeculativeServing, serving_of
from wispsim.sim.verifier import Verifier, VerifierParts

if TYPE_CHECKING:
    from wispsim.model.cost import CostModel
    from wispsim.sim.context import RunContext
    from wispsim.sim.scenarios import Resolved

SERVER_STREAM = 1_000_000_007  # spawn key of the server's noise stream (apart from device keys)

__all__ = ["Serving", "SimulatedServers", "VerifierParts", "request_outputs", "serving_of", "verifier_parts"]


def request_outputs(scenario: Scenario) -> tuple[float, float] | None:
    """(mean, max) output tokens of a request trace's requests where one sets every response's
    length (admission control sizes reservations by them), else None."""
    arr = scenario.arrivals
    if arr.process != "requests" or not arr.trace:
        return None
    req = load_request_trace(arr.trace)
    return float(req.outputs.mean()), float(req.outputs.max())


def verifier_parts(
    scenario: Scenario,
    planner: CostModel,
    capacity_tokens: int,
    block_size: int,
    outputs: tuple[float, float] | None = None,
    prefill_above: int | None = None,
) -> VerifierParts:
    """The parts of one verification replica of ``capacity_tokens`` KV tokens in blocks of
    ``block_size``, planning with ``planner`` (the planning profile's cost model, else the
    profile's); ``outputs``: :func:`request_outputs`; ``prefill_above``: the engine's attention
    backend's (the pricing cost's; unsaid, the planner's)."""
    srv = scenario.server
    blocks = capacity_tokens // block_size
    gpu = GpuState(
        planner,
        blocks,
        block_size,
        srv.engine.max_num_seqs,
        srv.verifier.max_batch_tokens,
        srv.verifier.delta_ms / 1000.0,
        planner.prefill_above if prefill_above is None else prefill_above,
    )
    # a resident session forwards only its new tokens: block-granular reuse is a re-submitted round's
    reuse = verifier_kind(srv.verifier.kind).reuse(srv.engine.prefix_reuse)
    memory = KVMemory(blocks, block_size, srv.engine.enable_prefix_caching, srv.engine.eviction, reuse)
    scheduler = SCHEDULERS.get(srv.scheduler, field="server.scheduler")()
    return VerifierParts(gpu, memory, scheduler, make_admission(scenario, blocks, block_size, outputs))


def server_rng(seed: int, replica: int) -> np.random.Generator:
    """Replica ``replica``'s random stream (its latency noise)."""
    key = (SERVER_STREAM,) if replica == 0 else (SERVER_STREAM, replica)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


class SimulatedServers:
    """The default server side of a run (:class:`~wispsim.sim.simulation.ServerSide`): one
    simulated replica per profile of the resolved scenario, built by the run's serving component,
    behind the scenario's router where there are several."""

    def build(self, ctx: RunContext, resolved: Resolved) -> None:
        ctx.server = build_servers(ctx, resolved)

    def info(self, ctx: RunContext) -> dict[str, Any]:
        return server_info(ctx)


def build_servers(ctx: RunContext, resolved: Resolved) -> Any:
    """The simulated server of a run: its serving component's replicas (``ctx.serving``), behind
    the scenario's router where there are several. The factory's one switch on the kind of
    serving."""
    serving = ctx.serving
    if isinstance(serving, SpeculativeServing):
        return verifiers(ctx, resolved, serving.kind)
    return centralized_servers(ctx, resolved)


def server_info(ctx: RunContext) -> dict[str, Any]:
    """What the simulated server adds to a run's ``info``: centralized engines' preemptions, and
    where the host CPU is modelled each replica's API-server processes' busy seconds inside the
    measurement window (``api_server_busy_s``, a list per replica)."""
    info: dict[str, Any] = {}
    if not isinstance(ctx.serving, SpeculativeServing):
        info["preemptions"] = ctx.server.preemptions
    if ctx.api_fronts:
        info["api_server_busy_s"] = [f.busy(ctx.recorder.window) for f in ctx.api_fronts]
    if ctx.engines:
        held = [e.held_shares(ctx.recorder.window) for e in ctx.engines]
        info["kv_held_share"] = [h[0] for h in held]
        info["seqs_held_share"] = [h[1] for h in held]
        info["gpu_backlog_s"] = [h[2] for h in held]
    return info


def verifiers(ctx: RunContext, resolved: Resolved, kind: VerifierKind) -> Any:
    """One verification server per replica, with its latency noise (a replica tracks its work for
    the router where there are several), behind its API servers where the host CPU is modelled
    (wispsim.model.host_cpu), behind the scenario's router where there are several; ``kind``: how
    a round reaches the engine (wispsim.model.verifier_kinds)."""
    sc = ctx.scenario
    srv = sc.server
    out: list[Any] = []
    for r, (prof, cap, bs) in enumerate(
        zip(resolved.profiles, resolved.capacities, resolved.block_sizes, strict=True)
    ):
        planner = resolved.planner(r).estimator
        cost = kind.cost(prof.estimator)
        # one object where the scheduler plans with the pricing profile: priced once a batch
        planner = cost if planner is prof.estimator else kind.cost(planner)
        prof = dataclasses.replace(prof, estimator=cost)
        # the scheduler plans with the planning profile; ``prof`` prices the batches
        parts = verifier_parts(sc, planner, cap, bs, ctx.request_outputs, cost.prefill_above)
        host = for_server(srv, prof.host)
        pricing = Pricing(make_latency(prof, srv, server_rng(ctx.seed, r)), host)
        v = Verifier(
            ctx.env,
            r,
            parts,
            pricing,
            ctx.recorder.batches,
            ctx.batch_ids,
            track_work=srv.replicas > 1,
            kind=kind,
        )
        ctx.engines.append(v)
        if host is not None:
            v = RoundFront(ctx.env, v, host, kind, since=ctx.recorder.window[0])
            ctx.api_fronts.append(v)
        out.append(v)
    return ROUTERS.get(srv.router, field="server.router")(out) if srv.replicas > 1 else out[0]


def centralized_servers(ctx: RunContext, resolved: Resolved) -> Any:
    """One centralized engine per replica, each with its own prefix cache, behind its front end and
    API servers where they are modelled, behind the scenario's router where there are several;
    under centralized-sd each drafts for itself (``ctx.speculation``: the first replica's
    drafting, which the devices ask for runs)."""
    srv = ctx.scenario.server
    specs = [resolve_speculation(srv, prof) for prof in resolved.profiles]
    ctx.speculation = specs[0]
    out: list[Any] = []
    for r, (prof, cap, bs, spec) in enumerate(
        zip(resolved.profiles, resolved.capacities, resolved.block_sizes, specs, strict=True)
    ):
        host = for_server(srv, prof.host)
        # the front end's latency before the engine sees a response (server.host.frontend), seconds
        frontend = prof.host.frontend if srv.host.frontend else 0.0
        engine = CentralizedServer(
            ctx.env,
            cap // bs,
            bs,
            srv.engine.max_num_seqs,
            srv.engine.max_num_batched_tokens,
            Pricing(make_latency(prof, srv, server_rng(ctx.seed, r)), host),
            ctx.recorder.batches,
            ctx.batch_ids,
            replica=r,
            spec=spec,
            async_scheduling=srv.engine.async_scheduling,
            prompts=PromptCache(bs, srv.engine.enable_prefix_caching),
            chunk_times=ctx.recorder.chunk_times,
            static=srv.engine.batching == "static",
            chunked=srv.engine.chunked_prefill,
            v0=srv.engine.v0,
            scheduler_steps=srv.engine.num_scheduler_steps,
            stream_steps=srv.engine.multi_step_stream_outputs,
            window=kv_window(srv, prof),
        )
        ctx.engines.append(engine)
        front = host is not None or frontend > 0
        chat = srv.host.endpoint == "chat"
        if front:
            g = GenerationFront(ctx.env, engine, host, frontend, chat, since=ctx.recorder.window[0])
            if g.api is not None:
                ctx.api_fronts.append(g.api)
            out.append(g)
        else:
            out.append(engine)
    return CentralRouter(out, srv.router) if srv.replicas > 1 else out[0]
