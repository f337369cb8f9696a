"""``wispsim serve``: the verification (or centralized) server as an HTTP service (FastAPI, uvicorn).

Speculative mode (``wisp``, ``fcfs``, ``sled``, ``wisp-fixed``):

- ``POST /sessions`` ``{"prompt": [ids]}`` -> ``{"session": id}``
- ``POST /sessions/{id}/rounds`` ``{"draft": [ids], "accepted": L, "commit": n, "budget_s": s,
  "n_hat": x}`` -> the verdict and what the server did: ``queue_s``, ``verify_s``, ``batch``,
  ``batch_size``, ``t_arrival`` / ``t_dispatch`` / ``t_done`` (server clock), ``l_new`` /
  ``l_cached`` (as vLLM served them) and ``l_new_plan`` / ``l_cached_plan`` (the scheduler's view)
- ``DELETE /sessions/{id}``

Centralized mode: ``POST /generate`` ``{"prompt": [ids], "output_tokens": n}`` streams one JSON
line per engine step that gave the response tokens (``{"t": server time, "tokens": so far}``).

Both: ``GET /health`` (mode, policy, engine facts, the server's clock), ``GET /log`` (the batch
log: one row per batch or engine step, and for verification one per batch member) and ``POST
/reset`` (forget sessions and log and empty the engine's prefix cache; only while idle). A bad
request is answered with its status and a one-line ``detail``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from wispsim.config import Scenario
from wispsim.errors import WispsimError
from wispsim.host import cpu_facts
from wispsim.model.batch import blocks as blocks_of
from wispsim.model.memory import block_size, kv_capacity
from wispsim.model.profiles import load_profile
from wispsim.serve.central import CentralServer
from wispsim.serve.verify import ServeError, VerifyServer
from wispsim.sim.servers import request_outputs, verifier_parts


class OpenBody(BaseModel):
    """``POST /sessions``: the session's prompt."""

    prompt: list[int] = Field(min_length=1)


class RoundBody(BaseModel):
    """``POST /sessions/{id}/rounds``: the draft, the replayed verdict and what the SLO needs."""

    draft: list[int] = Field(min_length=1, max_length=1024)
    accepted: int = Field(ge=0)
    commit: int = Field(ge=1)
    budget_s: float = Field(allow_inf_nan=False)
    n_hat: float = Field(gt=0, allow_inf_nan=False)


class GenerateBody(BaseModel):
    """``POST /generate``: a whole response for centralized serving."""

    prompt: list[int] = Field(min_length=1)
    output_tokens: int = Field(ge=1)


@dataclass(frozen=True)
class ModelSource:
    """What the engine runs: a model folder, or an architecture with random weights."""

    model: str | None = None
    arch: str | None = None
    dtype: str = "float32"
    seed: int = 0

    def describe(self) -> str:
        return self.model or f"{self.arch} (random weights)"


def longest_sequence(sc: Scenario) -> int:
    """The most tokens one session can hold: longest prompt + output + a round's draft + 1."""
    wl, dr = sc.workload, sc.drafting
    return int(wl.prompt_tokens.support()[1] + wl.output_tokens.support()[1]) + dr.largest + 2


def build_engine(sc: Scenario, source: ModelSource) -> tuple[Any, dict[str, Any]]:
    """Start vLLM for ``sc``'s server: prefix caching as the policy says (off for SLED), the KV
    cache capped at ``server.kv_capacity_tokens`` when the scenario sets it; returns the engine
    and its facts (block size, KV capacity)."""
    from wispsim.engines.base import EngineSpec
    from wispsim.engines.vllm import VLLMEngine
    from wispsim.model.archs import load_arch

    srv = sc.server
    # vLLM's engine core runs in the server's process unless the environment says otherwise: on a
    # small host that is about 2x faster per batch than a separate busy-polling engine process
    # (REPORT.md, KV section), and every policy gets the same layout. Admission control needs it:
    # the server frees ended sessions' blocks in vLLM's block pool (release_prefixes).
    layout = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if srv.mode == "speculative" and srv.kv_policy == "admission" and srv.prefix_cache and layout != "0":
        what = (
            "server.verifier resident keeps sessions"
            if srv.verifier == "resident"
            else "server.kv_policy admission frees ended sessions' blocks"
        )
        raise WispsimError(
            f"VLLM_ENABLE_V1_MULTIPROCESSING={layout}: {what} in vLLM's engine core, which must run in "
            "the server's process; unset it or set 0"
        )
    profile = load_profile(srv.profile)
    profile.check_layout(layout == "0", "wispsim serve")  # its estimates must be this engine's
    bs = block_size(srv.block_size, profile)
    max_len = longest_sequence(sc)
    blocks = None if srv.kv_capacity_tokens is None else blocks_of(srv.kv_capacity_tokens, bs)
    if blocks is not None and blocks * bs < max_len:
        raise WispsimError(
            f"server.kv_capacity_tokens: {srv.kv_capacity_tokens} tokens cannot hold the longest "
            f"session ({max_len} tokens); raise it or shorten the workload"
        )
    spec = EngineSpec(
        model_path=source.model,
        arch_config=load_arch(source.arch).hf if source.arch else None,
        dtype=source.dtype,
        seed=source.seed,
        max_len=max_len,
        max_batch_tokens=max(srv.max_batch_tokens, max_len) * 2,
        max_seqs=srv.max_batch_requests,
        prefix_caching=srv.prefix_cache or srv.mode == "centralized",
        kv_cache_gib=max(1.0, (blocks or 0) * bs * profile.model.kv_bytes_per_token / 2**30),
        kv_blocks=blocks,
    )
    eng = VLLMEngine.build(spec)
    real_bs = eng.block_size or bs
    if real_bs != bs:
        raise WispsimError(
            f"server.block_size: the engine's KV block is {real_bs} tokens, the scenario's {bs}; "
            f"set server.block_size: {real_bs} (or null to take the profile's)"
        )
    facts = {
        "engine": "vllm",
        "device": eng.device,
        "block_size": real_bs,
        "kv_capacity_tokens": eng.kv_capacity_tokens,
        "vocab": eng.vocab,
        "max_len": max_len,
        "prefix_caching": spec.prefix_caching,
        "model": source.describe(),
        "dtype": source.dtype,
        "kv_policy": srv.kv_policy if srv.mode == "speculative" else "engine",
        "engine_in_process": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0",
        "host": cpu_facts(),  # the CPU the real timings come from (wispsim.host)
    }
    return eng, facts


class VLLMBackend:
    """What the app needs of the engine: run a verification batch, empty the prefix cache, and
    (centralized) the engine whose continuous batching generates whole responses."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def run_batch(self, seqs: list[list[int]]) -> tuple[list[int], tuple[int, ...] | None]:
        """One output token per sequence, in one call; the bonus tokens and vLLM's cached counts."""
        from wispsim.engines.vllm import cached_tokens

        outs = self.engine.generate(seqs)
        return [int(o.outputs[0].token_ids[0]) for o in outs], cached_tokens(outs)

    def release_prefixes(self, seqs: list[list[int]]) -> int | None:
        """Ended sessions' blocks are vLLM's first to reuse (None: it cannot, engine elsewhere)."""
        return self.engine.release_prefixes(seqs)

    def resident_sessions(self) -> Any:
        """Sessions kept in the engine (``server.verifier: resident``)."""
        from wispsim.engines.vllm_sessions import ResidentSessions

        return ResidentSessions(self.engine.llm, self.engine.params)

    def reset_cache(self) -> bool:
        """Empty vLLM's prefix cache; False if it refused (requests still hold blocks)."""
        return bool(self.engine.llm.reset_prefix_cache())

    def central(self, vocab: int, max_len: int) -> CentralServer:
        from wispsim.engines.vllm import fixed_length_params, tokens_prompt

        return CentralServer(self.engine.llm.llm_engine, fixed_length_params, tokens_prompt, vocab, max_len)


def make_app(sc: Scenario, backend: Any, facts: dict[str, Any]) -> Any:
    """The FastAPI app serving ``sc``'s policy on ``backend`` (a :class:`VLLMBackend`, or a fake
    with the same methods in tests); ``facts`` are the engine's (block size, KV capacity, vocab,
    longest sequence)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse

    srv = sc.server
    centralized = srv.mode == "centralized"
    vocab, max_len = int(facts["vocab"]), int(facts["max_len"])
    state: dict[str, Any] = {}

    def make_verifier() -> VerifyServer:
        profile = load_profile(srv.profile).with_form(srv.estimator_form)
        bs = int(facts["block_size"])
        cap = int(facts["kv_capacity_tokens"] or kv_capacity(srv, profile))
        plan = profile if srv.planning_profile is None else load_profile(srv.planning_profile)
        # the scheduler plans with the planning profile (``profile`` where none), as in simulate
        parts = verifier_parts(sc, plan.with_form(srv.estimator_form).estimator, cap, bs, request_outputs(sc))
        resident = backend.resident_sessions() if srv.verifier == "resident" else None
        # admission control frees ended sessions' blocks; a resident session's request ends with it
        freeing = parts.admission is not None and resident is None
        release = getattr(backend, "release_prefixes", None) if freeing else None
        return VerifyServer(
            parts.gpu,
            parts.scheduler,
            parts.memory,
            backend.run_batch,
            vocab,
            max_len,
            admission=parts.admission,
            release=release,
            resident=resident,
        )

    def make_central() -> CentralServer:
        return backend.central(vocab, max_len)

    @asynccontextmanager
    async def lifespan(app: Any):  # type: ignore[no-untyped-def]
        if centralized:
            state["server"] = make_central()
        else:
            state["server"] = v = make_verifier()
            v.start()
        try:
            yield
        finally:
            server = state["server"]
            if centralized:
                server.stop()
            else:
                await server.stop()

    app = FastAPI(title="wispsim serve", lifespan=lifespan)

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, e: ServeError) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, e: RequestValidationError) -> JSONResponse:
        err = e.errors()[0] if e.errors() else {"loc": ("body",), "msg": "invalid"}
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
        return JSONResponse({"detail": f"{request.url.path}: {where}: {err.get('msg')}"}, status_code=422)

    def mode_is(want: str) -> Any:
        if ("centralized" if centralized else "speculative") != want:
            raise ServeError(
                404, f"this server runs {sc.policy} ({srv.mode}); that endpoint is for {want} serving"
            )
        return state["server"]

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ready", "mode": srv.mode, "policy": sc.policy, "clock": time.monotonic(), **facts}

    @app.get("/log")
    async def get_log() -> dict[str, Any]:
        log = state["server"].log
        return {"batches": log.batches, "members": log.members}

    @app.post("/reset")
    async def reset() -> dict[str, Any]:
        server = state["server"]
        if centralized:  # responses of devices that are gone are aborted
            await asyncio.to_thread(server.reset)
        else:
            if not server.idle():
                raise ServeError(
                    409, "reset: rounds are still being verified; reset once the devices are done"
                )
            server.reset()
        if backend.reset_cache() is False:  # vLLM refuses while requests hold blocks
            raise ServeError(409, "reset: the engine's prefix cache could not be emptied; try again")
        return {"status": "reset"}

    @app.post("/sessions")
    async def open_session(body: OpenBody) -> dict[str, Any]:
        return {"session": mode_is("speculative").open_session(body.prompt)}

    @app.post("/sessions/{sid}/rounds")
    async def verify(sid: int, body: RoundBody) -> dict[str, Any]:
        v = mode_is("speculative")
        return await v.verify(sid, body.draft, body.accepted, body.commit, body.budget_s, body.n_hat)

    @app.delete("/sessions/{sid}")
    async def close_session(sid: int) -> dict[str, Any]:
        mode_is("speculative").close_session(sid)
        return {"status": "closed"}

    @app.post("/generate")
    async def generate(body: GenerateBody) -> Any:
        q = mode_is("centralized").submit(body.prompt, body.output_tokens)

        async def stream():  # type: ignore[no-untyped-def]
            while True:
                item = await q.get()
                if item is None:
                    return
                yield json.dumps({"t": item[0], "tokens": item[1]}) + "\n"

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    return app


KEEP_ALIVE_S = 75  # seconds an idle HTTP connection stays open (uvicorn's default is 5)


def serve(sc: Scenario, source: ModelSource, host: str, port: int, ready: Any = None) -> None:
    """Build the engine, then serve until interrupted. ``ready(facts)`` is called once listening."""
    import uvicorn

    engine, facts = build_engine(sc, source)
    app = make_app(sc, VLLMBackend(engine), facts)
    # keep idle connections longer than the swarm's client does (httpx drops them after 5 s): with
    # uvicorn's own 5 s the two close at the same moment, and a round sent on a connection the
    # server is closing fails with a ReadError (seen under load with the resident verifier)
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on", timeout_keep_alive=KEEP_ALIVE_S
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started and ready is not None:
            ready(facts)
        await task

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # uvicorn catches SIGTERM/SIGINT, shuts down, then raises the signal again: with this handler
    # that ends in the finally below (the engine closed) instead of a bare exit that would leave
    # vLLM's engine processes running
    signal.signal(signal.SIGTERM, interrupted)
    try:
        asyncio.run(main())
    finally:
        try:
            engine.close()
        finally:
            _end_children()


def _end_children() -> None:
    """Kill what is left of this process's children (vLLM's engine core and workers)."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=10)
