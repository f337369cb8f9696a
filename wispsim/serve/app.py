"""``wispsim serve``: the verification (or centralized) server as an HTTP service (FastAPI, uvicorn).

Speculative mode (``wisp``, ``fcfs``, ``sled``, ``wisp-fixed``):

- ``POST /sessions`` ``{"prompt": [ids]}`` -> ``{"session": id}`` (128 random bits: whoever holds
  the id can use the session, nobody else can name it)
- ``POST /sessions/{id}/rounds`` ``{"draft": [ids], "accepted": L, "commit": n, "budget_s": s,
  "n_hat": x}`` -> the verdict and what the server did: ``queue_s``, ``verify_s``, ``batch``,
  ``batch_size``, ``t_arrival`` / ``t_dispatch`` / ``t_done`` (server clock), ``l_new`` /
  ``l_cached`` (as vLLM served them) and ``l_new_plan`` / ``l_cached_plan`` (the scheduler's view)
- ``DELETE /sessions/{id}``

Centralized mode: ``POST /generate`` ``{"prompt": [ids], "output_tokens": n}`` streams one JSON
line per engine step that gave the response tokens (``{"t": server time, "tokens": so far}``).

Both: ``GET /health`` (mode, policy, engine facts, the server's clock, its load and limits),
``GET /metrics`` (the load in Prometheus' text format, as vLLM's ``/metrics``), ``GET /log`` (the
batch log: one row per batch or engine step, and for verification one per batch member; a ring of
the newest rows) and ``POST /reset`` (forget sessions and log and empty the engine's prefix cache;
only while idle). ``/log`` and ``/reset`` need the admin token (``Authorization: Bearer TOKEN``).
A bad request is answered with its status and a one-line ``detail``; a 503 says when to retry
(``Retry-After``). What the server promises and its limits: docs/serve.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import signal
import time
from contextlib import asynccontextmanager
from typing import Any

from starlette.requests import Request  # module level: the routes' annotations name it

from wispsim.config import Scenario
from wispsim.model.memory import kv_capacity
from wispsim.model.profiles import load_profile
from wispsim.serve.backend import ModelSource, VLLMBackend, build_engine
from wispsim.serve.bodies import GenerateBody, OpenBody, RoundBody, validation_line
from wispsim.serve.limits import Limits
from wispsim.serve.rounds import ServeError
from wispsim.serve.verify import VerifyServer
from wispsim.sim.servers import request_outputs, verifier_parts

# bodies larger than this are parsed in a worker thread, so a big one does not hold up the event
# loop (and every other client's round); a round's body is a few hundred bytes, parsed in place
PARSE_IN_THREAD = 16 * 1024


def make_app(sc: Scenario, backend: Any, facts: dict[str, Any], limits: Limits | None = None) -> Any:
    """The FastAPI app serving ``sc``'s policy on ``backend`` (a :class:`VLLMBackend`, or a fake
    with the same methods in tests); ``facts`` are the engine's (block size, KV capacity, vocab,
    longest sequence); ``limits`` its bounds (:class:`~wispsim.serve.limits.Limits`). The admin
    token that ``/reset`` and ``/log`` need is ``app.state.admin_token``."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from pydantic import ValidationError

    from wispsim.serve.metrics import prometheus_text

    srv = sc.server
    centralized = srv.mode == "centralized"
    vocab, max_len = int(facts["vocab"]), int(facts["max_len"])
    limits = limits or Limits()
    admin_token = limits.token()
    state: dict[str, Any] = {}
    stop = getattr(backend, "stop", None)

    def make_verifier() -> VerifyServer:
        profile = load_profile(srv.profile).with_form(srv.estimator_form)
        bs = int(facts["block_size"])
        cap = int(facts["kv_capacity_tokens"] or kv_capacity(srv, profile))
        plan = profile if srv.planning_profile is None else load_profile(srv.planning_profile)
        # the scheduler plans with the planning profile (``profile`` where none), as in simulate
        parts = verifier_parts(sc, plan.with_form(srv.estimator_form).estimator, cap, bs, request_outputs(sc))
        # (a paused resident session holds one of vLLM's request slots: verifier_parts caps them)
        resident = backend.resident_sessions() if srv.verifier.kind == "resident" else None
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
            k_max=sc.drafting.largest,
            limits=limits,
            stop=stop,
        )

    @asynccontextmanager
    async def lifespan(app: Any):  # type: ignore[no-untyped-def]
        if centralized:
            state["server"] = backend.central(vocab, max_len, limits)
        else:
            state["server"] = v = make_verifier()
            v.start()
        try:
            yield
        finally:
            if stop is not None:
                stop.set()  # a batch on the engine ends between two steps
            server = state["server"]
            if centralized:
                server.stop()
            else:
                await server.stop()
                server.close()

    app = FastAPI(title="wispsim serve", lifespan=lifespan)
    app.state.admin_token = admin_token
    # the running verification server, for the gRPC service beside this app (None until started)
    app.state.verifier = lambda: None if centralized else state.get("server")

    def answer(status: int, detail: str, retry_after: float | None = None) -> JSONResponse:
        headers = {"Retry-After": f"{max(1, round(retry_after))}"} if retry_after is not None else None
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)

    @app.exception_handler(ServeError)
    async def serve_error(request: Request, e: ServeError) -> JSONResponse:
        return answer(e.status, str(e), e.retry_after)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, e: RequestValidationError) -> JSONResponse:
        return answer(422, validation_line(request.url.path, e.errors()))

    def mode_is(want: str) -> Any:
        if ("centralized" if centralized else "speculative") != want:
            raise ServeError(
                404, f"this server runs {sc.policy} ({srv.mode}); that endpoint is for {want} serving"
            )
        return state["server"]

    def admin(request: Request) -> None:
        """``/reset`` and ``/log`` answer only the holder of the admin token (a bearer token)."""
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(value.strip(), admin_token):
            raise ServeError(
                401, f"{request.url.path}: needs the server's admin token (Authorization: Bearer TOKEN)"
            )

    async def body_of(request: Request, model: Any) -> Any:
        """The request's JSON body as ``model``: its size checked before and while it is read
        (413 past ``limits.max_body_bytes``), a large one parsed off the event loop."""
        cap = limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            raise ServeError(413, f"{request.url.path}: body over {cap:,} bytes (--max-body-bytes)")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise ServeError(413, f"{request.url.path}: body over {cap:,} bytes (--max-body-bytes)")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            if len(raw) > PARSE_IN_THREAD:
                return await asyncio.to_thread(model.model_validate_json, raw)
            return model.model_validate_json(raw)
        except ValidationError as e:
            raise ServeError(422, validation_line(request.url.path, e.errors())) from None

    def load() -> dict[str, Any]:
        usage = getattr(backend, "kv_usage", None)
        return {**state["server"].load(), "kv_cache_usage_perc": usage() if usage is not None else None}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        now = load()
        stalled = now.get("batch_running_s", 0.0) > STALLED_S
        return {
            "status": "stalled" if stalled else "ready",
            "mode": srv.mode,
            "policy": sc.policy,
            "clock": time.monotonic(),
            **facts,
            "load": now,
            "limits": {k: v for k, v in dataclasses.asdict(limits).items() if k != "admin_token"},
        }

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text, kind = prometheus_text(load(), srv.mode, sc.policy)
        return PlainTextResponse(text, media_type=kind)

    @app.get("/log")
    async def get_log(request: Request) -> dict[str, Any]:
        admin(request)
        return dict(state["server"].log.document())

    @app.post("/reset")
    async def reset(request: Request) -> dict[str, Any]:
        admin(request)
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
    async def open_session(request: Request) -> dict[str, Any]:
        v = mode_is("speculative")
        body = await body_of(request, OpenBody)
        return {"session": v.open_session(body.prompt)}

    @app.post("/sessions/{sid}/rounds")
    async def verify(sid: str, request: Request) -> dict[str, Any]:
        v = mode_is("speculative")
        body = await body_of(request, RoundBody)
        return await v.verify(sid, body.draft, body.accepted, body.commit, body.budget_s, body.n_hat)

    @app.delete("/sessions/{sid}")
    async def close_session(sid: str) -> dict[str, Any]:
        mode_is("speculative").close_session(sid)
        return {"status": "closed"}

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        central = mode_is("centralized")
        body = await body_of(request, GenerateBody)
        rid, q = central.submit(body.prompt, body.output_tokens)

        async def stream():  # type: ignore[no-untyped-def]
            finished = False
            try:
                while True:
                    item = await q.get()
                    if item is None:
                        finished = True
                        return
                    if isinstance(item, str):  # the engine failed the response
                        yield json.dumps({"error": item}) + "\n"
                        continue
                    yield json.dumps({"t": item[0], "tokens": item[1]}) + "\n"
            finally:
                if not finished:  # the client went away: the engine stops generating it
                    central.abort(rid)

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    return app


STALLED_S = 60.0  # a batch on the engine this long makes /health say "stalled"


KEEP_ALIVE_S = 75  # seconds an idle HTTP connection stays open (uvicorn's default is 5)


def serve(
    sc: Scenario,
    source: ModelSource,
    host: str,
    port: int,
    ready: Any = None,
    limits: Limits | None = None,
    grpc_port: int | None = None,
) -> None:
    """Build the engine, then serve until interrupted: HTTP on ``port`` and, where ``grpc_port``
    is given (0: any free one), the verification service over gRPC beside it
    (:mod:`wispsim.serve.grpc_api`; ``/health`` says its port as ``grpc_port``). ``ready(facts,
    admin_token)`` is called once listening."""
    engine, facts = build_engine(sc, source)
    backend = VLLMBackend(engine)
    limits = limits or Limits()
    app = make_app(sc, backend, facts, limits)
    servers = Servers(app, facts, host, port, limits, grpc_port)

    def interrupted(signum: int, frame: Any) -> None:
        backend.stop.set()  # a batch on the engine ends between two steps
        raise KeyboardInterrupt

    # uvicorn catches SIGTERM/SIGINT, shuts down, then raises the signal again: with this handler
    # that ends in the finally below (the engine closed) instead of a bare exit that would leave
    # vLLM's engine processes running
    signal.signal(signal.SIGTERM, interrupted)
    try:
        asyncio.run(servers.run(ready))
    finally:
        backend.stop.set()
        try:
            engine.close()
        finally:
            _end_children()


class Servers:
    """An app's HTTP server (uvicorn) and, where ``grpc_port`` is given (0: any free one), its
    verification service over gRPC, on one asyncio loop (the verification server's: a round
    received over either is verified there)."""

    def __init__(
        self, app: Any, facts: dict[str, Any], host: str, port: int, limits: Limits, grpc_port: int | None
    ) -> None:
        import uvicorn

        self.app, self.facts, self.host, self.limits, self.grpc_port = app, facts, host, limits, grpc_port
        # keep idle connections longer than the swarm's client does (httpx drops them after 5 s):
        # with uvicorn's own 5 s the two close at the same moment, and a round sent on a connection
        # the server is closing fails with a ReadError (seen under load with the resident verifier)
        config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="on", timeout_keep_alive=KEEP_ALIVE_S
        )
        self.http = uvicorn.Server(config)

    async def run(self, ready: Any = None) -> None:
        """Serve until the HTTP server exits (:meth:`stop`, or a signal); ``ready(facts, admin
        token)`` once both listen (``facts["grpc_port"]``: the gRPC port bound)."""
        rpc = None
        if self.grpc_port is not None:
            import grpc

            from wispsim.serve.grpc_api import add_verifier, server_options

            rpc = grpc.aio.server(options=server_options(self.limits.max_body_bytes))
            add_verifier(rpc, self.app.state.verifier, self.limits.max_body_bytes)
            self.facts["grpc_port"] = rpc.add_insecure_port(f"{self.host}:{self.grpc_port}")
            await rpc.start()
        task = asyncio.create_task(self.http.serve())
        try:
            while not self.http.started and not task.done():
                await asyncio.sleep(0.05)
            if self.http.started and ready is not None:
                ready(self.facts, self.app.state.admin_token)
            await task
        finally:
            if rpc is not None:
                await rpc.stop(grace=1.0)

    def stop(self) -> None:
        self.http.should_exit = True


def _end_children() -> None:
    """Kill what is left of this process's children (vLLM's engine core and workers)."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=10)
